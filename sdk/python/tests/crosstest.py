"""The Python half of sdk/test.sh's cross-language check (see
sdk/go/internal/crosstest): serves a Python executor for the Go client's tasks, and
submits tasks for the Go executor.

    python crosstest.py serve --portfile F --secret S --endpoint URL
    python crosstest.py submit --endpoint URL --type cross_go --nonce N
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from typing import Any, List, Optional

import asyncd

KEY_FIELDS = ("nonce", "amount", "text")


def serve(args: argparse.Namespace) -> int:
    client = asyncd.Client(args.endpoint, signing_secret=args.secret or None)

    @client.executor("cross_py")
    def cross_py(payload: Any, ctx: asyncd.TaskContext) -> None:
        want = asyncd.idempotency_key_from(ctx.type, payload, *KEY_FIELDS)
        if ctx.idempotency_key != want:
            raise asyncd.Permanent(f"idempotency key {ctx.idempotency_key!r}, Python derives {want!r}")
        if payload.get("lang") != "go":
            raise asyncd.Permanent(f"payload {payload!r} did not come from the Go client")
        print(f"python executor ran {ctx.id} (attempt {ctx.attempt}) for the go client", flush=True)

    server = client.make_server("127.0.0.1", 0)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    # Written whole then renamed, so a reader polling for it never sees it half-written.
    with open(args.portfile + ".tmp", "w") as f:
        f.write(str(server.server_port))
    os.replace(args.portfile + ".tmp", args.portfile)
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    server.shutdown()
    client.wait(5)
    return 0


def submit(args: argparse.Namespace) -> int:
    client = asyncd.Client(args.endpoint, service_name="crosstest-python")
    payload = {"nonce": args.nonce, "lang": "python", "amount": 12.5, "text": 'Grüße 😀 "q"\n'}
    key = asyncd.idempotency_key_from(args.type, payload, *KEY_FIELDS)
    res = client.submit(args.type, payload, idempotency_key=key)
    deadline = time.monotonic() + args.timeout
    while True:
        st = client.get(res.id)
        if st.state == asyncd.SUCCEEDED:
            print(f"python client: task {res.id} ({args.type}) succeeded")
            return 0
        if st.state in (asyncd.DEAD, asyncd.CANCELLED, asyncd.EXPIRED):
            print(f"crosstest: task {res.id} is {st.state}: {st.last_error}", file=sys.stderr)
            return 1
        if time.monotonic() > deadline:
            print(f"crosstest: task {res.id} did not succeed in time (state {st.state})", file=sys.stderr)
            return 1
        time.sleep(0.05)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--portfile", required=True)
    s.add_argument("--secret", default="")
    s.add_argument("--endpoint", default=asyncd.DEFAULT_ENDPOINT)
    u = sub.add_parser("submit")
    u.add_argument("--endpoint", default=asyncd.DEFAULT_ENDPOINT)
    u.add_argument("--type", default="cross_go")
    u.add_argument("--nonce", type=int, default=time.time_ns())
    u.add_argument("--timeout", type=float, default=30.0)
    args = p.parse_args(argv)
    return serve(args) if args.cmd == "serve" else submit(args)


if __name__ == "__main__":
    sys.exit(main())
