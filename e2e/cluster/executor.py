#!/usr/bin/env python3
"""The test cluster's executor: answers every task call with 200 and counts them.

  POST /<anything>   a task call (docs/api.md): recorded by id and attempt; a payload
                     field "sleep_ms" makes the answer wait that long (work in flight)
  GET  /stats        {"calls": N, "distinct": N, "ids": {id: calls}}
  GET  /healthz      ok

python3 executor.py [PORT]   (default 8080, all addresses)
"""
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

lock = threading.Lock()
calls = {}


class Executor(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def reply(self, code, body=b""):
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/stats":
            with lock:
                body = json.dumps({"calls": sum(calls.values()), "distinct": len(calls), "ids": calls})
            self.reply(200, body.encode())
        else:
            self.reply(200, b"ok\n")

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        try:
            task = json.loads(body)
        except ValueError:
            self.reply(400)
            return
        payload = task.get("payload") or {}
        if isinstance(payload, dict) and payload.get("sleep_ms"):
            time.sleep(int(payload["sleep_ms"]) / 1000)
        with lock:
            calls[task["id"]] = calls.get(task["id"], 0) + 1
        print(f"executing {task['type']} {task['id']} attempt {task.get('attempt')}", flush=True)
        self.reply(200)

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8080
    print(f"executor listening on 0.0.0.0:{port}", flush=True)
    ThreadingHTTPServer(("0.0.0.0", port), Executor).serve_forever()
