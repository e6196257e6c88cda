"""W3C trace context: the handler reads the call's traceparent, and the client sends one
at submit, so a handler's follow-up task stays in the same trace."""

import pytest

import asyncd
from test_executor import call_asgi, call_wsgi, task_body

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
SUBMITTED = {"id": "0193a", "eta": "2026-11-30T06:00:00.123Z", "route": "store", "duplicate": False}


@pytest.mark.parametrize("call", [call_wsgi, call_asgi], ids=["wsgi", "asgi"])
def test_the_handler_continues_the_trace(call, fake_api):
    fake_api.status, fake_api.body = 201, SUBMITTED
    client = asyncd.Client(fake_api.url)
    ex = asyncd.Executor()

    @ex.executor("traced")
    def traced(payload, ctx):
        client.submit("next", idempotency_key="k", traceparent=ctx.traceparent, tracestate=ctx.tracestate)

    app = ex.wsgi_app() if call is call_wsgi else ex.asgi_app()
    status, _, _ = call(app, task_body("traced"), {"traceparent": TRACEPARENT, "tracestate": "vendor=1"})
    assert status == 200
    r = fake_api.last()
    assert (r.headers["traceparent"], r.headers["tracestate"]) == (TRACEPARENT, "vendor=1")


def test_without_a_trace_nothing_is_sent(fake_api):
    fake_api.status, fake_api.body = 201, SUBMITTED
    seen = {}
    ex = asyncd.Executor()
    ex.register("t", lambda payload, ctx: seen.update(ctx=ctx))
    assert call_wsgi(ex.wsgi_app(), task_body("t"), {})[0] == 200
    assert (seen["ctx"].traceparent, seen["ctx"].tracestate) == (None, None)

    client = asyncd.Client(fake_api.url)
    client.submit("t", idempotency_key="k")
    assert "traceparent" not in fake_api.last().headers
    fake_api.body = {"results": [{"status": 201, **SUBMITTED}]}
    fake_api.status = 200
    client.submit_batch([asyncd.Task("t", None, "k")], traceparent=TRACEPARENT)
    r = fake_api.last()
    assert (r.path, r.headers["traceparent"]) == ("/v1/tasks:batch", TRACEPARENT)
    assert "tracestate" not in r.headers
