import asyncio
import io
import json
import threading
import time
from datetime import datetime, timedelta, timezone
from wsgiref.util import setup_testing_defaults

import pytest

import asyncd
from fakeapi import wait_until

SECRET = "s3cret"


KNOWN = {
    "Asyncd-Timestamp": "1700000000", "Asyncd-Task-Id": "t1", "Asyncd-Attempt": "1",
    "Idempotency-Key": "k1", "Asyncd-Lease-Token": "tok", "Asyncd-Callback-Url": "http://asyncd:7700",
}


def test_sign_known_vector():
    # printf '1700000000\nt1\n1\nk1\ntok\nhttp://asyncd:7700\n{}' | openssl dgst -sha256 -hmac secret
    assert asyncd.canonical_string(KNOWN, b"{}") == b"1700000000\nt1\n1\nk1\ntok\nhttp://asyncd:7700\n{}"
    assert asyncd.sign("secret", KNOWN, b"{}") == (
        "v2=cd88cff69ddbc13aa5456dcec7bb570ba5b8bf34c7bd1cc5e47a2821be952234"
    )
    # Header names are matched whatever their case.
    assert asyncd.sign("secret", {k.lower(): v for k, v in KNOWN.items()}, b"{}") == asyncd.sign("secret", KNOWN, b"{}")


def test_verify_signature_errors_and_keys():
    signed = {**KNOWN, "Asyncd-Signature": asyncd.sign(["new", "old"], KNOWN, b"{}")}
    asyncd.verify_signature("old", signed, b"{}", now=1700000000)
    asyncd.verify_signature(["other", "new"], signed, b"{}", now=1700000000)
    with pytest.raises(asyncd.StaleTimestamp):
        asyncd.verify_signature("new", signed, b"{}", now=1700000000 + 301)
    with pytest.raises(asyncd.MalformedTimestamp):
        asyncd.verify_signature("new", {**signed, "Asyncd-Timestamp": ""}, b"{}", now=1700000000)
    with pytest.raises(asyncd.BadSignature, match="no signing key"):
        asyncd.verify_signature(["", b""], signed, b"{}", now=1700000000)
    with pytest.raises(asyncd.BadSignature, match="mismatch"):
        asyncd.verify_signature("other", signed, b"{}", now=1700000000)


def test_replay_cache_is_bounded_and_forgets_expired_entries():
    verifier = asyncd.Verifier("k", max_entries=3)

    def call(task_id, at):
        h = {"Asyncd-Timestamp": str(at), "Asyncd-Task-Id": task_id, "Asyncd-Attempt": "1"}
        h["Asyncd-Signature"] = asyncd.sign("k", h, b"")
        verifier.verify(h, b"", now=at)

    for task_id in "abcd":
        call(task_id, 1700000000)
    assert len(verifier) == 3
    with pytest.raises(asyncd.Replayed):
        call("d", 1700000000)
    call("a", 1700000000)  # the oldest was forgotten
    call("e", 1700000000 + 301)
    assert len(verifier) == 1, "expired entries are dropped"


def task_body(task_type, payload=None, attempt=2):
    return json.dumps({"id": "0193t", "type": task_type, "payload": payload, "attempt": attempt,
                       "eta": "2026-11-30T06:00:00.123Z"}).encode()


HEADERS = {
    "Idempotency-Key": "order-42",
    "Asyncd-Task-Id": "0193t",
    "Asyncd-Attempt": "2",
    "Asyncd-Lease-Token": "tok-7",
    "Asyncd-Callback-Url": "http://127.0.0.1:7700",
}


def call_wsgi(app, body, headers=None, method="POST"):
    environ = {}
    setup_testing_defaults(environ)
    environ.update(REQUEST_METHOD=method, CONTENT_LENGTH=str(len(body)), CONTENT_TYPE="application/json")
    environ["wsgi.input"] = io.BytesIO(body)
    for k, v in (headers or {}).items():
        environ["HTTP_" + k.upper().replace("-", "_")] = v
    seen = {}

    def start_response(status, hdrs):
        seen["status"], seen["headers"] = status, dict(hdrs)

    out = b"".join(app(environ, start_response))
    return int(seen["status"].split()[0]), seen["headers"], json.loads(out)


def call_asgi(app, body, headers=None, method="POST"):
    sent = []

    async def run():
        msgs = [{"type": "http.request", "body": body[:5], "more_body": True},
                {"type": "http.request", "body": body[5:], "more_body": False}]

        async def receive():
            return msgs.pop(0)

        async def send(msg):
            sent.append(msg)

        scope = {"type": "http", "method": method, "path": "/tasks",
                 "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]}
        await app(scope, receive, send)

    asyncio.run(run())
    start, body_msg = sent
    return start["status"], {k.decode(): v.decode() for k, v in start["headers"]}, json.loads(body_msg["body"])


def make_executor():
    ex = asyncd.Executor()
    seen = {}

    @ex.executor("ok")
    def ok(payload, ctx):
        seen["payload"], seen["ctx"] = payload, ctx
        return {"done": True}

    @ex.executor("payload_only")
    def payload_only(payload):
        seen["only"] = payload

    @ex.executor("async_ok")
    async def async_ok(payload, ctx):
        await asyncio.sleep(0)
        seen["async"] = (payload, ctx.attempt)

    @ex.executor("retry_later")
    def retry_later(payload):
        raise asyncd.Retry(after=timedelta(milliseconds=1500))

    @ex.executor("retry_str")
    def retry_str(payload):
        raise asyncd.Retry(after="10s")

    @ex.executor("retry_backoff")
    def retry_backoff(payload):
        raise asyncd.Retry()

    @ex.executor("retry_zero")
    def retry_zero(payload):
        raise asyncd.Retry(after=0)

    @ex.executor("permanent")
    def permanent(payload):
        raise asyncd.Permanent("card declined")

    @ex.executor("transient")
    def transient(payload):
        raise ConnectionError("db down")

    return ex, seen


OUTCOMES = [
    ("retry_later", 503, "2"),
    ("retry_str", 503, "10"),
    ("retry_backoff", 503, None),
    ("retry_zero", 503, None),
    ("permanent", 422, None),
    ("transient", 500, None),
    ("unregistered", 501, None),
]


@pytest.mark.parametrize("call", [call_wsgi, call_asgi], ids=["wsgi", "asgi"])
def test_outcome_mapping(call):
    ex, seen = make_executor()
    app = ex.wsgi_app() if call is call_wsgi else ex.asgi_app()

    status, _, body = call(app, task_body("ok", {"order_id": 42}), HEADERS)
    assert (status, body) == (200, {"output": {"done": True}})
    assert seen["payload"] == {"order_id": 42}
    ctx = seen["ctx"]
    assert (ctx.id, ctx.type, ctx.idempotency_key, ctx.attempt, ctx.lease_token, ctx.callback_url) == (
        "0193t", "ok", "order-42", 2, "tok-7", "http://127.0.0.1:7700")
    assert ctx.eta == datetime(2026, 11, 30, 6, 0, 0, 123000, tzinfo=timezone.utc)

    assert call(app, task_body("payload_only", [1, 2]), HEADERS)[0] == 200
    assert seen["only"] == [1, 2]
    assert call(app, task_body("async_ok", "x"), HEADERS)[0] == 200
    assert seen["async"] == ("x", 2)

    for task_type, want_status, retry_after in OUTCOMES:
        status, headers, body = call(app, task_body(task_type), HEADERS)
        assert status == want_status, (task_type, body)
        assert headers.get("Retry-After", headers.get("retry-after")) == retry_after, task_type
        assert "error" in body
    assert "card declined" in call(app, task_body("permanent"), HEADERS)[2]["error"]
    assert call(app, b"not json", HEADERS)[0] == 400
    assert call(app, b"{}", HEADERS, method="GET")[0] == 405


def test_idempotency_key_falls_back_to_id():
    ex, seen = make_executor()
    assert call_wsgi(ex.wsgi_app(), task_body("ok"), {})[0] == 200
    assert seen["ctx"].idempotency_key == "0193t"
    assert seen["ctx"].callback_url == ""


@pytest.mark.parametrize("call", [call_wsgi, call_asgi], ids=["wsgi", "asgi"])
def test_signature_enforced(call):
    ex = asyncd.Executor(signing_secret=["new", "old"])
    runs = []
    ex.register("ok", lambda payload: runs.append(payload))
    app = ex.wsgi_app() if call is call_wsgi else ex.asgi_app()
    body = task_body("ok", 1)
    now = int(time.time())

    def signed(key, ts, attempt="1", b=body):
        h = {"Asyncd-Timestamp": str(ts), "Asyncd-Task-Id": "0193t", "Asyncd-Attempt": attempt,
             "Asyncd-Lease-Token": "tok"}
        return {**h, "Asyncd-Signature": asyncd.sign(key, h, b)}

    assert call(app, body, signed("new", now))[0] == 200
    assert call(app, body, signed("old", now, attempt="2"))[0] == 200
    for hdrs in ({}, signed("new", now), signed("new", now, "3", body + b" "), signed("other", now, "3"),
                 # A minute past the 5-minute bound ahead: the executor reads its own
                 # clock later than `now`, maybe a second or more on a busy machine.
                 signed("new", now - 301, "3"), signed("new", now + 360, "3"),
                 {"Asyncd-Timestamp": "soon", "Asyncd-Signature": "v2=00"}):
        assert call(app, body, hdrs)[0] == 401
    assert runs == [1, 1]
    empty = asyncd.Executor(signing_secret="")
    empty.register("ok", lambda payload: runs.append("ran with an empty key"))
    assert call(empty.wsgi_app() if call is call_wsgi else empty.asgi_app(), body, signed("", now))[0] == 401
    assert runs == [1, 1]


def test_asgi_lifespan():
    app = asyncd.Executor().asgi_app()
    sent = []

    async def run():
        msgs = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]

        async def receive():
            return msgs.pop(0)

        async def send(m):
            sent.append(m["type"])

        await app({"type": "lifespan"}, receive, send)

    asyncio.run(run())
    assert sent == ["lifespan.startup.complete", "lifespan.shutdown.complete"]


def callback_route(stale_after=0, cancelled_after=0):
    def route(rec):
        if rec.path.endswith("/heartbeat"):
            n = len([r for r in route.api.requests if r.path.endswith("/heartbeat")])
            if stale_after and n > stale_after:
                return 409, {"error": {"code": "stale_lease", "message": "lease lapsed"}}
            if cancelled_after and n > cancelled_after:
                return 410, {"error": {"code": "task_cancelled", "message": "task was cancelled", "state": "cancelled"}}
            return 200, {"lease_until": "2026-11-30T06:00:00.000Z"}
        if rec.path.endswith("/result"):
            return 200, {"id": "0193t", "state": "succeeded"}
        return 404, {}

    return route


@pytest.mark.parametrize(
    "outcome,status,extra",
    [
        ("return", "success", {"output": {"rows": 3}}),
        ("permanent", "failed", {"error": "bad input"}),
        ("retry", "retry", {"retry_after": "10s"}),
        ("error", "retry", {"error": "RuntimeError: flaky"}),
    ],
)
def test_long_running_heartbeats_and_posts_result(fake_api, outcome, status, extra):
    fake_api.route = callback_route()
    fake_api.route.api = fake_api
    ex = asyncd.Executor()
    release = threading.Event()

    @ex.executor("long", long_running=True, lease=0.3)
    def long(payload, ctx):
        assert release.wait(5)
        if outcome == "permanent":
            raise asyncd.Permanent("bad input")
        if outcome == "retry":
            raise asyncd.Retry(after=10)
        if outcome == "error":
            raise RuntimeError("flaky")
        return {"rows": 3}

    st, _, body = call_wsgi(ex.wsgi_app(), task_body("long"), {**HEADERS, "Asyncd-Callback-Url": fake_api.url})
    assert (st, body) == (202, {"lease": "300ms"})
    wait_until(lambda: len(fake_api.matching("/heartbeat")) >= 2, 5, "two heartbeats")
    release.set()
    assert ex.wait(5)
    hb = fake_api.matching("/heartbeat")[0]
    assert hb.method == "POST" and hb.path == "/v1/tasks/0193t/heartbeat"
    assert hb.body == {"lease_token": "tok-7", "lease": "300ms"}
    results = fake_api.matching("/result")
    assert len(results) == 1
    res = results[0].body
    assert res["lease_token"] == "tok-7" and res["status"] == status
    for k, v in extra.items():
        assert res[k] == v


def test_long_running_stale_lease_stops(fake_api):
    fake_api.route = callback_route(stale_after=1)
    fake_api.route.api = fake_api
    ex = asyncd.Executor(callback_endpoint=fake_api.url)
    stopped = threading.Event()

    @ex.executor("long", long_running=True, lease=timedelta(milliseconds=150))
    def long(payload, ctx):
        assert ctx.lease_lost.wait(5)
        stopped.set()

    headers = {k: v for k, v in HEADERS.items() if k != "Asyncd-Callback-Url"}
    assert call_wsgi(ex.wsgi_app(), task_body("long"), headers)[0] == 202
    assert ex.wait(5)
    assert stopped.is_set()
    assert fake_api.matching("/result") == []


def test_long_running_cancelled_task_cancels_the_coroutine(fake_api):
    """Issue 15: a task cancelled in asyncd while it runs is told on the next heartbeat
    (410 task_cancelled); a coroutine handler gets Python's own cancellation, and no
    result is posted."""
    fake_api.route = callback_route(cancelled_after=1)
    fake_api.route.api = fake_api
    ex = asyncd.Executor(callback_endpoint=fake_api.url)
    seen = {}

    @ex.executor("long", long_running=True, lease=timedelta(milliseconds=150))
    async def long(payload, ctx):
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            seen["cancelled"] = ctx.cancel_reason
            raise

    headers = {k: v for k, v in HEADERS.items() if k != "Asyncd-Callback-Url"}
    assert call_wsgi(ex.wsgi_app(), task_body("long"), headers)[0] == 202
    assert ex.wait(10)
    assert seen == {"cancelled": "the task was cancelled in asyncd"}
    assert fake_api.matching("/result") == []


def test_register_rejects_bad_lease():
    with pytest.raises(ValueError):
        asyncd.Executor().register("t", lambda p: None, long_running=True, lease=0)


def test_make_server_serves_wsgi():
    import urllib.request

    ex, seen = make_executor()
    srv = ex.make_server("127.0.0.1", 0)
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    try:
        req = urllib.request.Request(f"http://127.0.0.1:{srv.server_port}/tasks/ok", data=task_body("ok", 5),
                                     headers=HEADERS, method="POST")
        with urllib.request.urlopen(req, timeout=5) as resp:
            assert resp.status == 200
        assert seen["payload"] == 5
    finally:
        srv.shutdown()
        srv.server_close()


# -- batch calls (docs/api.md, "Batch delivery") ---------------------------------


def batch_task(task_id, task_type, payload=None, attempt=1, **extra):
    return {"id": task_id, "type": task_type, "payload": payload, "attempt": attempt,
            "eta": "2026-11-30T06:00:00.123Z", "idempotency_key": f"key-{task_id}", "lease_token": f"tok-{task_id}",
            **extra}


def batch_body(*tasks):
    return json.dumps({"tasks": list(tasks)}).encode()


def batch_headers(body, callback_url="http://127.0.0.1:7700", key=None, ts=None, n=None):
    h = {"Asyncd-Batch": str(len(json.loads(body)["tasks"]) if n is None else n), "Asyncd-Callback-Url": callback_url}
    if key is not None:
        h["Asyncd-Timestamp"] = str(int(time.time()) if ts is None else ts)
        h["Asyncd-Signature"] = asyncd.sign(key, h, body)
    return h


def post_http(ex, body, headers):
    """POSTs to the executor served by its own stdlib server, as asyncd would."""
    import urllib.error
    import urllib.request

    srv = ex.make_server("127.0.0.1", 0)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        req = urllib.request.Request(f"http://127.0.0.1:{srv.server_port}/tasks", data=body,
                                     headers={"Content-Type": "application/json", **headers}, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, dict(resp.headers), json.loads(resp.read())
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), json.loads(e.read())
    finally:
        srv.shutdown()
        srv.server_close()


def serve_batch(call, ex, body, headers):
    if call is post_http:
        return post_http(ex, body, headers)
    return call(ex.wsgi_app() if call is call_wsgi else ex.asgi_app(), body, headers)


SERVERS = [post_http, call_wsgi, call_asgi]
SERVER_IDS = ["http", "wsgi", "asgi"]


@pytest.mark.parametrize("call", SERVERS, ids=SERVER_IDS)
def test_batch_runs_each_task_and_maps_every_outcome(fake_api, call):
    """One call of mixed tasks: each runs the unchanged handler once with its own
    context, and its outcome is mapped as a single call's would be; a handler that
    blows up fails only its own task; long-running tasks heartbeat and post their
    results with their own lease tokens."""
    fake_api.route = callback_route()
    fake_api.route.api = fake_api
    ex = asyncd.Executor(signing_secret=SECRET)
    seen = {}
    lock = threading.Lock()
    release = threading.Event()

    def record(payload, ctx):
        with lock:
            seen.setdefault(ctx.id, []).append((payload, ctx))

    @ex.executor("ok")
    def ok(payload, ctx):
        record(payload, ctx)
        return {"output is": "not in a batch result"}

    @ex.executor("async_ok")
    async def async_ok(payload, ctx):
        await asyncio.sleep(0)
        record(payload, ctx)

    @ex.executor("retry_later")
    def retry_later(payload, ctx):
        record(payload, ctx)
        raise asyncd.Retry(after=timedelta(seconds=30), message="downstream busy")

    @ex.executor("retry_round_up")
    def retry_round_up(payload, ctx):
        record(payload, ctx)
        raise asyncd.Retry(after=timedelta(milliseconds=1500))

    @ex.executor("retry_backoff")
    def retry_backoff(payload, ctx):
        record(payload, ctx)
        raise asyncd.Retry()

    @ex.executor("permanent")
    def permanent(payload, ctx):
        record(payload, ctx)
        raise asyncd.Permanent("no such image")

    @ex.executor("boom")
    def boom(payload, ctx):
        record(payload, ctx)
        return 1 // 0

    @ex.executor("exits")
    def exits(payload, ctx):
        record(payload, ctx)
        raise SystemExit("handler called sys.exit")

    @ex.executor("long", long_running=True, lease=0.3)
    def long(payload, ctx):
        record(payload, ctx)
        assert release.wait(5)
        if payload == "retry":
            raise asyncd.Retry(after=10)
        return {"rows": payload}

    tasks = [
        batch_task("t-ok", "ok", {"n": 1}, traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
                   tracestate="k=v"),
        batch_task("t-async", "async_ok", [1, 2], attempt=3),
        batch_task("t-retry", "retry_later"),
        batch_task("t-retry-round", "retry_round_up"),
        batch_task("t-backoff", "retry_backoff"),
        batch_task("t-permanent", "permanent"),
        batch_task("t-boom", "boom"),
        batch_task("t-exits", "exits"),
        batch_task("t-long-1", "long", 7),
        batch_task("t-long-2", "long", "retry", attempt=2),
        batch_task("t-unknown", "unregistered"),
    ]
    body = batch_body(*tasks)
    status, _, answer = serve_batch(call, ex, body, batch_headers(body, fake_api.url, key=SECRET))
    assert status == 200, answer
    assert answer == {"results": [
        {"id": "t-ok", "status": "success"},
        {"id": "t-async", "status": "success"},
        {"id": "t-retry", "status": "retry", "error": "downstream busy", "retry_after": "30s"},
        {"id": "t-retry-round", "status": "retry", "error": "retry", "retry_after": "2s"},
        {"id": "t-backoff", "status": "retry", "error": "retry"},
        {"id": "t-permanent", "status": "failed", "error": "no such image"},
        {"id": "t-boom", "status": "retry", "error": "ZeroDivisionError: integer division or modulo by zero"},
        {"id": "t-exits", "status": "retry", "error": "SystemExit: handler called sys.exit"},
        {"id": "t-long-1", "status": "accepted", "lease": "300ms"},
        {"id": "t-long-2", "status": "accepted", "lease": "300ms"},
        {"id": "t-unknown", "status": "retry", "error": "no executor for task type 'unregistered'"},
    ]}

    # Each handler ran once, with the context a single call would have given it.
    wait_until(lambda: len(seen) == 10, 5, "the long-running handlers to start")
    assert sorted(seen) == sorted(t["id"] for t in tasks if t["type"] != "unregistered")
    for t in tasks[:-1]:
        [(payload, ctx)] = seen[t["id"]]
        assert payload == t["payload"]
        assert (ctx.id, ctx.type, ctx.attempt, ctx.idempotency_key, ctx.lease_token, ctx.callback_url) == (
            t["id"], t["type"], t["attempt"], t["idempotency_key"], t["lease_token"], fake_api.url), t["id"]
        assert ctx.eta == datetime(2026, 11, 30, 6, 0, 0, 123000, tzinfo=timezone.utc)
        assert (ctx.traceparent, ctx.tracestate) == (t.get("traceparent"), t.get("tracestate"))

    # The long-running tasks: heartbeats, then results, each with its own lease token.
    for task_id in ("t-long-1", "t-long-2"):
        wait_until(lambda: len(fake_api.matching(f"/v1/tasks/{task_id}/heartbeat")) >= 2, 5, f"{task_id} heartbeats")
        hb = fake_api.matching(f"/v1/tasks/{task_id}/heartbeat")[0]
        assert hb.body == {"lease_token": f"tok-{task_id}", "lease": "300ms"}
    release.set()
    assert ex.wait(5)
    results = {r.path: r.body for r in fake_api.matching("/result")}
    assert results == {
        "/v1/tasks/t-long-1/result": {"lease_token": "tok-t-long-1", "status": "success", "output": {"rows": 7}},
        "/v1/tasks/t-long-2/result": {"lease_token": "tok-t-long-2", "status": "retry", "error": "retry",
                                      "retry_after": "10s"},
    }


@pytest.mark.parametrize("call", [call_wsgi, call_asgi], ids=["wsgi", "asgi"])
def test_batch_tasks_run_concurrently_and_bounded(call):
    ex = asyncd.Executor(batch_concurrency=3)
    lock = threading.Lock()
    running, peak = [0], [0]
    together = threading.Barrier(3, timeout=5)

    @ex.executor("work")
    def work(payload):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        try:
            if payload < 3:
                together.wait()  # the first three only pass if they run at once
            time.sleep(0.02)
        finally:
            with lock:
                running[0] -= 1

    body = batch_body(*(batch_task(f"t{i}", "work", i) for i in range(9)))
    status, _, answer = call(ex.wsgi_app() if call is call_wsgi else ex.asgi_app(), body, batch_headers(body))
    assert status == 200
    assert answer == {"results": [{"id": f"t{i}", "status": "success"} for i in range(9)]}
    assert peak[0] == 3, "at most batch_concurrency tasks at a time"
    with pytest.raises(ValueError):
        asyncd.Executor(batch_concurrency=0)


@pytest.mark.parametrize("call", [call_wsgi, call_asgi], ids=["wsgi", "asgi"])
def test_batch_replayed_entry_fails_without_running(call):
    """A (task, attempt, lease token) already accepted — in a batch or a single call —
    is answered "failed" with the single call's 401 message; its handler does not run,
    and the other tasks of the call are not affected."""
    ex = asyncd.Executor(signing_secret=SECRET)
    ran = []
    ex.register("ok", lambda payload, ctx: ran.append((ctx.id, ctx.attempt)))
    app = ex.wsgi_app() if call is call_wsgi else ex.asgi_app()
    refused = "bad signature: this task attempt was already delivered"

    first = batch_body(batch_task("a", "ok"), batch_task("b", "ok"))
    assert call(app, first, batch_headers(first, key=SECRET))[2] == {
        "results": [{"id": "a", "status": "success"}, {"id": "b", "status": "success"}]}

    # The same call, captured and sent again; then a new call carrying "a" again.
    assert call(app, first, batch_headers(first, key=SECRET))[2] == {
        "results": [{"id": "a", "status": "failed", "error": refused}, {"id": "b", "status": "failed", "error": refused}]}
    again = batch_body(batch_task("c", "ok"), batch_task("a", "ok"), batch_task("a", "ok", attempt=2,
                                                                                lease_token="tok-a-2"))
    assert call(app, again, batch_headers(again, key=SECRET))[2] == {"results": [
        {"id": "c", "status": "success"}, {"id": "a", "status": "failed", "error": refused},
        {"id": "a", "status": "success"}]}
    assert sorted(ran) == [("a", 1), ("a", 2), ("b", 1), ("c", 1)]

    # Single calls and batch entries share the replay window.
    h = {"Asyncd-Timestamp": str(int(time.time())), "Asyncd-Task-Id": "c", "Asyncd-Attempt": "1",
         "Asyncd-Lease-Token": "tok-c", "Idempotency-Key": "key-c"}
    single = json.dumps({"id": "c", "type": "ok", "payload": None, "attempt": 1}).encode()
    status, _, answer = call(app, single, {**h, "Asyncd-Signature": asyncd.sign(SECRET, h, single)})
    assert (status, answer) == (401, {"error": refused})
    h["Asyncd-Task-Id"], h["Asyncd-Lease-Token"] = "d", "tok-d"
    single = json.dumps({"id": "d", "type": "ok", "payload": None, "attempt": 1}).encode()
    assert call(app, single, {**h, "Asyncd-Signature": asyncd.sign(SECRET, h, single)})[0] == 200
    last = batch_body(batch_task("d", "ok"))
    assert call(app, last, batch_headers(last, key=SECRET))[2] == {
        "results": [{"id": "d", "status": "failed", "error": refused}]}
    assert len(ran) == 5


@pytest.mark.parametrize("call", [call_wsgi, call_asgi], ids=["wsgi", "asgi"])
def test_batch_refused_calls(call):
    ex = asyncd.Executor(signing_secret=SECRET)
    ran = []
    ex.register("ok", lambda payload: ran.append(payload))
    app = ex.wsgi_app() if call is call_wsgi else ex.asgi_app()
    body = batch_body(batch_task("a", "ok", 1))
    now = int(time.time())

    # The signature: per-task fields empty; a stale, unsigned or tampered call is refused whole.
    for hdrs, b in [
        (batch_headers(body), body),
        (batch_headers(body, key="other"), body),
        (batch_headers(body, key=SECRET, ts=now - 301), body),
        (batch_headers(body, key=SECRET), body.replace(b'"payload": 1', b'"payload": 2')),
        ({**batch_headers(body, key=SECRET), "Asyncd-Callback-Url": "http://evil.example"}, body),
    ]:
        status, _, answer = call(app, b, hdrs)
        assert status == 401 and answer["error"].startswith("bad signature: "), answer
    signed_per_task = {"Asyncd-Batch": "1", "Asyncd-Callback-Url": "http://127.0.0.1:7700",
                       "Asyncd-Timestamp": str(now), "Asyncd-Task-Id": "a", "Asyncd-Attempt": "1",
                       "Asyncd-Lease-Token": "tok-a", "Idempotency-Key": "key-a"}
    signed_per_task["Asyncd-Signature"] = asyncd.sign(SECRET, signed_per_task, body)
    assert call(app, body, signed_per_task)[0] == 401, "a batch is signed with the per-task fields empty"
    assert ran == []

    # A well-signed body that is not a batch of tasks: 400, nothing runs.
    for bad in [b"not json", b"[]", b'{"tasks": {}}', batch_body({"id": "a", "type": "ok"}),
                batch_body({**batch_task("a", "ok"), "attempt": "1"}), batch_body({**batch_task("a", "ok"), "id": ""}),
                batch_body(batch_task("a", "ok"), "not a task")]:
        status, _, answer = call(app, bad, batch_headers(bad, key=SECRET, n=1))
        assert status == 400 and answer["error"].startswith("body is not a batch of asyncd tasks"), (bad, answer)
    assert ran == []

    empty = batch_body()
    status, _, answer = call(app, empty, batch_headers(empty, key=SECRET))
    assert (status, answer) == (200, {"results": []})


def test_batch_handle_without_signing_and_framework_free():
    ex = asyncd.Executor()
    ex.register("ok", lambda payload, ctx: ctx.callback_url)
    body = batch_body(batch_task("a", "ok"))
    status, _, out = ex.handle("POST", {"asyncd-batch": "1"}, body)
    assert (status, json.loads(out)) == (200, {"results": [{"id": "a", "status": "success"}]})
    assert ex.handle("GET", {"asyncd-batch": "1"}, body)[0] == 405
