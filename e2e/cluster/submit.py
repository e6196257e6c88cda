#!/usr/bin/env python3
"""Submits tasks to the asyncd API the way a team's service would: over the API's
Service, authenticated with the pod's projected ServiceAccount token.

  submit.py --url http://asyncd-api:7700 --type T --count N [--delay 0s] [--sleep-ms 0]
            [--token-file /var/run/secrets/asyncd/token] [--key-prefix P] [--rate 0]

Prints one line per accepted task ("submitted ID") and last a JSON summary line
{"submitted": N, "failed": N, "ids": [...]}. Exits 1 when any submit failed.
"""
import argparse
import json
import sys
import time
import urllib.error
import urllib.request


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--type", required=True)
    ap.add_argument("--count", type=int, default=1)
    ap.add_argument("--delay", default="")
    ap.add_argument("--sleep-ms", type=int, default=0)
    ap.add_argument("--token-file", default="/var/run/secrets/asyncd/token")
    ap.add_argument("--key-prefix", default="")
    ap.add_argument("--rate", type=float, default=0, help="tasks per second (0: as fast as possible)")
    a = ap.parse_args()
    token = open(a.token_file).read().strip()
    ids, failed = [], 0
    start = time.monotonic()
    for i in range(a.count):
        payload = {"n": i}
        if a.key_prefix:
            payload["order_id"] = f"{a.key_prefix}-{i}"
        if a.sleep_ms:
            payload["sleep_ms"] = a.sleep_ms
        body = {"type": a.type, "payload": payload}
        if a.delay:
            body["delay"] = a.delay
        req = urllib.request.Request(
            a.url.rstrip("/") + "/v1/tasks", data=json.dumps(body).encode(), method="POST",
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
        for attempt in range(10):
            try:
                with urllib.request.urlopen(req, timeout=10) as r:
                    task_id = json.load(r)["id"]
                    ids.append(task_id)
                    print(f"submitted {task_id}", flush=True)
                    break
            except urllib.error.HTTPError as e:
                # 4xx is an answer: retrying would not change it
                if e.code < 500:
                    print(f"refused {e.code}: {e.read()[:300]!r}", file=sys.stderr, flush=True)
                    failed += 1
                    break
                time.sleep(0.5)
            except (urllib.error.URLError, OSError) as e:
                print(f"retrying after {e}", file=sys.stderr, flush=True)
                time.sleep(0.5)
        else:
            failed += 1
        if a.rate:
            wait = start + (i + 1) / a.rate - time.monotonic()
            if wait > 0:
                time.sleep(wait)
    print(json.dumps({"submitted": len(ids), "failed": failed, "ids": ids}), flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
