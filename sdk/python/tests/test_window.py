"""Debounce and throttle on the wire (the integration tests check them against the server)."""

import asyncio
from datetime import datetime, timedelta, timezone

import pytest

import asyncd

SUBMITTED = {"id": "n", "eta": "2026-12-01T00:00:30.000Z", "route": "store", "duplicate": False}


def test_submit_sends_debounce_and_throttle(fake_api):
    """``debounce`` and ``throttle`` go out as the body's objects of those names, periods
    in humantime as ``delay`` is taken (timedelta, seconds or a string), the mode and
    ``on_limit`` always named; a submit with neither carries neither."""
    fake_api.status, fake_api.body = 201, SUBMITTED
    c = asyncd.Client(fake_api.url)
    base = {"type": "t", "payload": None, "idempotency_key": "k"}
    cases = [
        ({"debounce": asyncd.Debounce("user:7", timedelta(seconds=30), max_delay="5m")},
         {"debounce": {"key": "user:7", "period": "30s", "max_delay": "5m", "mode": "trailing"}}),
        ({"debounce": asyncd.Debounce("user:8", 1.5, mode=asyncd.LEADING)},
         {"debounce": {"key": "user:8", "period": "1s 500ms", "mode": "leading"}}),
        ({"throttle": asyncd.Throttle("user:9", 60)},
         {"throttle": {"key": "user:9", "period": "1m", "on_limit": "refuse"}}),
        ({"throttle": asyncd.Throttle("user:9", "1h", on_limit=asyncd.DROP)},
         {"throttle": {"key": "user:9", "period": "1h", "on_limit": "drop"}}),
        ({}, {}),
    ]
    for kwargs, want in cases:
        c.submit("t", idempotency_key="k", **kwargs)
        assert fake_api.last().body == {**base, **want}, kwargs

    fake_api.body = {"results": [{"status": 201, **SUBMITTED}] * 3}
    c.submit_batch([
        asyncd.Task("t", idempotency_key="k1", throttle=asyncd.Throttle("x", 1)),
        {"type": "t", "idempotency_key": "k2", "debounce": {"key": "y", "period": 90, "max_delay": 600}},
        {"type": "t", "idempotency_key": "k3"},
    ])
    tasks = fake_api.last().body["tasks"]
    assert tasks[0]["throttle"] == {"key": "x", "period": "1s", "on_limit": "refuse"}
    assert tasks[1]["debounce"] == {"key": "y", "period": "1m 30s", "max_delay": "10m", "mode": "trailing"}
    assert [k for t in tasks for k in ("debounce", "throttle") if k in t] == ["throttle", "debounce"]


def test_submit_result_reads_debounced_and_dropped(fake_api):
    """The answers' ``debounced`` and ``dropped`` land in :class:`SubmitResult`, alone
    and per batch item; an answer without them reads False. A 409 ``throttled`` item is
    :class:`asyncd.Throttled`."""
    c = asyncd.Client(fake_api.url)
    deb = asyncd.Debounce("u", 30)
    fake_api.status, fake_api.body = 200, {**SUBMITTED, "id": "w", "debounced": True}
    res = c.submit("t", idempotency_key="k", debounce=deb)
    assert (res.id, res.debounced, res.dropped, res.duplicate) == ("w", True, False, False)
    assert res.eta == datetime(2026, 12, 1, 0, 0, 30, tzinfo=timezone.utc)
    fake_api.body = {**SUBMITTED, "id": "s", "dropped": True}
    res = c.submit("t", idempotency_key="k", debounce=deb)
    assert (res.id, res.debounced, res.dropped) == ("s", False, True)
    fake_api.status, fake_api.body = 201, SUBMITTED
    res = c.submit("t", idempotency_key="k", debounce=deb)
    assert (res.id, res.debounced, res.dropped) == ("n", False, False)

    fake_api.status, fake_api.body = 200, {"results": [
        {"status": 201, **SUBMITTED},
        {"status": 200, **SUBMITTED, "debounced": True},
        {"status": 200, **SUBMITTED, "id": "m", "dropped": True},
        {"status": 409, "error": {"code": "throttled", "message": "window open", "field": "throttle",
                                  "existing_id": "m"}},
    ]}
    items = c.submit_batch([asyncd.Task("t", idempotency_key=f"k{i}") for i in range(4)])
    assert [(i.status, i.result.debounced, i.result.dropped) for i in items[:3]] == [
        (201, False, False), (200, True, False), (200, False, True)]
    err = items[3].error
    assert type(err) is asyncd.Throttled
    assert (err.status, err.existing_id, err.field) == (409, "m", "throttle")


def test_throttled_error(fake_api):
    """A 409 ``throttled`` raises :class:`asyncd.Throttled` (a :class:`asyncd.Conflict`),
    naming the key's task; not retryable: the same submit is refused until the window
    closes."""
    fake_api.status = 409
    fake_api.body = {"error": {"code": "throttled", "field": "throttle", "existing_id": "0193e",
                               "message": "throttle: task 0193e was stored under this key within the throttle's period"}}
    c = asyncd.Client(fake_api.url)
    with pytest.raises(asyncd.Throttled) as info:
        c.submit("t", idempotency_key="k", throttle=asyncd.Throttle("user:7", 60))
    e = info.value
    assert isinstance(e, asyncd.Conflict) and not isinstance(e, asyncd.UniqueConflict)
    assert (e.status, e.code, e.field, e.existing_id, e.retryable, asyncd.is_retryable(e)) == (
        409, "throttled", "throttle", "0193e", False, False)


def test_debounce_with_throttle_sends_nothing(fake_api):
    """A submit with both a debounce and a throttle is refused before anything is sent
    (the server would refuse it too, naming throttle), by each submit call; so is a
    debounce that is neither a :class:`asyncd.Debounce` nor a mapping."""
    c = asyncd.Client(fake_api.url)
    deb, thr = asyncd.Debounce("u", 1), asyncd.Throttle("u", 1)
    with pytest.raises(ValueError, match="a debounce or a throttle, not both"):
        c.submit("t", idempotency_key="k", debounce=deb, throttle=thr)
    with pytest.raises(ValueError, match="not both"):
        c.submit_delayed("t", idempotency_key="k", delay=1, debounce=deb, throttle=thr)
    with pytest.raises(ValueError, match="not both"):
        c.submit_batch([asyncd.Task("t", idempotency_key="k0"),
                        {"type": "t", "idempotency_key": "k", "debounce": {"key": "u", "period": 1},
                         "throttle": {"key": "u", "period": 1}}])
    with pytest.raises(ValueError, match="not both"):
        asyncio.run(asyncd.AsyncClient(fake_api.url, token_file=None).submit(
            "t", idempotency_key="k", debounce=deb, throttle=thr))
    with pytest.raises(TypeError, match="debounce must be an asyncd.Debounce or a mapping"):
        c.submit("t", idempotency_key="k", debounce=("u", 1))  # type: ignore[arg-type]
    assert fake_api.requests == []
