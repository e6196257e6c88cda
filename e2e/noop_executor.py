"""An executor that answers every call 200 and appends a line per call to a file.

    python3 noop_executor.py PORT CALLS_FILE

Used by e2e/link-order.sh to run tasks through asyncd's executor path while it profiles.
"""

import http.server
import sys


class Executor(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers.get("content-length", 0)))
        with open(sys.argv[2], "a", encoding="utf-8") as calls:
            calls.write("1\n")
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Executor).serve_forever()
