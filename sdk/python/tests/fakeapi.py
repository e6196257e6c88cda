"""A recording stand-in for the asyncd API, for unit tests."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Dict, List, Optional, Tuple


@dataclass
class Recorded:
    method: str
    path: str
    headers: Dict[str, str]
    body: Any


@dataclass
class FakeAPI:
    status: int = 200
    body: Any = field(default_factory=dict)
    #: When set, answers (status, body) or (status, body, headers) per request instead
    #: of the fixed ones.
    route: Optional[Callable[[Recorded], Tuple[Any, ...]]] = None
    requests: List[Recorded] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    url: str = ""
    #: When set, each request is recorded on arrival, then held until the gate opens,
    #: so a test can keep calls in flight.
    gate: Optional[threading.Event] = None

    def last(self) -> Recorded:
        with self.lock:
            assert self.requests, "no request reached the fake API"
            return self.requests[-1]

    def matching(self, suffix: str) -> List[Recorded]:
        with self.lock:
            return [r for r in self.requests if r.path.split("?")[0].endswith(suffix)]


def serve(api: FakeAPI) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def _any(self) -> None:
            n = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(n) if n else b""
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = raw
            rec = Recorded(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body)
            with api.lock:
                api.requests.append(rec)
                gate = api.gate
            if gate is not None and not gate.wait(30):
                raise AssertionError("the fake API's gate stayed closed for 30 s")
            reply = api.route(rec) if api.route else (api.status, api.body)
            status, answer = reply[0], reply[1]
            extra: Dict[str, str] = reply[2] if len(reply) > 2 else {}
            out = answer if isinstance(answer, bytes) else json.dumps(answer).encode()
            self.send_response(status)
            for k, v in extra.items():
                self.send_header(k, v)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _any

        def log_message(self, *args: Any) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    api.url = f"http://127.0.0.1:{srv.server_port}"
    return srv


def wait_until(cond: Callable[[], bool], timeout: float, what: str) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.01)
