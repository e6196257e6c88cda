"""Concurrent submits share calls (the Go SDK's coalesce_test.go): while a client's submit
calls are all in flight, the submits of other threads (or asyncio tasks) queue and go
together in the next free call, each answered with its own result or error."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from concurrent.futures import Future
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import pytest

import asyncd
from asyncd._coalesce import MAX_BYTES, MAX_TASKS, SubmitQueue, _take
from fakeapi import FakeAPI, Recorded, wait_until

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
STORE_DOWN = {"error": {"code": "store_unavailable", "message": "down"}}


class Batching:
    """Answers POST /v1/tasks and POST /v1/tasks:batch item by item: a task's id is its
    idempotency key, and type "nope" is refused. Calls are held at the fake API's gate
    until ``release()``."""

    def __init__(self, api: FakeAPI) -> None:
        self.api = api
        self.gate = threading.Event()
        api.gate = self.gate
        api.route = self.route
        self.calls: List[str] = []  # path and task count of each call answered, in order
        self.batch_limit = 0  # a batch with more tasks answers 413; 0: no limit
        self.status = 0  # answers every call with this status (and STORE_DOWN) when set
        self.results_short = False  # a batch answers one result too few

    @staticmethod
    def item(t: Dict[str, Any]) -> Dict[str, Any]:
        if t["type"] == "nope":
            return {"status": 400, "error": {"code": "unknown_task_type", "message": "no job", "field": "type"}}
        return {"status": 201, "id": t["idempotency_key"], "eta": "2026-12-01T00:00:00Z", "route": "store"}

    def route(self, r: Recorded) -> Tuple[Any, ...]:
        batch = r.path == "/v1/tasks:batch"
        tasks = r.body["tasks"] if batch else [r.body]
        with self.api.lock:
            self.calls.append(f"{r.path} {len(tasks)}")
        if self.status:
            return self.status, STORE_DOWN
        if not batch:
            answer = self.item(r.body)
            return answer["status"], answer
        if self.batch_limit and len(tasks) > self.batch_limit:
            return 413, {"error": {"code": "payload_too_large", "message": "batch body over the limit"}}
        return 200, {"results": [self.item(t) for t in tasks][: len(tasks) - self.results_short]}

    def release(self) -> None:
        self.gate.set()

    def call_log(self) -> List[str]:
        with self.api.lock:
            return list(self.calls)

    def arrived(self) -> int:
        with self.api.lock:
            return len(self.api.requests)

    def keys_sent(self) -> List[str]:
        with self.api.lock:
            reqs = list(self.api.requests)
        out = []
        for r in reqs:
            out += [t["idempotency_key"] for t in r.body["tasks"]] if r.path.endswith(":batch") \
                else [r.body["idempotency_key"]]
        return out


@pytest.fixture
def batching(fake_api: FakeAPI) -> Iterator[Batching]:
    b = Batching(fake_api)
    yield b
    b.release()  # never leave a handler thread held


class Threads:
    """Runs each call in a daemon thread of its own, so a submit that never returns fails
    its test (``result(timeout)``) instead of hanging the run at exit, as a pool's
    worker would."""

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> "Future[Any]":
        f: "Future[Any]" = Future()

        def run() -> None:
            try:
                f.set_result(fn(*args, **kwargs))
            except BaseException as e:  # noqa: BLE001 - handed to the test
                f.set_exception(e)

        threading.Thread(target=run, daemon=True).start()
        return f


@pytest.fixture
def pool() -> Threads:
    return Threads()


def submit_all(pool: Threads, c: asyncd.Client, *keys: str,
               types: Optional[Dict[str, str]] = None) -> Dict[str, "Future[asyncd.SubmitResult]"]:
    return {k: pool.submit(c.submit, (types or {}).get(k, "t"), {"k": k}, idempotency_key=k) for k in keys}


def wait_in_flight(c: asyncd.Client, b: Batching, calls: int = 1) -> None:
    """Waits until ``calls`` calls are held at the gate and none of the client's submits
    is queued."""
    wait_until(lambda: b.arrived() == calls and c._submits.queued() == 0, 10, f"{calls} call(s) in flight")


def wait_queued(c: asyncd.Client, n: int) -> None:
    wait_until(lambda: c._submits.queued() == n, 10, f"{n} submits queued")


def test_concurrent_submits_share_the_next_call_and_each_gets_its_own_result(batching, pool):
    c = asyncd.Client(batching.api.url, token_file=None, submit_calls=1)
    first = submit_all(pool, c, "first")
    wait_in_flight(c, batching)  # the first went alone: a call was free
    rest = submit_all(pool, c, "a", "b", "bad", "c", types={"bad": "nope"})
    wait_queued(c, 4)
    batching.release()

    assert first["first"].result(10).id == "first"
    for k in ("a", "b", "c"):
        res = rest[k].result(10)
        assert (res.id, res.route) == (k, "store")
    with pytest.raises(asyncd.UnknownTaskType) as info:
        rest["bad"].result(10)
    assert (info.value.status, info.value.code, info.value.field) == (400, "unknown_task_type", "type")
    assert batching.call_log() == ["/v1/tasks 1", "/v1/tasks:batch 4"]
    # The batch carried the queued tasks as their own submits would have.
    batch = batching.api.matching(":batch")[0].body["tasks"]
    assert sorted(t["idempotency_key"] for t in batch) == ["a", "b", "bad", "c"]
    assert all(t["payload"] == {"k": t["idempotency_key"]} for t in batch)
    assert (c._submits.senders(), c._submits.queued()) == (0, 0)


def test_a_failed_shared_call_fails_every_submit_in_it(batching, pool):
    c = asyncd.Client(batching.api.url, token_file=None, submit_calls=1)
    first = submit_all(pool, c, "first")
    wait_in_flight(c, batching)
    rest = submit_all(pool, c, "a", "b")
    wait_queued(c, 2)
    batching.status = 503
    batching.release()
    with pytest.raises(asyncd.StoreUnavailable):
        first["first"].result(10)
    errors = []
    for k in ("a", "b"):
        with pytest.raises(asyncd.StoreUnavailable) as info:
            rest[k].result(10)
        assert (info.value.status, info.value.code) == (503, "store_unavailable")
        errors.append(info.value)
    # Each submit raised its own copy, so their tracebacks do not mix.
    assert errors[0] is not errors[1]
    assert batching.call_log() == ["/v1/tasks 1", "/v1/tasks:batch 2"]


def test_the_retry_policy_retries_a_shared_call_as_a_whole(batching, pool):
    waits: List[float] = []
    c = asyncd.Client(batching.api.url, token_file=None, submit_calls=1,
                      retry=asyncd.RetryPolicy(max_attempts=2, sleep=waits.append))
    first = submit_all(pool, c, "first")
    wait_in_flight(c, batching)
    rest = submit_all(pool, c, "a", "b")
    wait_queued(c, 2)
    answered = 0
    inner = batching.route

    def down_once(r: Recorded) -> Tuple[Any, ...]:
        nonlocal answered
        answered += 1
        if answered == 2:  # the batch's first attempt
            with batching.api.lock:
                batching.calls.append("503")
            return 503, STORE_DOWN
        return inner(r)

    batching.api.route = down_once
    batching.release()
    assert first["first"].result(10).id == "first"
    assert [rest[k].result(10).id for k in ("a", "b")] == ["a", "b"]
    assert batching.call_log() == ["/v1/tasks 1", "503", "/v1/tasks:batch 2"] and len(waits) == 1


def test_a_shared_call_the_api_finds_too_large_is_sent_task_by_task(batching, pool):
    batching.batch_limit = 1
    c = asyncd.Client(batching.api.url, token_file=None, submit_calls=1)
    first = submit_all(pool, c, "first")
    wait_in_flight(c, batching)
    rest = submit_all(pool, c, "a", "b", "c")
    wait_queued(c, 3)
    batching.release()
    first["first"].result(10)
    for k in ("a", "b", "c"):
        assert rest[k].result(10).id == k
    assert batching.call_log() == ["/v1/tasks 1", "/v1/tasks:batch 3"] + ["/v1/tasks 1"] * 3


def test_a_batch_answered_with_the_wrong_number_of_results_fails_each_submit(batching, pool):
    batching.results_short = True
    c = asyncd.Client(batching.api.url, token_file=None, submit_calls=1)
    first = submit_all(pool, c, "first")
    wait_in_flight(c, batching)
    rest = submit_all(pool, c, "a", "b")
    wait_queued(c, 2)
    batching.release()
    first["first"].result(10)
    for k in ("a", "b"):
        with pytest.raises(asyncd.APIError, match="batch of 2 answered with"):
            rest[k].result(10)


def test_a_traced_submit_is_never_queued(batching, pool):
    c = asyncd.Client(batching.api.url, token_file=None, submit_calls=1)
    first = submit_all(pool, c, "first")
    wait_in_flight(c, batching)
    traced = pool.submit(c.submit, "t", None, idempotency_key="traced", traceparent=TRACEPARENT)
    # Its own call reaches the API while the first is held, and it was never queued.
    wait_until(lambda: batching.arrived() == 2, 10, "the traced submit's own call")
    assert c._submits.queued() == 0
    batching.release()
    first["first"].result(10)
    assert traced.result(10).id == "traced"
    r = batching.api.matching("/v1/tasks")[1]
    assert (r.body["idempotency_key"], r.headers["traceparent"]) == ("traced", TRACEPARENT)


def test_submit_calls_0_sends_every_submit_alone(batching, pool):
    c = asyncd.Client(batching.api.url, token_file=None, submit_calls=0)
    assert c._submits is None
    futures = submit_all(pool, c, "a", "b", "c")
    # All three are in flight at once, none waiting for another.
    wait_until(lambda: batching.arrived() == 3, 10, "three calls in flight")
    batching.release()
    assert [futures[k].result(10).id for k in "abc"] == ["a", "b", "c"]
    assert batching.call_log() == ["/v1/tasks 1"] * 3
    with pytest.raises(ValueError):
        asyncd.Client(batching.api.url, submit_calls=-1)


def test_the_default_is_four_calls_in_flight(batching, pool):
    assert asyncd.DEFAULT_SUBMIT_CALLS == 4
    c = asyncd.Client(batching.api.url, token_file=None)
    alone = submit_all(pool, c, "a", "b", "c", "d")
    wait_in_flight(c, batching, 4)
    queued = submit_all(pool, c, "e", "f")
    wait_queued(c, 2)
    batching.release()
    for k, f in {**alone, **queued}.items():
        assert f.result(10).id == k
    # In the order the calls arrived (the answered order races: a freed slot's next
    # call can be answered before the last of the four held ones).
    with batching.api.lock:
        arrived = [f"{r.path} {len(r.body['tasks']) if r.path.endswith(':batch') else 1}"
                   for r in batching.api.requests]
    assert arrived[:4] == ["/v1/tasks 1"] * 4
    assert arrived[4:] in (["/v1/tasks:batch 2"], ["/v1/tasks 1", "/v1/tasks 1"]), arrived


def test_a_call_takes_at_most_1000_tasks_and_1_mib_past_the_first():
    class Q:
        def __init__(self, size: int) -> None:
            self.raw = b"x" * size

    q = deque(Q(10) for _ in range(MAX_TASKS + 1))
    assert len(_take(q)) == MAX_TASKS and len(q) == 1
    big = MAX_BYTES // 2
    q = deque([Q(big), Q(big), Q(10)])
    assert len(_take(q)) == 1 and len(q) == 2  # big + 1 + big + 1 is over 1 MiB
    q = deque([Q(2 * MAX_BYTES), Q(10)])
    assert len(_take(q)) == 1  # a first task over the bound still goes, alone


def test_a_thread_answered_hands_the_sending_on_and_returns():
    """A submit's thread does not go on sending calls for others once its own submit is
    answered: the first queued submit's thread makes the next call."""
    lock = threading.Lock()
    made: List[Tuple[str, List[bytes]]] = []  # thread name and tasks of each call
    release = [threading.Event(), threading.Event()]

    def answer(raws: List[bytes]) -> List[Tuple[Any, Optional[BaseException]]]:
        with lock:
            made.append((threading.current_thread().name, raws))
            n = len(made)
        assert release[n - 1].wait(30)
        return [(raw.decode(), None) for raw in raws]

    def names() -> List[str]:
        with lock:
            return [m[0] for m in made]

    q = SubmitQueue(1, answer)
    first = Threads().submit(q.submit, b"first")
    wait_until(lambda: len(names()) == 1, 10, "the first call")
    queued = {k: Threads().submit(q.submit, k.encode()) for k in ("a", "b")}
    wait_until(lambda: q.queued() == 2, 10, "2 submits queued")
    release[0].set()
    assert first.result(10) == "first"
    wait_until(lambda: len(names()) == 2, 10, "the second call")
    # The first thread returned while the second call, made by another thread, is held.
    assert not queued["a"].done() and names()[0] != names()[1]
    with lock:
        assert sorted(made[1][1]) == [b"a", b"b"]
    release[1].set()
    assert [queued[k].result(10) for k in ("a", "b")] == ["a", "b"]
    assert (q.senders(), q.queued()) == (0, 0)


def test_many_threads_never_have_more_than_max_calls_in_flight():
    """The sender role passes from thread to thread: every submit is answered, by calls
    of which never more than max_calls are in flight."""
    lock = threading.Lock()
    in_flight = peak = calls = 0
    slow = threading.Event()

    def answer(raws: List[bytes]) -> List[Tuple[Any, Optional[BaseException]]]:
        nonlocal in_flight, peak, calls
        with lock:
            in_flight += 1
            calls += 1
            peak = max(peak, in_flight)
        slow.wait(0.002)  # never set: each call takes a moment, so submits pile up
        with lock:
            in_flight -= 1
        return [(raw.decode(), None) if raw != b"bad" else (None, ValueError(raw.decode())) for raw in raws]

    q = SubmitQueue(3, answer)
    n = 300
    futures = [Threads().submit(q.submit, b"bad" if i == 150 else str(i).encode()) for i in range(n)]
    for i, f in enumerate(futures):
        if i == 150:
            with pytest.raises(ValueError):
                f.result(30)
        else:
            assert f.result(30) == str(i)
    assert peak <= 3 and calls < n, (peak, calls)
    assert (q.senders(), q.queued()) == (0, 0)


# -- asyncio ---------------------------------------------------------------------


async def until(cond: Callable[[], bool], what: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


def test_async_concurrent_submits_share_the_next_call(batching):
    async def main() -> None:
        c = asyncd.AsyncClient(batching.api.url, token_file=None, submit_calls=1)
        first = asyncio.ensure_future(c.submit("t", {"k": "first"}, idempotency_key="first"))
        await until(lambda: batching.arrived() == 1 and c._submits.queued() == 0, "the first call in flight")
        rest = {k: asyncio.ensure_future(c.submit("nope" if k == "bad" else "t", {"k": k}, idempotency_key=k))
                for k in ("a", "b", "bad", "c")}
        await until(lambda: c._submits.queued() == 4, "4 submits queued")
        batching.release()
        assert (await first).id == "first"
        for k in ("a", "b", "c"):
            assert (await rest[k]).id == k
        with pytest.raises(asyncd.UnknownTaskType) as info:
            await rest["bad"]
        assert info.value.field == "type"
        assert c._submits.senders() == 0

    asyncio.run(main())
    assert batching.call_log() == ["/v1/tasks 1", "/v1/tasks:batch 4"]


def test_async_a_submit_cancelled_while_queued_is_never_sent(batching):
    async def main() -> None:
        c = asyncd.AsyncClient(batching.api.url, token_file=None, submit_calls=1)
        first = asyncio.ensure_future(c.submit("t", idempotency_key="first"))
        await until(lambda: batching.arrived() == 1, "the first call in flight")
        gave_up = asyncio.ensure_future(c.submit("t", idempotency_key="gave-up"))
        kept = asyncio.ensure_future(c.submit("t", idempotency_key="kept"))
        await until(lambda: c._submits.queued() == 2, "2 submits queued")
        gave_up.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gave_up
        assert c._submits.queued() == 1
        batching.release()
        assert (await first).id == "first"
        assert (await kept).id == "kept"

    asyncio.run(main())
    assert batching.call_log() == ["/v1/tasks 1", "/v1/tasks 1"]
    assert batching.keys_sent() == ["first", "kept"]


def test_async_a_traced_submit_is_never_queued(batching):
    async def main() -> None:
        c = asyncd.AsyncClient(batching.api.url, token_file=None, submit_calls=1)
        first = asyncio.ensure_future(c.submit("t", idempotency_key="first"))
        await until(lambda: batching.arrived() == 1, "the first call in flight")
        traced = asyncio.ensure_future(c.submit("t", idempotency_key="traced", traceparent=TRACEPARENT))
        await until(lambda: batching.arrived() == 2, "the traced submit's own call")
        assert c._submits.queued() == 0
        batching.release()
        await first
        assert (await traced).id == "traced"

    asyncio.run(main())
    assert batching.api.matching("/v1/tasks")[1].headers["traceparent"] == TRACEPARENT
