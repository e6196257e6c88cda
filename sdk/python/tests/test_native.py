"""Executor logging, deadlines and cancellation, and durations given as strings."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest

import asyncd
from test_executor import HEADERS, call_asgi, call_wsgi, task_body


def _records(caplog: pytest.LogCaptureFixture):
    return [r for r in caplog.records if r.name == "asyncd"]


@pytest.mark.parametrize("call", [call_wsgi, call_asgi], ids=["wsgi", "asgi"])
def test_every_failed_refused_or_timed_out_task_is_logged(call, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="asyncd")
    ex = asyncd.Executor()
    ex.register("ok", lambda p: None)
    ex.register("flaky", lambda p: (_ for _ in ()).throw(ConnectionError("db down")))

    def bad(payload):
        raise asyncd.Permanent("card declined")

    def later(payload):
        raise asyncd.Retry(after="10s")

    def slow(payload, ctx):
        assert ctx.cancelled.wait(5), "the deadline cancels the attempt"
        ctx.check()

    ex.register("bad", bad)
    ex.register("later", later)
    ex.register("slow", slow, timeout="100ms")
    app = ex.asgi_app() if call is call_asgi else ex.wsgi_app()
    assert call(app, task_body("ok"), HEADERS)[0] == 200
    assert _records(caplog) == [], "a success is not logged"
    for task_type in ("flaky", "bad", "later", "nobody", "slow"):
        call(app, task_body(task_type), HEADERS)
    got = [(r.levelname, r.task_type, r.getMessage()) for r in _records(caplog)]
    want = [("ERROR", "flaky", "failed; asyncd will retry it: ConnectionError: db down"),
            ("ERROR", "bad", "failed permanently; it goes to dead letters: card declined"),
            ("WARNING", "later", "asked to be retried"),
            ("WARNING", "nobody", "no executor for task type 'nobody'"),
            ("ERROR", "slow", "timed out after")]
    assert len(got) == len(want), got
    for (level, task_type, msg), (wlevel, wtype, wmsg) in zip(got, want):
        assert (level, task_type) == (wlevel, wtype) and wmsg in msg and "0193t" in msg, (got, want)
    assert "timed out after 100ms" in got[-1][2]


def test_refused_calls_are_logged_with_what_to_fix(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="asyncd")
    # A job without spec.executor.signing sends unsigned calls.
    ex = asyncd.Executor(signing_secret="s3cret")
    ex.register("ok", lambda p: None)
    assert call_wsgi(ex.wsgi_app(), task_body("ok"), HEADERS)[0] == 401
    # This executor's secret variable is unset: it refuses every call.
    empty = asyncd.Executor(signing_secret="")
    empty.register("ok", lambda p: None)
    assert call_wsgi(empty.wsgi_app(), task_body("ok"), HEADERS)[0] == 401
    msgs = [(r.levelname, r.getMessage()) for r in _records(caplog)]
    assert len(msgs) == 2, msgs
    assert msgs[0][0] == "ERROR" and "401" in msgs[0][1] and "0193t" in msgs[0][1]
    assert "the job has no spec.executor.signing" in msgs[0][1]
    assert "no usable signing key" in msgs[1][1]


def test_a_sync_handler_gets_its_deadline_and_a_cancellation_signal() -> None:
    ex = asyncd.Executor()
    seen = {}

    @ex.executor("charge", timeout="200ms")
    def charge(payload, ctx):
        seen["remaining"] = ctx.remaining()
        seen["cancelled_in_time"] = ctx.cancelled.wait(5)
        seen["reason"] = ctx.cancel_reason
        with pytest.raises(asyncd.Cancelled):
            ctx.check()
        seen["side_effect"] = False  # a handler that honours the signal stops here

    started = time.monotonic()
    status, _, body = call_wsgi(ex.wsgi_app(), task_body("charge"), HEADERS)
    assert 0 < seen["remaining"] <= 0.2
    assert seen["cancelled_in_time"] and seen["reason"] == "timed out after 200ms"
    assert time.monotonic() - started < 5
    assert status == 200 and seen["side_effect"] is False

    # Without timeout= there is no deadline.
    ex.register("free", lambda p, ctx: seen.update(free=(ctx.deadline, ctx.remaining())))
    call_wsgi(ex.wsgi_app(), task_body("free"), HEADERS)
    assert seen["free"] == (None, None)


def test_an_async_handler_is_cancelled_at_its_deadline() -> None:
    ex = asyncd.Executor()
    cancelled = threading.Event()

    @ex.executor("slow", timeout=0.1)
    async def slow(payload):
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    status, _, _ = call_asgi(ex.asgi_app(), task_body("slow"), HEADERS)
    assert cancelled.is_set() and status == 500


def test_lease_and_timeout_take_strings_like_delay() -> None:
    ex = asyncd.Executor()
    ex.register("long", lambda p: None, long_running=True, lease="30s")
    ex.register("timed", lambda p: None, timeout="1m 30s")
    assert ex._handlers["long"].lease == 30.0
    assert ex._handlers["timed"].timeout == 90.0
    with pytest.raises(ValueError):
        ex.register("bad", lambda p: None, long_running=True, lease="soon")
    with pytest.raises(ValueError):
        ex.register("bad", lambda p: None, timeout="0s")
