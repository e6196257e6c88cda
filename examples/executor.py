#!/usr/bin/env python3
"""A tiny executor for the quickstart: prints each task it is given and answers 200.

Run: python3 examples/executor.py [PORT]   (default 8080)
"""
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Executor(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        task = json.loads(body)
        print(f"executing {task['type']} {task['id']} attempt {task['attempt']}: "
              f"{json.dumps(task['payload'])}", flush=True)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8080
    print(f"executor listening on 127.0.0.1:{port}", flush=True)
    ThreadingHTTPServer(("127.0.0.1", port), Executor).serve_forever()
