import asyncio
from datetime import datetime, timedelta, timezone

import pytest

import asyncd

SUBMITTED = {"id": "0193a", "eta": "2026-11-30T06:00:00.123Z", "route": "store", "duplicate": False}
TASK = {
    "id": "a", "type": "t", "payload": {"x": 1}, "state": "dead", "priority": 0,
    "eta": "2026-12-01T00:00:00.000Z", "attempt": 4, "max_retries": 3, "idempotency_key": "k",
    "unique_key": None, "depends_on": [], "last_error": "boom", "result": None,
    "created_at": "2026-11-30T00:00:00.000Z", "updated_at": "2026-11-30T00:00:01.000Z",
}


def test_submit_sends_contract_body(fake_api):
    fake_api.status, fake_api.body = 201, SUBMITTED
    c = asyncd.Client(fake_api.url + "/", service_name="orders")
    res = c.submit_delayed(
        "send_email", {"to": "a@b.c"}, delay=timedelta(minutes=90), idempotency_key="k1", unique_key="u1",
        priority=5, max_retries=0, timeout=1.5, depends_on=["0193x"],
    )
    assert res == asyncd.SubmitResult("0193a", datetime(2026, 11, 30, 6, 0, 0, 123000, tzinfo=timezone.utc), "store", False)
    r = fake_api.last()
    assert (r.method, r.path) == ("POST", "/v1/tasks")
    assert r.headers["asyncd-source-service"] == "orders"
    assert r.headers["content-type"] == "application/json"
    assert r.body == {
        "type": "send_email", "payload": {"to": "a@b.c"}, "delay": "1h 30m", "idempotency_key": "k1",
        "unique_key": "u1", "priority": 5, "max_retries": 0, "timeout": "1s 500ms", "depends_on": ["0193x"],
        "source_service": "orders",
    }


def test_submit_at_and_string_delay(fake_api):
    fake_api.status, fake_api.body = 201, SUBMITTED
    c = asyncd.Client(fake_api.url)
    c.submit_at("t", eta=datetime(2026, 12, 1, 8, 0, 0, 500000, tzinfo=timezone(timedelta(hours=8))), idempotency_key="k")
    assert fake_api.last().body == {"type": "t", "payload": None, "eta": "2026-12-01T00:00:00.500Z", "idempotency_key": "k"}
    assert "asyncd-source-service" not in fake_api.last().headers
    c.submit_delayed("t", 1, delay="3d", idempotency_key="k")
    assert fake_api.last().body["delay"] == "3d"
    c.submit("t", idempotency_key="k", delay=0)
    assert fake_api.last().body["delay"] == "0s"


def test_submit_sends_expiry(fake_api):
    """``expires_at`` goes out as UTC milliseconds, ``start_within`` as humantime (as
    ``delay`` is taken: timedelta, seconds or a string), each only when given; the
    status's ``expires_at`` is read back, None when the task never expires."""
    fake_api.status, fake_api.body = 201, SUBMITTED
    c = asyncd.Client(fake_api.url)
    c.submit("t", idempotency_key="k",
             expires_at=datetime(2026, 12, 1, 8, 30, 0, 250000, tzinfo=timezone(timedelta(hours=8))))
    assert fake_api.last().body == {"type": "t", "payload": None, "idempotency_key": "k",
                                    "expires_at": "2026-12-01T00:30:00.250Z"}
    for within, want in [(timedelta(seconds=90), "1m 30s"), (1.5, "1s 500ms"), ("10m", "10m")]:
        c.submit_delayed("t", idempotency_key="k", delay="1h", start_within=within)
        assert fake_api.last().body == {"type": "t", "payload": None, "idempotency_key": "k", "delay": "1h",
                                        "start_within": want}
    fake_api.body = {"results": [{"status": 201, **SUBMITTED}, {"status": 201, **SUBMITTED}]}
    c.submit_batch([asyncd.Task("t", idempotency_key="k1", start_within=600),
                    {"type": "t", "idempotency_key": "k2", "expires_at": datetime(2027, 1, 1, tzinfo=timezone.utc)}])
    tasks = fake_api.last().body["tasks"]
    assert (tasks[0]["start_within"], tasks[1]["expires_at"]) == ("10m", "2027-01-01T00:00:00.000Z")
    assert "expires_at" not in tasks[0] and "start_within" not in tasks[1]

    fake_api.status, fake_api.body = 200, {**TASK, "state": "expired", "expires_at": "2026-12-01T00:00:01.5Z"}
    st = c.get("a")
    assert (st.state, st.expires_at) == (asyncd.EXPIRED, datetime(2026, 12, 1, 0, 0, 1, 500000, tzinfo=timezone.utc))
    fake_api.body = TASK
    assert c.get("a").expires_at is None


def test_expiry_refusals_send_nothing(fake_api):
    """Both ``expires_at`` and ``start_within``, a naive ``expires_at`` or a negative
    ``start_within`` are refused before anything is sent, by each submit call."""
    c = asyncd.Client(fake_api.url)
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    with pytest.raises(ValueError, match="expires_at or a start_within, not both"):
        c.submit("t", idempotency_key="k", expires_at=later, start_within=60)
    with pytest.raises(ValueError, match="not both"):
        c.submit_delayed("t", idempotency_key="k", delay=1, expires_at=later, start_within="1m")
    with pytest.raises(ValueError, match="not both"):
        c.submit_batch([asyncd.Task("t", idempotency_key="k0"),
                        {"type": "t", "idempotency_key": "k", "expires_at": later, "start_within": 60}])
    with pytest.raises(ValueError, match="not both"):
        asyncio.run(asyncd.AsyncClient(fake_api.url, token_file=None).submit(
            "t", idempotency_key="k", expires_at=later, start_within=60))
    with pytest.raises(ValueError, match="expires_at must be timezone-aware"):
        c.submit("t", idempotency_key="k", expires_at=datetime(2030, 1, 1))
    with pytest.raises(ValueError, match="negative"):
        c.submit("t", idempotency_key="k", start_within=timedelta(seconds=-1))
    assert fake_api.requests == []


def test_client_side_refusals_send_nothing(fake_api):
    c = asyncd.Client(fake_api.url)
    with pytest.raises(asyncd.MissingIdempotencyKey):
        c.submit("t", {"a": 1})
    with pytest.raises(asyncd.MissingIdempotencyKey):
        c.submit("t", idempotency_key="")
    with pytest.raises(asyncd.MissingIdempotencyKey, match="task 1"):
        c.submit_batch([asyncd.Task("t", idempotency_key="k"), {"type": "t"}])
    with pytest.raises(ValueError, match="not both"):
        c.submit("t", idempotency_key="k", delay=1, eta=datetime.now(timezone.utc))
    with pytest.raises(ValueError, match="timezone-aware"):
        c.submit_at("t", idempotency_key="k", eta=datetime(2026, 1, 1))
    with pytest.raises(ValueError, match="negative"):
        c.submit_delayed("t", idempotency_key="k", delay=timedelta(seconds=-1))
    assert fake_api.requests == []
    # Refused before any connection: an unreachable endpoint still gives the key error.
    with pytest.raises(asyncd.MissingIdempotencyKey):
        asyncd.Client("http://127.0.0.1:1").submit("t")


@pytest.mark.parametrize(
    "status,error,cls,parents",
    [
        (400, {"code": "unknown_task_type", "message": "no job", "field": "type"}, asyncd.UnknownTaskType, ()),
        (400, {"code": "invalid_field", "message": "delay: must not be negative", "field": "delay"}, asyncd.InvalidField, ()),
        (400, {"code": "malformed_json", "message": "x"}, asyncd.MalformedJSON, ()),
        (413, {"code": "payload_too_large", "message": "x", "field": "payload"}, asyncd.PayloadTooLarge, ()),
        (404, {"code": "not_found", "message": "no task"}, asyncd.NotFound, ()),
        (409, {"code": "unique_conflict", "message": "held", "existing_id": "0193e"}, asyncd.UniqueConflict, (asyncd.Conflict,)),
        (409, {"code": "not_cancellable", "message": "running", "state": "running"}, asyncd.NotCancellable, (asyncd.Conflict,)),
        (409, {"code": "not_dead", "message": "x"}, asyncd.NotDead, (asyncd.Conflict,)),
        (409, {"code": "stale_lease", "message": "x"}, asyncd.StaleLease, (asyncd.Conflict,)),
        (418, {"code": "teapot", "message": "x"}, asyncd.APIError, ()),
    ],
)
def test_api_errors_are_typed(fake_api, status, error, cls, parents):
    fake_api.status, fake_api.body = status, {"error": error}
    c = asyncd.Client(fake_api.url)
    with pytest.raises(cls) as info:
        c.submit("t", idempotency_key="k")
    e = info.value
    assert type(e) is cls and all(isinstance(e, p) for p in parents + (asyncd.APIError, asyncd.AsyncdError))
    assert (e.status, e.code, e.message, e.field) == (status, error["code"], error["message"], error.get("field"))
    assert e.existing_id == error.get("existing_id") and e.state == error.get("state")
    assert error["code"] in str(e)


def test_state_beside_error_and_non_json_bodies(fake_api):
    fake_api.status, fake_api.body = 409, {"error": {"code": "not_cancellable", "message": "x"}, "state": "succeeded"}
    c = asyncd.Client(fake_api.url)
    with pytest.raises(asyncd.NotCancellable) as info:
        c.cancel("a")
    assert info.value.state == "succeeded"
    fake_api.status, fake_api.body = 502, b"<html>bad gateway</html>"
    with pytest.raises(asyncd.APIError) as info:
        c.get("a")
    assert (info.value.status, info.value.code) == (502, "http_error") and "bad gateway" in info.value.message


def test_transport_error():
    with pytest.raises(asyncd.TransportError):
        asyncd.Client("http://127.0.0.1:1", timeout=2).get("a")


def test_batch_get_dead_letters_redrive_cancel(fake_api):
    c = asyncd.Client(fake_api.url)
    fake_api.body = {"results": [
        {"status": 201, **SUBMITTED},
        {"status": 400, "error": {"code": "unknown_task_type", "message": "no job", "field": "type"}},
        {"status": 200, **SUBMITTED, "duplicate": True},
    ]}
    res = c.submit_batch([
        asyncd.Task("t", {"n": 1}, idempotency_key="k1", delay=60),
        {"type": "nope", "idempotency_key": "k2"},
        asyncd.Task("t", idempotency_key="k3", eta=datetime(2027, 1, 1, tzinfo=timezone.utc)),
    ])
    assert [r.status for r in res] == [201, 400, 200]
    assert res[0].ok and res[0].result.id == "0193a" and not res[0].result.duplicate
    assert not res[1].ok and isinstance(res[1].error, asyncd.UnknownTaskType) and res[1].error.field == "type"
    assert res[2].result.duplicate
    r = fake_api.last()
    assert r.path == "/v1/tasks:batch"
    assert [t["idempotency_key"] for t in r.body["tasks"]] == ["k1", "k2", "k3"]
    assert r.body["tasks"][0]["delay"] == "1m" and r.body["tasks"][2]["eta"] == "2027-01-01T00:00:00.000Z"

    fake_api.body = {"items": [TASK]}
    items = c.dead_letters(type="t", limit=5)
    assert fake_api.last().path == "/v1/dead-letters?type=t&limit=5"
    assert len(items) == 1
    it = items[0]
    assert (it.state, it.last_error, it.idempotency_key, it.unique_key, it.attempt, it.payload) == (
        "dead", "boom", "k", None, 4, {"x": 1})
    assert it.updated_at - it.created_at == timedelta(seconds=1)
    c.dead_letters()
    assert fake_api.last().path == "/v1/dead-letters"

    fake_api.body = TASK
    assert c.get("a/b").max_retries == 3
    assert (fake_api.last().method, fake_api.last().path) == ("GET", "/v1/tasks/a%2Fb")

    fake_api.body = {"id": "a", "state": "pending", "eta": "2026-12-01T00:00:00.000Z"}
    rd = c.redrive("a")
    assert (rd.id, rd.state, rd.eta.year) == ("a", "pending", 2026)
    assert (fake_api.last().method, fake_api.last().path) == ("POST", "/v1/dead-letters/a/redrive")

    fake_api.body = {"job": "j", "task_type": "t", "paused": True,
                     "paused_at": "2026-12-01T00:00:00.000Z", "paused_by_config": False}
    job = c.pause_job("j")
    assert (job.paused, job.paused_at.year, job.paused_by_config) == (True, 2026, False)
    assert (fake_api.last().method, fake_api.last().path) == ("POST", "/v1/jobs/j/pause")
    fake_api.body = {"job": "j", "task_type": "t", "paused": False, "paused_at": None,
                     "paused_by_config": False}
    assert c.resume_job("j").paused_at is None
    assert (fake_api.last().method, fake_api.last().path) == ("POST", "/v1/jobs/j/resume")

    fake_api.body = {"items": [TASK], "truncated": False, "next_cursor": "c2"}
    page = c.search(job="j", state=asyncd.DEAD, created_after=datetime(2026, 12, 1, tzinfo=timezone.utc),
                    limit=2, cursor="c1")
    assert (len(page.items), page.items[0].id, page.next_cursor, page.truncated) == (1, "a", "c2", False)
    assert fake_api.last().path == ("/v1/tasks?job=j&state=dead&limit=2&cursor=c1"
                                    "&created_after=2026-12-01T00%3A00%3A00.000Z")

    fake_api.body = {"matched": 3, "affected": 2, "skipped": 0, "remaining": 1, "dry_run": False,
                     "dead_before": "2026-12-01T00:00:00.000Z"}
    bulk = c.redrive_dead_letters(job="j", error_prefix="boom", limit=2)
    assert (bulk.affected, bulk.remaining, bulk.dead_before.year) == (2, 1, 2026)
    assert (fake_api.last().method, fake_api.last().path, fake_api.last().body) == (
        "POST", "/v1/dead-letters/redrive", {"job": "j", "error_prefix": "boom", "limit": 2})
    c.purge_dead_letters(type="t", dead_before=bulk.dead_before)
    assert (fake_api.last().path, fake_api.last().body) == (
        "/v1/dead-letters/purge", {"type": "t", "dead_before": "2026-12-01T00:00:00.000Z"})

    fake_api.body = {"id": "a", "state": "cancelled"}
    assert c.cancel("a") is None
    assert (fake_api.last().method, fake_api.last().path) == ("DELETE", "/v1/tasks/a")
    assert c.cancel("a/b", job="j 1") is None
    assert (fake_api.last().method, fake_api.last().path) == ("DELETE", "/v1/tasks/a%2Fb?job=j+1")

    fake_api.body = {"id": "b", "state": "cancelled"}
    assert c.cancel_unique("j 1", "order:7") == asyncd.CancelResult(id="b", state=asyncd.CANCELLED)
    assert (fake_api.last().method, fake_api.last().path) == ("DELETE", "/v1/tasks?job=j+1&unique_key=order%3A7")

    fake_api.status, fake_api.body = 201, {"id": "t1", "job": "j", "entry": "nightly", "type": "report",
                                           "eta": "2026-11-30T06:00:00.000Z"}
    fired = c.trigger_cron("j", "night ly")
    assert (fired.id, fired.job, fired.entry, fired.type) == ("t1", "j", "nightly", "report")
    assert fired.eta == datetime(2026, 11, 30, 6, tzinfo=timezone.utc)
    assert (fake_api.last().method, fake_api.last().path) == ("POST", "/v1/jobs/j/cron/night%20ly/trigger")
    fake_api.status, fake_api.body = 404, {"error": {"code": "not_found", "message": "no entry x", "field": "entry"}}
    with pytest.raises(asyncd.NotFound) as info:
        c.trigger_cron("j", "x")
    assert info.value.field == "entry"


def test_async_client_cancel_in_job_cancel_unique_and_trigger_cron(fake_api):
    """The AsyncClient sends the same requests as the Client's."""
    c = asyncd.AsyncClient(fake_api.url, token_file=None)

    async def main():
        fake_api.body = {"id": "a", "state": "cancelled"}
        await c.cancel("a", job="j")
        cancel_path = fake_api.last().path
        fake_api.body = {"id": "b", "state": "cancelled"}
        by_key = await c.cancel_unique("j", "k")
        unique_path = fake_api.last().path
        fake_api.status, fake_api.body = 201, {"id": "t1", "job": "j", "entry": "e", "type": "t",
                                               "eta": "2026-11-30T06:00:00.000Z"}
        fired = await c.trigger_cron("j", "e")
        return cancel_path, by_key, unique_path, fired, fake_api.last().path

    cancel_path, by_key, unique_path, fired, trigger_path = asyncio.run(main())
    assert cancel_path == "/v1/tasks/a?job=j"
    assert (by_key.id, unique_path) == ("b", "/v1/tasks?job=j&unique_key=k")
    assert (fired.id, trigger_path) == ("t1", "/v1/jobs/j/cron/e/trigger")


def test_change_in_job(fake_api):
    """``change_in_job`` names the job in the query (escaped) and sends :meth:`change`'s
    body: a 202 is the change recorded for a task not consumed yet, a 200 the stored task
    changed. The AsyncClient does the same."""
    c = asyncd.Client(fake_api.url)
    fake_api.status, fake_api.body = 202, {"id": "a/b", "job": "j 1", "type": "t", "consumed": False}
    res = c.change_in_job("j 1&x=y", "a/b", payload={"v": 2}, priority=5)
    assert res == asyncd.PendingChange(id="a/b", job="j 1", type="t", consumed=False)
    r = fake_api.last()
    assert (r.method, r.path, r.body) == ("PATCH", "/v1/tasks/a%2Fb?job=j+1%26x%3Dy", {"payload": {"v": 2}, "priority": 5})

    fake_api.status, fake_api.body = 200, {**TASK, "state": "pending", "priority": 5}
    res = c.change_in_job("j", "a", run_now=True)
    assert isinstance(res, asyncd.TaskStatus) and (res.id, res.priority, res.state) == ("a", 5, asyncd.PENDING)
    assert (fake_api.last().path, fake_api.last().body) == ("/v1/tasks/a?job=j", {"run_now": True})

    fake_api.status, fake_api.body = 400, {"error": {"code": "invalid_field", "message": "keys from the payload",
                                                     "field": "payload"}}
    with pytest.raises(asyncd.InvalidField) as info:
        c.change_in_job("j", "a", payload=1)
    assert info.value.field == "payload"

    sent = len(fake_api.requests)
    with pytest.raises(ValueError):
        c.change_in_job("j", "a", delay=60, eta=datetime(2027, 1, 1, tzinfo=timezone.utc))
    with pytest.raises(ValueError):
        c.change_in_job("", "a", run_now=True)
    assert len(fake_api.requests) == sent, "nothing may be sent"

    fake_api.status, fake_api.body = 202, {"id": "a", "job": "j", "type": "t", "consumed": False}
    pending = asyncio.run(asyncd.AsyncClient(fake_api.url, token_file=None).change_in_job("j", "a", delay=60))
    assert pending == asyncd.PendingChange(id="a", job="j", type="t")
    assert (fake_api.last().path, fake_api.last().body) == ("/v1/tasks/a?job=j", {"delay": "1m"})


@pytest.mark.parametrize(
    "value,want",
    [
        (timedelta(seconds=90), "1m 30s"),
        (timedelta(days=3), "3d"),
        (timedelta(days=400), "400d"),
        (timedelta(hours=1, milliseconds=500), "1h 500ms"),
        (timedelta(microseconds=1500), "1ms 500us"),
        (timedelta(days=1, hours=2, minutes=3, seconds=4), "1d 2h 3m 4s"),
        (0.25, "250ms"),
        (0, "0s"),
        ("1h 30m", "1h 30m"),
    ],
)
def test_format_duration(value, want):
    assert asyncd.format_duration(value) == want


@pytest.mark.parametrize("text,seconds", [("90s", 90), ("1h 30m", 5400), ("500ms", 0.5), ("3d", 259200),
                                          ("2min 5secs", 125), ("1m30s", 90)])
def test_parse_duration(text, seconds):
    assert asyncd.parse_duration(text).total_seconds() == seconds


@pytest.mark.parametrize("text", ["", "5", "5 parsecs", "-5s", "1.5s"])
def test_parse_duration_refuses(text):
    with pytest.raises(ValueError):
        asyncd.parse_duration(text)
