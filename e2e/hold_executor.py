#!/usr/bin/env python3
"""An executor that accepts every call with a 202 and a 10-minute lease, and never posts
a result: the attempts it is given stay running. Prints `accepted` per call.

Run: python3 e2e/hold_executor.py PORT
"""
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LEASE = b'{"lease": "10m"}'
# one line per call, whole: prints from the server's threads could otherwise interleave
PRINTING = threading.Lock()


class Hold(BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(202)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(LEASE)))
        self.end_headers()
        self.wfile.write(LEASE)

    def log_message(self, *args):
        with PRINTING:
            sys.stdout.write("accepted\n")
            sys.stdout.flush()


if __name__ == "__main__":
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Hold).serve_forever()
