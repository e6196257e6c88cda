"""The wire shapes of the asyncd-contract crate (contract/fixtures, generated from the
Rust types the server uses): this SDK must write the request bodies and read the
answers exactly as they are there, and its signing must reproduce the test vector."""

import json
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

import asyncd
from asyncd._errors import error_from_body
from asyncd._executor import sign, verify_signature
from asyncd._time import format_duration, parse_duration, parse_time

FIXTURES = Path(__file__).resolve().parents[3] / "contract" / "fixtures"


def fixture(name: str) -> Any:
    return json.loads((FIXTURES / f"{name}.json").read_text(encoding="utf-8"))


def task_from(body: dict) -> asyncd.Task:
    """The Task whose submit body is ``body``."""
    return asyncd.Task(
        type=body["type"], payload=body["payload"], delay=body.get("delay"), priority=body.get("priority"),
        idempotency_key=body["idempotency_key"], unique_key=body.get("unique_key"),
        max_retries=body.get("max_retries"), timeout=body.get("timeout"), depends_on=body.get("depends_on") or [],
        expires_at=parse_time(body["expires_at"]) if "expires_at" in body else None,
        start_within=body.get("start_within"),
    )


def client(body: dict) -> asyncd.Client:
    return asyncd.Client("http://127.0.0.1:1", service_name=body.get("source_service"))


def test_submit_bodies_are_the_contracts():
    want = fixture("submit_request")
    assert client(want)._body(task_from(want)) == want
    batch = fixture("batch_request")
    assert {"tasks": [client(t)._body(task_from(t)) for t in batch["tasks"]]} == batch


def test_submit_body_from_typed_values():
    """submit_request.json's body from the values a caller holds (timedelta durations):
    the SDK writes them in its own humantime units, which the server reads as the same
    spans."""
    want = fixture("submit_request")
    assert (want["delay"], want["timeout"], want["start_within"]) == ("90s", "30s", "10m")
    task = task_from(want)
    task.delay, task.timeout, task.start_within = (timedelta(seconds=90), timedelta(seconds=30),
                                                   timedelta(minutes=10))
    assert client(want)._body(task) == {**want, "delay": "1m 30s"}


@pytest.mark.parametrize("name", ["heartbeat_request", "executor_accepted", "result_request"])
def test_durations_are_written_as_the_contract_writes_them(name):
    body = fixture(name)
    for key in ("lease", "retry_after"):
        if key in body:
            assert format_duration(parse_duration(body[key])) == body[key]
            assert format_duration(timedelta(seconds=parse_duration(body[key]).total_seconds())) == body[key]


def test_answers_decode():
    sub = fixture("submit_response")
    res = asyncd.SubmitResult.from_json(sub)
    assert (res.id, res.eta, res.route, res.duplicate) == (sub["id"], parse_time(sub["eta"]), sub["route"], sub["duplicate"])
    assert (res.debounced, res.dropped) == (False, False)
    # A submit a trailing debounce folded into its key's waiting task.
    deb = fixture("submit_response_debounced")
    res = asyncd.SubmitResult.from_json(deb)
    assert deb["debounced"] is True and "dropped" not in deb
    assert (res.id, res.eta, res.route, res.duplicate, res.debounced, res.dropped) == (
        deb["id"], parse_time(deb["eta"]), deb["route"], False, True, False)

    for d in [fixture("task_status"), *fixture("dead_letters_response")["items"]]:
        st = asyncd.TaskStatus.from_json(d)
        for key, value in d.items():
            if key in ("eta", "created_at", "updated_at", "expires_at"):
                assert getattr(st, key) == parse_time(value), key
            elif key != "lease_until":  # TaskStatus does not carry it
                assert getattr(st, key) == value, key

    assert asyncd.TaskStatus.from_json(fixture("task_status")).expires_at == datetime(
        2026, 11, 30, 8, 10, 0, 123000, tzinfo=timezone.utc)
    assert asyncd.TaskStatus.from_json({"id": "a", "expires_at": None}).expires_at is None

    for item, want in zip(fixture("batch_response")["results"], [201, 400]):
        assert item["status"] == want

    pending = fixture("change_pending_response")
    res = asyncd.PendingChange.from_json(pending)
    assert res == asyncd.PendingChange(id="0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", job="send-email", type="email",
                                       consumed=False)
    assert res.to_json() == pending


def test_errors_decode():
    codes = set()
    for case in fixture("errors"):
        e = error_from_body(case["status"], case["body"])
        err = case["body"]["error"]
        assert (e.status, e.code, e.message, e.field, e.existing_id, e.state) == (
            case["status"], err["code"], err["message"], err.get("field"), err.get("existing_id"), err.get("state"),
        )
        assert isinstance(e, asyncd.APIError)
        # Every code the contract sends has its own class.
        assert type(e) is not asyncd.APIError, err["code"]
        codes.add(e.code)
    assert len(codes) == len(fixture("errors"))
    throttled = [error_from_body(c["status"], c["body"]) for c in fixture("errors")
                 if c["body"]["error"]["code"] == "throttled"]
    assert len(throttled) == 1
    e = throttled[0]
    assert type(e) is asyncd.Throttled and isinstance(e, asyncd.Conflict)
    assert (e.status, e.field, e.existing_id, e.retryable) == (409, "throttle", "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", False)


def test_schedule_bodies_are_the_contracts():
    """The bodies create_schedule, put_schedule and backfill_schedule send for the values
    of schedule_create_request.json and backfill_request.json are those fixtures."""
    from asyncd._client import _schedule_spec

    want = fixture("schedule_create_request")
    spec = {k: v for k, v in want.items() if k not in ("job", "name")}
    spec["start_at"] = parse_time(spec["start_at"])
    assert _schedule_spec(**spec) == {k: v for k, v in want.items() if k not in ("job", "name")}
    # From typed values: timedeltas in the SDK's humantime units, a datetime in any zone.
    typed = dict(spec, catch_up=timedelta(hours=1), jitter=timedelta(minutes=5),
                 start_at=parse_time(want["start_at"]).astimezone(timezone(timedelta(hours=1))))
    assert {"job": want["job"], "name": want["name"], **_schedule_spec(**typed)} == want
    assert _schedule_spec(every=timedelta(seconds=90)) == {"every": "1m 30s", "payload": None}


def test_schedule_calls_send_the_contracts_bodies(fake_api):
    """Through the client: the create body is schedule_create_request.json, the backfill
    body backfill_request.json."""
    create = fixture("schedule_create_request")
    fake_api.status, fake_api.body = 201, fixture("schedule_response")
    c = asyncd.Client(fake_api.url, token_file=None)
    spec = {k: v for k, v in create.items() if k not in ("job", "name")}
    c.create_schedule(create["job"], create["name"], **dict(spec, start_at=parse_time(spec["start_at"])))
    assert fake_api.last().body == create
    backfill = fixture("backfill_request")
    fake_api.status, fake_api.body = 200, fixture("backfill_response")
    res = c.backfill_schedule("send-email", "weekly-42", parse_time(backfill["from"]), parse_time(backfill["to"]))
    assert fake_api.last().body == backfill
    assert res.to_json() == fixture("backfill_response")


def test_schedule_answers_decode_and_encode_back():
    want = fixture("schedule_response")
    s = asyncd.Schedule.from_json(want)
    assert s.to_json() == want
    assert (s.job, s.name, s.type, s.source, s.cron, s.every, s.priority, s.overlap, s.catch_up, s.jitter, s.paused,
            s.fired, s.last_task_id, s.buffered_firing, s.end_at) == (
        "send-email", "weekly-42", "email", asyncd.SOURCE_API, "CRON_TZ=Europe/Berlin 0 9 * * MON", None, 3,
        asyncd.BUFFER_ONE, "1h", "5m", False, 12, "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", None, None)
    assert s.payload == {"customer": 42, "week_of": "{{scheduled_at}}"}
    assert s.next_firing == datetime(2026, 11, 30, 8, 0, 0, 123000, tzinfo=timezone.utc)
    assert (s.start_at, s.last_firing) == (parse_time(want["start_at"]), parse_time(want["last_firing"]))
    assert (s.created_at, s.updated_at) == (parse_time(want["created_at"]), parse_time(want["updated_at"]))

    page = fixture("schedules_response")
    p = asyncd.SchedulePage.from_json(page)
    assert p.to_json() == page
    assert (p.next_cursor, p.items) == ("weekly-42", [s])

    res = asyncd.BackfillResult.from_json(fixture("backfill_response"))
    assert (res.firings, res.created) == (7, 6)
    assert res.to_json() == fixture("backfill_response")


def test_schedule_errors_decode():
    by_code = {c["body"]["error"]["code"]: error_from_body(c["status"], c["body"]) for c in fixture("errors")}
    exists, read_only = by_code["schedule_exists"], by_code["schedule_read_only"]
    assert type(exists) is asyncd.ScheduleExists and isinstance(exists, asyncd.Conflict)
    assert (exists.status, exists.field, exists.retryable) == (409, "name", False)
    assert type(read_only) is asyncd.ScheduleReadOnly and isinstance(read_only, asyncd.Conflict)
    assert (read_only.status, read_only.retryable) == (409, False)


def test_executor_call_is_read_into_the_context():
    call = fixture("executor_call")
    ctx = asyncd.Executor()._context({}, call)
    assert (ctx.id, ctx.type, ctx.attempt, ctx.eta) == (call["id"], call["type"], call["attempt"], parse_time(call["eta"]))


def _outcome(verifier, step):
    try:
        verifier.verify(step["headers"], step["body"].encode(), now=step["now"])
    except asyncd.Replayed:
        return "replay"
    except asyncd.StaleTimestamp:
        return "stale"
    except asyncd.MalformedTimestamp:
        return "malformed_timestamp"
    except asyncd.BadSignature:
        return "mismatch"
    return "ok"


def test_signature_vectors():
    v = fixture("signature")
    assert v["tolerance_seconds"] == asyncd.SIGNATURE_TOLERANCE.total_seconds()
    assert asyncd.canonical_string(v["headers"], v["body"].encode()) == v["canonical"].encode()
    assert sign(v["keys"]["primary"], v["headers"], v["body"].encode()) == v["headers"]["Asyncd-Signature"]
    verify_signature(v["keys"]["primary"], v["headers"], v["body"].encode(), now=int(v["headers"]["Asyncd-Timestamp"]))
    assert len(v["cases"]) >= 20
    for case in v["cases"]:
        verifier = asyncd.Verifier([v["keys"][name] for name in case["keys"]])
        got = [_outcome(verifier, step) for step in case["steps"]]
        assert got == [step["want"] for step in case["steps"]], case["name"]


def _batch_headers_now(monkeypatch, v):
    """The batch_signature vector's headers (lower-case, as WSGI and ASGI give them),
    with the executor's clock at the vector's ``now``."""
    monkeypatch.setattr(time, "time", lambda: float(v["now"]))
    return {k.lower(): val for k, val in v["headers"].items()}


def test_batch_signature_vector():
    v = fixture("batch_signature")
    body, headers, now = v["body"].encode(), v["headers"], v["now"]
    primary = v["keys"]["primary"]
    assert headers["Asyncd-Batch"] == str(len(json.loads(body)["tasks"]))
    assert asyncd.batch_canonical_string(headers, body) == v["canonical"].encode()
    # The single call's canonical string with the four per-task fields empty.
    assert asyncd.canonical_string(headers, body) == v["canonical"].encode()
    assert sign(primary, headers, body) == headers["Asyncd-Signature"]
    assert asyncd.Verifier(primary).verify_batch(headers, body, now=now) == int(headers["Asyncd-Timestamp"])
    verify_signature(primary, headers, body, now=now)

    # Per-task headers a batch call does not carry are not signed even when present.
    stray = {**headers, "Asyncd-Task-Id": "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", "Asyncd-Attempt": "1"}
    assert asyncd.batch_canonical_string(stray, body) == v["canonical"].encode()
    asyncd.Verifier(primary).verify_batch(stray, body, now=now)

    tampered_body = body.replace(b'"attempt":2', b'"attempt":3')
    assert tampered_body != body
    for case, h, b, at in [
        ("tampered body", headers, tampered_body, now),
        ("tampered timestamp", {**headers, "Asyncd-Timestamp": str(now + 1)}, body, now),
        ("another callback url", {**headers, "Asyncd-Callback-Url": "http://evil.example:7700"}, body, now),
        ("signed with another key", headers, body, now),
    ]:
        keys = v["keys"]["secondary"] if case == "signed with another key" else primary
        with pytest.raises(asyncd.BadSignature, match="mismatch"):
            asyncd.Verifier(keys).verify_batch(h, b, now=at)
    with pytest.raises(asyncd.StaleTimestamp):
        asyncd.Verifier(primary).verify_batch(headers, body, now=now + 301)


def test_batch_signature_vector_through_the_executor(monkeypatch):
    """The signed batch call is served: verified with the primary key, each task run
    once, and the same call again refused per task as replays."""
    v = fixture("batch_signature")
    headers = _batch_headers_now(monkeypatch, v)
    ex = asyncd.Executor(signing_secret=v["keys"]["primary"])
    ran = []
    ex.register("send_email", lambda payload, ctx: ran.append(ctx.id))
    ids = [t["id"] for t in json.loads(v["body"])["tasks"]]

    status, _, out = ex.handle("POST", headers, v["body"].encode())
    assert status == 200 and json.loads(out) == {"results": [{"id": i, "status": "success"} for i in ids]}
    assert sorted(ran) == sorted(ids)

    status, _, out = ex.handle("POST", headers, v["body"].encode())
    want = "bad signature: this task attempt was already delivered"
    assert status == 200 and json.loads(out) == {"results": [{"id": i, "status": "failed", "error": want} for i in ids]}
    assert sorted(ran) == sorted(ids), "a replayed entry must not run"

    tampered = v["body"].replace("a@b.c", "x@b.c").encode()
    assert ex.handle("POST", headers, tampered)[0] == 401
    assert ex.handle("POST", {**headers, "asyncd-timestamp": str(v["now"] - 1)}, v["body"].encode())[0] == 401
    assert len(ran) == 2


def test_batch_call_decodes_and_answer_encodes():
    """executor_batch_call.json is read into one context per task, as a single call's
    headers and body would be; the handlers' outcomes come back as
    executor_batch_answer.json."""
    call, want = fixture("executor_batch_call"), fixture("executor_batch_answer")
    seen = {}
    ex = asyncd.Executor()

    @ex.executor("send_email")
    def send(payload, ctx):
        seen[ctx.id] = (payload, ctx)
        if ctx.attempt == 2:
            raise asyncd.Retry(after=timedelta(seconds=30), message="downstream busy")

    headers = {"asyncd-batch": str(len(call["tasks"])), "asyncd-callback-url": "http://10.0.0.7:7700/"}
    status, hdrs, out = ex.handle("POST", headers, json.dumps(call).encode())
    assert status == 200 and dict(hdrs)["Content-Type"] == "application/json"
    assert json.loads(out) == want

    for task in call["tasks"]:
        payload, ctx = seen[task["id"]]
        assert payload == task["payload"]
        assert (ctx.id, ctx.type, ctx.attempt, ctx.idempotency_key, ctx.lease_token, ctx.eta) == (
            task["id"], task["type"], task["attempt"], task["idempotency_key"], task["lease_token"],
            parse_time(task["eta"]))
        assert ctx.callback_url == "http://10.0.0.7:7700"
        assert (ctx.traceparent, ctx.tracestate) == (task.get("traceparent"), task.get("tracestate"))


def test_batch_answer_durations_are_the_contracts():
    for result in fixture("executor_batch_answer")["results"]:
        for key in ("lease", "retry_after"):
            if key in result:
                assert format_duration(timedelta(seconds=parse_duration(result[key]).total_seconds())) == result[key]
