"""Every path and query parameter of docs/openapi.json, sent holding a NUL or bytes that
are not UTF-8: each must be answered 400 `invalid_field` as JSON, never a 5xx or a
plain-text answer (issue 32). Schemathesis generates text, never bytes that are not
UTF-8, and rarely a NUL in a path: this closes the class for every operation, including
the ones added later.

    python3 e2e/fuzz_params.py http://127.0.0.1:PORT [--header "Authorization: Bearer T"]
"""

import argparse
import http.client
import json
import pathlib
import sys
import urllib.parse

BAD_VALUES = ["%00", "a%00b", "%FF", "%C3%28"]
ROOT = pathlib.Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("base")
    parser.add_argument("--header", action="append", default=[])
    args = parser.parse_args()
    base = urllib.parse.urlsplit(args.base)
    headers = {"Content-Type": "application/json"}
    for header in args.header:
        name, _, value = header.partition(":")
        headers[name.strip()] = value.strip()
    spec = json.loads((ROOT / "docs" / "openapi.json").read_text())
    failures, sent = [], 0
    for template, item in spec["paths"].items():
        shared = item.get("parameters", [])
        for method, operation in item.items():
            if method == "parameters":
                continue
            params = [p for p in shared + operation.get("parameters", []) if p["in"] in ("path", "query")]
            path_names = [p["name"] for p in params if p["in"] == "path"]
            for target in params:
                for bad in BAD_VALUES:
                    path = template
                    for name in path_names:
                        path = path.replace("{" + name + "}", bad if name == target["name"] else "x")
                    if target["in"] == "query":
                        path += "?" + urllib.parse.quote(target["name"]) + "=" + bad
                    connection = http.client.HTTPConnection(base.hostname, base.port, timeout=10)
                    connection.request(method.upper(), path, body=b"{}", headers=headers)
                    response = connection.getresponse()
                    body = response.read()
                    connection.close()
                    sent += 1
                    what = f"{method.upper()} {path}"
                    try:
                        error = json.loads(body)["error"]
                    except (ValueError, KeyError, TypeError):
                        failures.append(f"{what}: {response.status}, not the API's JSON error: {body[:200]!r}")
                        continue
                    if response.status != 400 or error.get("code") != "invalid_field":
                        failures.append(f"{what}: {response.status} {error}")
    for failure in failures:
        print("FAIL:", failure, file=sys.stderr)
    print(f"fuzz_params: {sent} requests, {len(failures)} wrong answers")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
