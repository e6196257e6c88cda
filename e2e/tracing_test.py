"""Trace context from submit to executor, against a real `asyncd dev` and a real OTLP
receiver (e2e/tracing.sh runs this with the official `opentelemetry-proto` package).

In this process: an OTLP/HTTP receiver that decodes each `POST /v1/traces` with
opentelemetry-proto's ExportTraceServiceRequest, and an executor that records the
`traceparent` of every call. It starts `asyncd dev --otlp-endpoint` at the receiver,
submits a task with a known traceparent and one with a malformed traceparent, and checks:
the executor got the submitter's trace id under the attempt's span; the receiver got
`submit`, `dispatch` and `attempt` spans of that trace, chained attempt -> dispatch ->
submit -> the caller's span, with the task's id and type; the malformed header was
ignored (task accepted, executor called without one, no spans).
"""

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
CALLER_SPAN = "b7ad6b7169203331"
TRACEPARENT = f"00-{TRACE_ID}-{CALLER_SPAN}-01"
DEADLINE_S = 20

lock = threading.Condition()
calls = []  # (task id, traceparent or None, tracestate or None)
spans = []  # dicts


class Receiver(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.path != "/v1/traces" or self.headers["Content-Type"] != "application/x-protobuf":
            self.send_response(404)
            self.end_headers()
            return
        request = trace_service_pb2.ExportTraceServiceRequest()
        request.ParseFromString(body)
        decoded = []
        for resource_spans in request.resource_spans:
            service = {
                a.key: a.value.string_value for a in resource_spans.resource.attributes
            }.get("service.name")
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    attributes = {}
                    for a in span.attributes:
                        kind = a.value.WhichOneof("value")
                        attributes[a.key] = getattr(a.value, kind)
                    decoded.append({
                        "service": service,
                        "name": span.name,
                        "trace_id": span.trace_id.hex(),
                        "span_id": span.span_id.hex(),
                        "parent": span.parent_span_id.hex(),
                        "start": span.start_time_unix_nano,
                        "end": span.end_time_unix_nano,
                        "attributes": attributes,
                    })
        answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)
        with lock:
            spans.extend(decoded)
            lock.notify_all()

    def log_message(self, *args):
        pass


class Executor(BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()
        with lock:
            calls.append((
                self.headers["Asyncd-Task-Id"],
                self.headers["traceparent"],
                self.headers["tracestate"],
            ))
            lock.notify_all()

    def log_message(self, *args):
        pass


def serve(handler):
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server.server_address[1]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, what):
    with lock:
        if not lock.wait_for(predicate, timeout=DEADLINE_S):
            sys.exit(f"FAIL: {what} within {DEADLINE_S} s; calls={calls} spans={spans}")


def submit(base, headers):
    request = urllib.request.Request(
        f"{base}/v1/tasks",
        data=json.dumps({"type": "traced", "payload": {"n": 1}}).encode(),
        headers={"Content-Type": "application/json", **headers},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 201, answer.status
        return json.load(answer)["id"]


def check(condition, message):
    if not condition:
        sys.exit(f"FAIL: {message}; spans={json.dumps(spans, indent=1)}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--asyncd", required=True)
    args = parser.parse_args()
    receiver_port = serve(Receiver)
    executor_port = serve(Executor)
    work = tempfile.mkdtemp(prefix="asyncd-tracing.")
    jobs = os.path.join(work, "jobs")
    os.mkdir(jobs)
    with open(os.path.join(jobs, "traced.yaml"), "w") as f:
        f.write(
            "apiVersion: asyncd.example.io/v1\nkind: AsyncJobConfig\n"
            "metadata: {name: traced-job}\n"
            f"spec:\n  taskType: traced\n  executor: {{url: \"http://127.0.0.1:{executor_port}/\", timeout: 5s}}\n"
        )
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = open(os.path.join(work, "asyncd.log"), "w")
    env = {**os.environ, "OTEL_SERVICE_NAME": "asyncd-e2e"}
    asyncd = subprocess.Popen(
        [args.asyncd, "dev", "--db", os.path.join(work, "dev.db"), "--config", jobs,
         "--listen", f"127.0.0.1:{port}",
         "--otlp-endpoint", f"http://127.0.0.1:{receiver_port}"],
        stdout=log, stderr=subprocess.STDOUT, env=env,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{base}/readyz", timeout=2)
                break
            except OSError:
                if asyncd.poll() is not None or time.monotonic() > deadline:
                    sys.exit(f"FAIL: asyncd dev did not become ready; see {work}/asyncd.log")
                time.sleep(0.1)

        traced = submit(base, {"traceparent": TRACEPARENT, "tracestate": "vendor=abc"})
        untraced = submit(base, {"traceparent": "00-not-a-trace-01"})

        wait_for(lambda: {c[0] for c in calls} >= {traced, untraced}, "both executor calls")
        received = {c[0]: c for c in calls}
        _, parent, state = received[traced]
        check(parent is not None, "the traced task's call had no traceparent")
        version, trace_id, attempt_span, flags = parent.split("-")
        check((version, trace_id, flags) == ("00", TRACE_ID, "01"), f"traceparent {parent}")
        check(attempt_span != CALLER_SPAN, "the executor's parent is the caller's span, not the attempt's")
        check(state == "vendor=abc", f"tracestate {state!r}")
        check(received[untraced][1] is None, f"a malformed traceparent was passed on: {received[untraced]}")

        def by_name(name):
            return [s for s in spans if s["name"] == name and s["trace_id"] == TRACE_ID]

        wait_for(lambda: all(by_name(n) for n in ("submit", "dispatch", "attempt")),
                 "the submit, dispatch and attempt spans")
        check(all(s["trace_id"] == TRACE_ID for s in spans), "a span outside the submitter's trace")
        (submit_span,) = by_name("submit")
        (dispatch_span,) = by_name("dispatch")
        (attempt,) = by_name("attempt")
        check(submit_span["parent"] == CALLER_SPAN, "submit is not the caller's child")
        check(dispatch_span["parent"] == submit_span["span_id"], "dispatch is not submit's child")
        check(attempt["parent"] == dispatch_span["span_id"], "attempt is not dispatch's child")
        check(attempt["span_id"] == attempt_span, "the executor's parent is not the attempt span")
        for span in (submit_span, dispatch_span, attempt):
            check(span["attributes"].get("asyncd.task.id") == traced, f"{span['name']}: task id")
            check(span["attributes"].get("asyncd.task.type") == "traced", f"{span['name']}: task type")
            check(span["service"] == "asyncd-e2e", f"{span['name']}: service.name")
            check(0 < span["start"] <= span["end"], f"{span['name']}: times")
        check(attempt["attributes"].get("asyncd.attempt") == 1, "attempt number")
        check(attempt["attributes"].get("http.response.status_code") == 200, "attempt status")
        check(attempt["attributes"].get("asyncd.outcome") == "succeeded", "attempt outcome")
        check(submit_span["attributes"].get("http.response.status_code") == 201, "submit status")
        check(not any(s["attributes"].get("asyncd.task.id") == untraced for s in spans),
              "spans for the task with a malformed traceparent")
        print(f"tracing: passed ({len(spans)} spans, trace {TRACE_ID})")
    finally:
        failed = sys.exc_info()[0] is not None
        asyncd.send_signal(signal.SIGTERM)
        try:
            asyncd.wait(timeout=30)
        except subprocess.TimeoutExpired:
            asyncd.kill()
        log.close()
        if failed:
            with open(os.path.join(work, "asyncd.log")) as f:
                print("--- tail of the asyncd log\n" + f.read()[-4000:], file=sys.stderr)
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
