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


def test_sign_known_vector():
    # Computed independently; the same vector is in sdk/go/executor_test.go.
    assert asyncd.sign(SECRET, 1700000000, b'{"id":"t1","type":"x"}') == (
        "v1=ea8ced2a98bbc34d295cf53301d8c7f2245096c1913fdd531dbbe9e17ab8f369"
    )


@pytest.mark.parametrize(
    "name,ts,sig,body,at,ok",
    [
        ("valid", 1700000000, None, b'{"id":"t1"}', 1700000000, True),
        ("within tolerance", 1700000000, None, b'{"id":"t1"}', 1700000000 + 299, True),
        ("tampered", 1700000000, None, b'{"id":"t2"}', 1700000000, False),
        ("too old", 1700000000, None, b'{"id":"t1"}', 1700000000 + 301, False),
        ("future", 1700000000, None, b'{"id":"t1"}', 1700000000 - 360, False),
        ("wrong secret", 1700000000, asyncd.sign("other", 1700000000, b'{"id":"t1"}'), b'{"id":"t1"}', 1700000000, False),
        ("one of several", 1700000000, "v1=00," + asyncd.sign(SECRET, 1700000000, b'{"id":"t1"}'), b'{"id":"t1"}', 1700000000, True),
        ("bare hex", 1700000000, asyncd.sign(SECRET, 1700000000, b'{"id":"t1"}')[3:], b'{"id":"t1"}', 1700000000, False),
    ],
)
def test_verify_signature(name, ts, sig, body, at, ok):
    sig = sig if sig is not None else asyncd.sign(SECRET, ts, b'{"id":"t1"}')
    if ok:
        asyncd.verify_signature(SECRET, str(ts), sig, body, now=at)
    else:
        with pytest.raises(asyncd.BadSignature):
            asyncd.verify_signature(SECRET, str(ts), sig, body, now=at)


def test_verify_signature_missing_headers():
    with pytest.raises(asyncd.BadSignature, match="Timestamp"):
        asyncd.verify_signature(SECRET, None, "v1=00", b"{}")
    with pytest.raises(asyncd.BadSignature):
        asyncd.verify_signature(SECRET, str(int(time.time())), None, b"{}")


def task_body(task_type, payload=None, attempt=2):
    return json.dumps({"id": "0193t", "type": task_type, "payload": payload, "attempt": attempt,
                       "eta": "2026-11-30T06:00:00.123Z"}).encode()


HEADERS = {
    "Idempotency-Key": "order-42",
    "Asyncd-Task-Id": "0193t",
    "Asyncd-Attempt": "2",
    "Asyncd-Lease-Token": "7",
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
        "0193t", "ok", "order-42", 2, 7, "http://127.0.0.1:7700")
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
    ex = asyncd.Executor(signing_secret=SECRET)
    runs = []
    ex.register("ok", lambda payload: runs.append(payload))
    app = ex.wsgi_app() if call is call_wsgi else ex.asgi_app()
    body = task_body("ok", 1)
    now = int(time.time())

    def signed(ts, b=body):
        return {"Asyncd-Timestamp": str(ts), "Asyncd-Signature": asyncd.sign(SECRET, ts, b)}

    assert call(app, body, signed(now))[0] == 200
    for hdrs in ({}, signed(now, body + b" "), signed(now - 301), signed(now + 301),
                 {"Asyncd-Timestamp": "soon", "Asyncd-Signature": "v1=00"}):
        assert call(app, body, hdrs)[0] == 401
    assert runs == [1]


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


def callback_route(stale_after=0):
    def route(rec):
        if rec.path.endswith("/heartbeat"):
            n = len([r for r in route.api.requests if r.path.endswith("/heartbeat")])
            if stale_after and n > stale_after:
                return 409, {"error": {"code": "stale_lease", "message": "lease lapsed"}}
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
    assert hb.body == {"lease_token": 7, "lease": "300ms"}
    results = fake_api.matching("/result")
    assert len(results) == 1
    res = results[0].body
    assert res["lease_token"] == 7 and res["status"] == status
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
