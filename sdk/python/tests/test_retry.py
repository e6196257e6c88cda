"""The shared error taxonomy (sdk/testdata/errors.json) and opt-in retries."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

import asyncd
from fakeapi import FakeAPI, Recorded

TAXONOMY = json.loads((Path(__file__).resolve().parents[2] / "testdata" / "errors.json").read_text())
CLASSES = {
    "malformed_json": asyncd.MalformedJSON, "invalid_field": asyncd.InvalidField,
    "unknown_task_type": asyncd.UnknownTaskType, "payload_too_large": asyncd.PayloadTooLarge,
    "unauthenticated": asyncd.Unauthenticated, "forbidden": asyncd.Forbidden,
    "not_found": asyncd.NotFound, "unique_conflict": asyncd.UniqueConflict,
    "idempotency_mismatch": asyncd.IdempotencyMismatch, "not_cancellable": asyncd.NotCancellable,
    "stale_lease": asyncd.StaleLease, "not_dead": asyncd.NotDead, "task_started": asyncd.TaskStarted,
    "throttled": asyncd.Throttled,
    "schedule_exists": asyncd.ScheduleExists, "schedule_read_only": asyncd.ScheduleReadOnly,
    "task_cancelled": asyncd.TaskCancelled,
    "store_unavailable": asyncd.StoreUnavailable, "kafka_unavailable": asyncd.KafkaUnavailable,
    "auth_unavailable": asyncd.AuthUnavailable, "clock_skew": asyncd.ClockSkew,
    "signing_unavailable": asyncd.SigningUnavailable,
}


def test_every_code_of_the_shared_table_has_its_class_and_retryability(fake_api: FakeAPI) -> None:
    assert sorted(CLASSES) == sorted(row["code"] for row in TAXONOMY["codes"])
    client = asyncd.Client(fake_api.url, token_file=None)
    for row in TAXONOMY["codes"]:
        headers = {"Retry-After": "1"} if row["retryable"] else {}
        fake_api.route = lambda rec, row=row, headers=headers: (
            row["status"], {"error": {"code": row["code"], "message": "m"}}, headers)
        with pytest.raises(asyncd.APIError) as info:
            client.get("x")
        err = info.value
        assert type(err) is CLASSES[row["code"]], row
        assert (err.code, err.status, err.retryable, asyncd.is_retryable(err)) == (
            row["code"], row["status"], row["retryable"], row["retryable"]), row
        assert err.retry_after == (1.0 if row["retryable"] else None), row
        assert isinstance(err, asyncd.Unavailable) == (row["status"] == 503), row
    # Not an invalid-field error, as in the Go and Rust SDKs.
    assert not issubclass(asyncd.UnknownTaskType, asyncd.InvalidField)
    for row in TAXONOMY["http_errors"]:
        fake_api.route = lambda rec, row=row: (row["status"], b"<html>proxy</html>")
        with pytest.raises(asyncd.APIError) as info:
            client.get("x")
        assert (info.value.code, info.value.retryable) == ("http_error", row["retryable"]), row
        assert isinstance(info.value, asyncd.RateLimited) == (row["status"] == 429), row
    assert TAXONOMY["rate_limited"], "the table has no rate_limited rows"
    for row in TAXONOMY["rate_limited"]:
        fake_api.route = lambda rec, row=row: (
            row["status"], {"error": {"code": row["code"], "message": "slow down"}}, {"Retry-After": "1"})
        with pytest.raises(asyncd.RateLimited) as info:
            client.get("x")
        err = info.value
        assert (err.code, err.status, err.retryable, err.retry_after) == (row["code"], 429, True, 1.0), row
        assert str(err) == f"rate limited: {row['code']} (429): slow down", row
        assert not isinstance(err, asyncd.Unavailable), row


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_transport_errors_are_retryable_and_name_their_cause() -> None:
    client = asyncd.Client(f"http://127.0.0.1:{_closed_port()}", token_file=None)
    with pytest.raises(asyncd.TransportError) as info:
        client.get("x")
    assert asyncd.is_retryable(info.value)
    assert "refused" in str(info.value).lower()


def _scripted(fake_api: FakeAPI, answers: List[Tuple[Any, ...]]) -> List[Recorded]:
    seen: List[Recorded] = []

    def route(rec: Recorded) -> Tuple[Any, ...]:
        seen.append(rec)
        return answers[min(len(seen), len(answers)) - 1]

    fake_api.route = route
    return seen


UNAVAILABLE = {"error": {"code": "store_unavailable", "message": "the store did not answer"}}
CREATED = {"id": "t1", "eta": "2026-12-01T00:00:00Z", "route": "store", "duplicate": False}


def test_retry_honours_retry_after_and_resends_the_same_key(fake_api: FakeAPI) -> None:
    seen = _scripted(fake_api, [(503, UNAVAILABLE, {"Retry-After": "2"}),
                                (503, {"error": {"code": "kafka_unavailable", "message": "no ack"}}),
                                (201, CREATED)])
    waits: List[float] = []
    retried: List[str] = []
    policy = asyncd.RetryPolicy(max_attempts=4, initial_backoff=0.1, max_backoff=3.0, sleep=waits.append,
                                on_retry=lambda n, err, wait: retried.append(f"{n}:{err.code}"))
    client = asyncd.Client(fake_api.url, token_file=None, retry=policy)
    res = client.submit("t", {"a": 1}, idempotency_key="k-1")
    assert res.id == "t1"
    assert [r.body["idempotency_key"] for r in seen] == ["k-1"] * 3
    # Retry-After first; then the backoff's second step, 0.2 s with equal jitter.
    assert waits[0] == 2.0 and 0.1 <= waits[1] <= 0.2 and len(waits) == 2
    assert retried == ["1:store_unavailable", "2:kafka_unavailable"]


def test_retry_gives_up_and_never_retries_a_refusal(fake_api: FakeAPI) -> None:
    waits: List[float] = []
    policy = asyncd.RetryPolicy(max_attempts=3, sleep=waits.append)
    client = asyncd.Client(fake_api.url, token_file=None, retry=policy)
    seen = _scripted(fake_api, [(503, UNAVAILABLE, {"Retry-After": "1"})])
    with pytest.raises(asyncd.StoreUnavailable):
        client.submit("t", idempotency_key="k")
    assert (len(seen), waits) == (3, [1.0, 1.0])
    seen = _scripted(fake_api, [(409, {"error": {"code": "idempotency_mismatch", "message": "m",
                                                "existing_id": "t0"}})])
    with pytest.raises(asyncd.IdempotencyMismatch) as info:
        client.submit("t", idempotency_key="k")
    assert (len(seen), info.value.existing_id) == (1, "t0")


def test_without_a_policy_a_503_is_raised_at_once(fake_api: FakeAPI) -> None:
    seen = _scripted(fake_api, [(503, UNAVAILABLE, {"Retry-After": "1"})])
    with pytest.raises(asyncd.StoreUnavailable) as info:
        asyncd.Client(fake_api.url, token_file=None).submit("t", idempotency_key="k")
    assert len(seen) == 1 and info.value.retry_after == 1.0


def test_the_async_client_retries_with_asyncio_sleep_and_leaves_the_loop_free(fake_api: FakeAPI) -> None:
    seen = _scripted(fake_api, [(503, UNAVAILABLE, {"Retry-After": "3"}), (201, CREATED)])
    waits: List[float] = []

    async def fake_sleep(seconds: float) -> None:
        waits.append(seconds)

    async def main() -> Tuple[asyncd.SubmitResult, int]:
        client = asyncd.AsyncClient(fake_api.url, token_file=None,
                                    retry=asyncd.RetryPolicy(async_sleep=fake_sleep))
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        t = asyncio.ensure_future(ticker())
        res = await client.submit("t", {"a": 1}, idempotency_key="k-async")
        t.cancel()
        return res, ticks

    res, ticks = asyncio.run(main())
    assert res.id == "t1" and waits == [3.0] and len(seen) == 2
    # The loop ran other work while the requests were in flight.
    assert ticks > 0


# asyncd's own 429 (--auth kubernetes: too many new tokens from one address).
RATE_LIMITED = {"error": {"code": "auth_unavailable",
                          "message": "Authorization: too many new bearer tokens from 127.0.0.1; retry in a second"}}


def _recording_client(fake_api: FakeAPI, waits: List[float], **policy: Any) -> asyncd.Client:
    """4 attempts, 0.1 s doubling to 3 s, each wait recorded in ``waits`` instead of slept."""
    args: Dict[str, Any] = dict(max_attempts=4, initial_backoff=0.1, max_backoff=3.0, sleep=waits.append)
    args.update(policy)
    return asyncd.Client(fake_api.url, token_file=None, retry=asyncd.RetryPolicy(**args))


def test_a_429_is_retried_after_its_retry_after(fake_api: FakeAPI) -> None:
    seen = _scripted(fake_api, [(429, RATE_LIMITED, {"Retry-After": "2"}), (201, CREATED)])
    waits: List[float] = []
    retried: List[Tuple[int, str, float]] = []
    client = _recording_client(fake_api, waits,
                               on_retry=lambda n, err, wait: retried.append((n, type(err).__name__, wait)))
    assert client.submit("t", {"a": 1}, idempotency_key="k-429").id == "t1"
    # One wait, the server's 2 s (not the policy's 0.1 s backoff), then the same submit.
    assert [r.body["idempotency_key"] for r in seen] == ["k-429"] * 2
    assert waits == [2.0] and retried == [(1, "RateLimited", 2.0)]

    # The other calls the client retries get the same treatment.
    seen = _scripted(fake_api, [(429, RATE_LIMITED, {"Retry-After": "1"}),
                                (200, {"id": "t1", "type": "t", "state": "pending"})])
    waits.clear()
    assert client.get("t1").id == "t1"
    assert (len(seen), waits) == (2, [1.0])


def test_a_429_that_outlasts_the_attempts_is_a_rate_limit_error(fake_api: FakeAPI) -> None:
    # Retry-After 30 s is more than the policy's max_backoff (3 s): each wait is cut to it.
    seen = _scripted(fake_api, [(429, RATE_LIMITED, {"Retry-After": "30"})])
    waits: List[float] = []
    with pytest.raises(asyncd.RateLimited) as info:
        _recording_client(fake_api, waits).submit("t", idempotency_key="k")
    assert str(info.value).startswith("rate limited: auth_unavailable (429): Authorization: too many new bearer tokens")
    assert (info.value.status, info.value.code, info.value.retry_after) == (429, "auth_unavailable", 30.0)
    assert (len(seen), waits) == (4, [3.0, 3.0, 3.0])


@pytest.mark.parametrize("retry_after", [None, "soon", "-5"])
def test_a_429_without_a_readable_retry_after_waits_the_backoff(fake_api: FakeAPI, retry_after: Any) -> None:
    headers = {"Retry-After": retry_after} if retry_after else {}
    seen = _scripted(fake_api, [(429, RATE_LIMITED, headers), (429, b"<html>proxy: slow down</html>", headers),
                                (201, CREATED)])
    waits: List[float] = []
    assert _recording_client(fake_api, waits).submit("t", idempotency_key="k").id == "t1"
    # The backoff's first two steps, 0.1 s and 0.2 s, with equal jitter.
    assert len(seen) == 3 and len(waits) == 2
    assert 0.05 <= waits[0] <= 0.1 and 0.1 <= waits[1] <= 0.2, waits


def test_the_async_client_waits_out_a_429(fake_api: FakeAPI) -> None:
    seen = _scripted(fake_api, [(429, RATE_LIMITED, {"Retry-After": "1"})])
    waits: List[float] = []

    async def fake_sleep(seconds: float) -> None:
        waits.append(seconds)

    client = asyncd.AsyncClient(fake_api.url, token_file=None,
                                retry=asyncd.RetryPolicy(max_attempts=3, async_sleep=fake_sleep))
    with pytest.raises(asyncd.RateLimited):
        asyncio.run(client.submit("t", idempotency_key="k-async"))
    assert (len(seen), waits) == (3, [1.0, 1.0])
