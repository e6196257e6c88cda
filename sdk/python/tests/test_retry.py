"""The shared error taxonomy (sdk/testdata/errors.json) and opt-in retries."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path
from typing import Any, List, Tuple

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
    "stale_lease": asyncd.StaleLease, "not_dead": asyncd.NotDead, "task_cancelled": asyncd.TaskCancelled,
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
    policy = asyncd.RetryPolicy(max_attempts=4, initial_backoff=0.1, max_backoff=1.0, sleep=waits.append,
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
