"""Schedules (/v1/schedules) against the recording fake API: what each call sends and how
its answer and errors are read."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone
from typing import Any, Dict, List
from urllib.parse import parse_qs, urlsplit

import pytest

import asyncd
from fakeapi import FakeAPI, Recorded

ANSWER: Dict[str, Any] = {
    "job": "send-email", "name": "weekly-42", "type": "email", "source": "api", "every": "15m",
    "payload": {"customer": 42}, "priority": 3, "overlap": "Skip", "catch_up": "0s", "jitter": "1m 30s",
    "start_at": "2026-11-30T07:45:00.000Z", "end_at": "2027-01-01T00:00:00.000Z", "paused": False,
    "next_firing": "2026-11-30T08:00:00.123Z", "last_firing": None, "last_task_id": None, "buffered_firing": None,
    "fired": 0, "created_at": "2026-11-29T07:45:00.000Z", "updated_at": "2026-11-29T07:45:00.000Z",
}
UTC8 = timezone(timedelta(hours=8))


def client(fake_api: FakeAPI, **kwargs: Any) -> asyncd.Client:
    return asyncd.Client(fake_api.url, token_file=None, **kwargs)


def test_create_schedule_sends_the_spec_and_reads_the_schedule(fake_api: FakeAPI) -> None:
    fake_api.status, fake_api.body = 201, ANSWER
    s = client(fake_api).create_schedule(
        "send-email", "weekly-42", every=timedelta(minutes=15), payload={"customer": 42}, priority=3,
        overlap=asyncd.SKIP, catch_up=0, start_at=datetime(2026, 11, 30, 15, 45, tzinfo=UTC8),
        end_at=datetime(2027, 1, 1, 8, 0, 0, 500000, tzinfo=UTC8), jitter="1m 30s", paused=False)
    r = fake_api.last()
    assert (r.method, r.path, r.headers["content-type"]) == ("POST", "/v1/schedules", "application/json")
    assert r.body == {
        "job": "send-email", "name": "weekly-42", "every": "15m", "payload": {"customer": 42}, "priority": 3,
        "overlap": "Skip", "catch_up": "0s", "start_at": "2026-11-30T07:45:00.000Z",
        "end_at": "2027-01-01T00:00:00.500Z", "jitter": "1m 30s", "paused": False,
    }
    assert isinstance(s, asyncd.Schedule)
    assert (s.every, s.cron, s.priority, s.overlap, s.catch_up, s.jitter, s.last_firing, s.last_task_id, s.fired) == (
        "15m", None, 3, "Skip", "0s", "1m 30s", None, None, 0)
    assert s.start_at == datetime(2026, 11, 30, 7, 45, tzinfo=timezone.utc)
    assert s.payload == {"customer": 42} and s.raw == ANSWER

    # A bare spec sends only what it sets, and the payload.
    client(fake_api).create_schedule("j", "n", cron="CRON_TZ=UTC 0 * * * *")
    assert fake_api.last().body == {"job": "j", "name": "n", "cron": "CRON_TZ=UTC 0 * * * *", "payload": None}


def test_naive_datetimes_are_refused_before_sending(fake_api: FakeAPI) -> None:
    c = client(fake_api)
    with pytest.raises(ValueError, match="start_at"):
        c.create_schedule("j", "n", every="1h", start_at=datetime(2026, 1, 1))
    with pytest.raises(ValueError, match="to"):
        c.backfill_schedule("j", "n", datetime(2026, 1, 1, tzinfo=timezone.utc), datetime(2026, 1, 2))
    with pytest.raises(ValueError, match="at least one"):
        c.change_schedule("j", "n")
    assert fake_api.requests == []


def test_put_schedule_escapes_the_path_and_says_whether_it_created(fake_api: FakeAPI) -> None:
    fake_api.status, fake_api.body = 201, ANSWER
    s, created = client(fake_api).put_schedule("send email", "customer/42 ü", every=3600, paused=True)
    r = fake_api.last()
    assert (r.method, r.path) == ("PUT", "/v1/schedules/send%20email/customer%2F42%20%C3%BC")
    assert r.body == {"every": "1h", "payload": None, "paused": True}
    assert created and s.name == "weekly-42"
    fake_api.status = 200
    assert client(fake_api).put_schedule("j", "n", every="1h")[1] is False


def test_put_schedule_created_under_retry(fake_api: FakeAPI) -> None:
    answers: List[Any] = [(503, {"error": {"code": "store_unavailable", "message": "m"}}), (201, ANSWER)]
    fake_api.route = lambda rec: answers.pop(0)
    c = client(fake_api, retry=asyncd.RetryPolicy(max_attempts=3, initial_backoff=0.001, max_backoff=0.001))
    _, created = c.put_schedule("j", "n", every="1h")
    assert created and len(fake_api.requests) == 2


def test_schedule_calls_send_their_method_and_path(fake_api: FakeAPI) -> None:
    fake_api.body = ANSWER
    c = client(fake_api)
    for call, method, path in [
        (lambda: c.get_schedule("a/b", "c"), "GET", "/v1/schedules/a%2Fb/c"),
        (lambda: c.pause_schedule("j", "n:1@x"), "POST", "/v1/schedules/j/n%3A1%40x/pause"),
        (lambda: c.resume_schedule("j", "n"), "POST", "/v1/schedules/j/n/resume"),
        (lambda: c.change_schedule("j", "n?", priority=1), "PATCH", "/v1/schedules/j/n%3F"),
    ]:
        assert isinstance(call(), asyncd.Schedule)
        r = fake_api.last()
        assert (r.method, r.path) == (method, path)
    c.pause_schedule("j", "n")
    assert fake_api.last().body is None and "content-type" not in fake_api.last().headers

    fake_api.status, fake_api.body = 204, b""
    assert c.delete_schedule("j", "n 1") is None
    assert (fake_api.last().method, fake_api.last().path) == ("DELETE", "/v1/schedules/j/n%201")

    fake_api.status, fake_api.body = 201, {"id": "0193a", "job": "j", "entry": "n", "type": "t",
                                           "eta": "2026-11-30T08:00:00.123Z"}
    fired = c.trigger_schedule("j", "n")
    assert (fake_api.last().method, fake_api.last().path) == ("POST", "/v1/schedules/j/n/trigger")
    assert fired == asyncd.CronTrigger(id="0193a", job="j", entry="n", type="t",
                                       eta=datetime(2026, 11, 30, 8, 0, 0, 123000, tzinfo=timezone.utc))

    fake_api.status, fake_api.body = 200, {"firings": 7, "created": 6}
    utc5 = timezone(timedelta(hours=-5))
    res = c.backfill_schedule("j", "n", datetime(2026, 11, 23, 2, 45, tzinfo=utc5),
                              datetime(2026, 11, 30, 2, 45, 0, 1000, tzinfo=utc5))
    r = fake_api.last()
    assert (r.method, r.path, r.body) == ("POST", "/v1/schedules/j/n/backfill",
                                          {"from": "2026-11-23T07:45:00.000Z", "to": "2026-11-30T07:45:00.001Z"})
    assert res == asyncd.BackfillResult(firings=7, created=6)


def test_change_schedule_sends_the_members_given(fake_api: FakeAPI) -> None:
    fake_api.body = ANSWER
    client(fake_api).change_schedule(
        "j", "n", every=timedelta(minutes=15), catch_up=0, jitter=None, end_at=None, priority=5,
        start_at=datetime(2026, 12, 1, 9, tzinfo=timezone(timedelta(hours=1))), overlap=asyncd.CANCEL_OTHER,
        payload={"a": [1]})
    r = fake_api.last()
    assert r.method == "PATCH"
    assert r.body == {"every": "15m", "catch_up": "0s", "jitter": None, "end_at": None, "priority": 5,
                      "start_at": "2026-12-01T08:00:00.000Z", "overlap": "CancelOther", "payload": {"a": [1]}}


def _pages(rec: Recorded, names: List[str]) -> Any:
    """A server answering in pages of at most two, by name after the cursor."""
    q = {k: v[0] for k, v in parse_qs(urlsplit(rec.path).query).items()}
    limit = min(int(q.get("limit", 100)), 2)
    items = [dict(ANSWER, job=q["job"], name=n) for n in names if n > q.get("cursor", "")][:limit]
    page: Dict[str, Any] = {"items": items}
    if len(items) == limit:
        page["next_cursor"] = items[-1]["name"]
    return 200, page


def test_list_and_iter_schedules(fake_api: FakeAPI) -> None:
    names = ["a", "b", "c", "d", "e"]
    fake_api.route = lambda rec: _pages(rec, names)
    c = client(fake_api)
    page = c.list_schedules("my job")
    assert ([s.name for s in page.items], page.next_cursor) == (["a", "b"], "b")
    assert page.items[0].job == "my job"
    assert parse_qs(urlsplit(fake_api.last().path).query) == {"job": ["my job"]}
    c.list_schedules("j", cursor="b", limit=2)
    assert parse_qs(urlsplit(fake_api.last().path).query) == {"job": ["j"], "cursor": ["b"], "limit": ["2"]}

    fake_api.requests.clear()
    assert [s.name for s in c.iter_schedules("j")] == names
    queries = [parse_qs(urlsplit(r.path).query) for r in fake_api.requests]
    assert len(queries) == 3 and queries[0]["limit"] == [str(asyncd.MAX_SCHEDULE_PAGE)] and queries[2]["cursor"] == ["d"]

    async def collect() -> List[str]:
        ac = asyncd.AsyncClient(fake_api.url, token_file=None)
        return [s.name async for s in ac.iter_schedules("j", page_size=2)]

    assert asyncio.run(collect()) == names


def test_schedule_errors_are_their_classes(fake_api: FakeAPI) -> None:
    c = client(fake_api)
    fake_api.status = 409
    fake_api.body = {"error": {"code": "schedule_exists", "message": "name: job j already has a schedule named n",
                               "field": "name"}}
    with pytest.raises(asyncd.ScheduleExists) as exists:
        c.create_schedule("j", "n", every="1h")
    assert (exists.value.status, exists.value.field, exists.value.retryable) == (409, "name", False)
    assert isinstance(exists.value, asyncd.Conflict)
    fake_api.body = {"error": {"code": "schedule_read_only", "message": "schedule nightly of job j is its config's "
                                                                      "spec.cron entry: change the config"}}
    for call in (lambda: c.change_schedule("j", "nightly", paused=True), lambda: c.pause_schedule("j", "nightly"),
                 lambda: c.delete_schedule("j", "nightly"), lambda: c.put_schedule("j", "nightly", every="1h")):
        with pytest.raises(asyncd.ScheduleReadOnly) as read_only:
            call()
        assert not read_only.value.retryable
    fake_api.status, fake_api.body = 404, {"error": {"code": "not_found", "message": "m", "field": "name"}}
    with pytest.raises(asyncd.NotFound) as missing:
        c.get_schedule("j", "x")
    assert missing.value.field == "name"


def test_async_client_schedule_calls(fake_api: FakeAPI) -> None:
    fake_api.status, fake_api.body = 201, ANSWER

    async def main() -> None:
        ac = asyncd.AsyncClient(fake_api.url, token_file=None)
        s, created = await ac.put_schedule("j", "n", every="15m")
        assert created and s.every == "15m"
        assert (fake_api.last().method, fake_api.last().path) == ("PUT", "/v1/schedules/j/n")
        assert (await ac.create_schedule("j", "n", cron="CRON_TZ=UTC 0 * * * *")).name == "weekly-42"
        assert (await ac.get_schedule("j", "n")).name == "weekly-42"
        assert (await ac.change_schedule("j", "n", priority=2)).name == "weekly-42"
        assert fake_api.last().body == {"priority": 2}
        assert (await ac.pause_schedule("j", "n")).name == "weekly-42"
        assert (await ac.resume_schedule("j", "n")).name == "weekly-42"
        fake_api.body = {"items": [ANSWER]}
        assert [i.name for i in (await ac.list_schedules("j", limit=5)).items] == ["weekly-42"]
        fake_api.body = {"firings": 2, "created": 2}
        now = datetime.now(timezone.utc)
        assert await ac.backfill_schedule("j", "n", now - timedelta(hours=2), now) == asyncd.BackfillResult(2, 2)
        fake_api.body = {"id": "a", "job": "j", "entry": "n", "type": "t", "eta": "2026-11-30T08:00:00Z"}
        assert (await ac.trigger_schedule("j", "n")).id == "a"
        fake_api.status, fake_api.body = 204, b""
        assert await ac.delete_schedule("j", "n") is None
        assert fake_api.last().method == "DELETE"

    asyncio.run(main())
