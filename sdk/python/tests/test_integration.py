"""Integration tests against a real `asyncd dev` process started here from $ASYNCD_BIN.

Without the binary every test here FAILS (never skips): a green run must mean the SDK
was checked against the server."""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Dict, Iterator, List, Optional, Union
from wsgiref.simple_server import WSGIRequestHandler, make_server

import pytest

import asyncd
from asyncd._time import parse_time
from devserver import DevServer
from fakeapi import wait_until

SECRET = "py-it-signing-secret"
SECRET_NAME = "py-it-signing"
LEASE = 2.0
UNKNOWN_ID = "01934a6e-0000-7000-8000-000000000000"


@dataclass
class Run:
    ctx: asyncd.TaskContext
    payload: Any
    at: datetime


@dataclass
class Env:
    server: DevServer
    client: asyncd.Client
    runs: Dict[str, List[Run]] = field(default_factory=dict)
    releases: Dict[str, threading.Event] = field(default_factory=dict)
    #: Set, by task id, when a py_cancel handler got CancelledError.
    cancels_seen: Dict[str, threading.Event] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, payload: Any, ctx: asyncd.TaskContext) -> asyncd.TaskContext:
        with self.lock:
            self.runs.setdefault(ctx.id, []).append(Run(ctx, payload, datetime.now(timezone.utc)))
        return ctx

    def runs_of(self, task_id: str) -> List[Run]:
        with self.lock:
            return list(self.runs.get(task_id, []))

    def release(self, task_id: str) -> threading.Event:
        with self.lock:
            return self.releases.setdefault(task_id, threading.Event())

    def cancel_seen(self, task_id: str) -> threading.Event:
        with self.lock:
            return self.cancels_seen.setdefault(task_id, threading.Event())

    def wait_state(self, task_id: str, state: str, timeout: float = 20.0) -> asyncd.TaskStatus:
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            try:
                last = self.client.get(task_id)
                if last.state == state:
                    return last
            except asyncd.AsyncdError as e:
                last = e
            time.sleep(0.05)
        pytest.fail(f"task {task_id} not {state} within {timeout}s: last {last!r}\n{self.server.log_tail()}")


def key(prefix: str = "k") -> str:
    return f"{prefix}-{uuid.uuid4()}"


def register(env: Env) -> None:
    c = env.client

    @c.executor("py_ok")
    def ok(payload: Any, ctx: asyncd.TaskContext) -> None:
        env.record(payload, ctx)

    @c.executor("py_unique")
    def unique(payload: Any, ctx: asyncd.TaskContext) -> None:
        env.record(payload, ctx)

    @c.executor("py_cron")
    def cron(payload: Any, ctx: asyncd.TaskContext) -> None:
        env.record(payload, ctx)

    @c.executor("py_sched")
    def scheduled(payload: Any, ctx: asyncd.TaskContext) -> None:
        env.record(payload, ctx)

    @c.executor("py_expiry")
    def expiry(payload: Any, ctx: asyncd.TaskContext) -> None:
        # A "retry" task asks for its retry well after its expiry.
        if env.record(payload, ctx).attempt == 1 and payload == "retry":
            raise asyncd.Retry(after=timedelta(seconds=30))

    # py_debounce is paused by test_debounce_trailing while its submits are folded;
    # py_window takes the throttled and leading-debounced submits.
    @c.executor("py_debounce")
    def debounced(payload: Any, ctx: asyncd.TaskContext) -> None:
        env.record(payload, ctx)

    @c.executor("py_window")
    def windowed(payload: Any, ctx: asyncd.TaskContext) -> None:
        env.record(payload, ctx)

    @c.executor("py_async")
    async def async_ok(payload: Any, ctx: asyncd.TaskContext) -> Dict[str, Any]:
        env.record(payload, ctx)
        return {"seen": payload}

    @c.executor("py_permanent")
    def permanent(payload: Any, ctx: asyncd.TaskContext) -> None:
        env.record(payload, ctx)
        raise asyncd.Permanent("bad order")

    @c.executor("py_flaky")
    def flaky(payload: Any, ctx: asyncd.TaskContext) -> None:
        if env.record(payload, ctx).attempt == 1:
            raise ConnectionError("flaky dependency")

    @c.executor("py_retry_after")
    def retry_after(payload: Any, ctx: asyncd.TaskContext) -> None:
        if env.record(payload, ctx).attempt == 1:
            raise asyncd.Retry(after=timedelta(seconds=1))

    @c.executor("py_always_fails")
    def always(payload: Any, ctx: asyncd.TaskContext) -> None:
        env.record(payload, ctx)
        raise RuntimeError("always down")

    @c.executor("py_long", long_running=True, lease=LEASE)
    def long(payload: Any, ctx: asyncd.TaskContext) -> Dict[str, Any]:
        env.record(payload, ctx)
        release = env.release(ctx.id)
        while not release.wait(0.05):
            if ctx.lease_lost.is_set():
                raise asyncd.Retry()
        return {"done": True}

    @c.executor("py_cancel", long_running=True, lease=LEASE)
    async def cancellable(payload: Any, ctx: asyncd.TaskContext) -> Dict[str, Any]:
        env.record(payload, ctx)
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            env.cancel_seen(ctx.id).set()
            raise
        return {"done": True}


TYPES = ["py_ok", "py_async", "py_permanent", "py_flaky", "py_retry_after", "py_always_fails", "py_long", "py_unique",
         "py_cancel", "py_kafka", "py_cron", "py_expiry", "py_debounce", "py_window", "py_sched"]
# The py_sched job's spec.cron entry, the read-only schedule "nightly" of /v1/schedules
# (fires once a year).
NIGHTLY = {"name": "nightly", "schedule": "CRON_TZ=UTC 0 0 1 1 *", "payload": {"report": "annual"}}


@pytest.fixture(scope="module")
def dev_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Union[Env, Exception]]:
    try:
        server = DevServer(tmp_path_factory.mktemp("asyncd-py-it"), signing={SECRET_NAME: {"key": SECRET}})
    except Exception as e:  # reported by need() as a failure of each test
        yield e
        return
    client = asyncd.Client(server.endpoint, service_name="py-it", signing_secret=SECRET, timeout=10)
    env = Env(server, client)
    register(env)
    executor = client.make_server("127.0.0.1", 0)
    threading.Thread(target=executor.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    for t in TYPES:
        doc = asyncd.job_config(
            t.replace("_", "-") + "-job", t, f"http://127.0.0.1:{executor.server_port}/tasks/{t}",
            timeout=10, error_bodies=True, signing_secret=SECRET_NAME, max_retries=2, backoff="exponential",
            initial_backoff=0.1, max_backoff=0.5, unique_key="order:{order_id}" if t == "py_unique" else None,
            # Fires once a year, so only trigger_cron runs it within a test.
            cron=[{"name": "yearly", "schedule": "CRON_TZ=UTC 0 0 1 1 *", "payload": {"report": "annual"}}]
            if t == "py_cron" else [NIGHTLY] if t == "py_sched" else None,
        )
        if t == "py_kafka":
            # A Kafka-routed job (job_config has no argument for it). asyncd dev has no
            # brokers, so its tasks still go to the store, but the API treats an id of it
            # that is not in the store as a task not consumed yet.
            doc["spec"]["kafka"] = {"topic": "asyncd-py-it-kafka", "partitions": 1}
        (server.config_dir / f"{t}.yaml").write_text(asyncd.to_yaml(doc))
    try:
        server.start()
    except Exception as e:
        executor.shutdown()
        yield e
        return
    yield env
    server.stop()
    client.wait(5)
    executor.shutdown()
    executor.server_close()


def need(dev_env: Union[Env, Exception]) -> Env:
    if isinstance(dev_env, Exception):
        pytest.fail(f"integration environment: {dev_env}", pytrace=False)
    return dev_env


def test_submit_runs_executor(dev_env):
    env = need(dev_env)
    payload = {"order_id": 42, "note": "héllo"}
    k = asyncd.idempotency_key_from("py_ok", payload, "order_id", "note") + key("")
    res = env.client.submit("py_ok", payload, idempotency_key=k, priority=3)
    assert res.id and not res.duplicate and res.route in ("store", "kafka")
    got = env.wait_state(res.id, asyncd.SUCCEEDED)
    assert (got.type, got.attempt, got.idempotency_key, got.priority, got.payload) == ("py_ok", 1, k, 3, payload)
    assert got.created_at is not None
    runs = env.runs_of(res.id)
    assert len(runs) == 1
    ctx = runs[0].ctx
    assert (ctx.id, ctx.type, ctx.idempotency_key, ctx.attempt) == (res.id, "py_ok", k, 1)
    assert ctx.callback_url and runs[0].payload == payload
    assert runs[0].at >= res.eta - timedelta(milliseconds=1)


def test_async_handler_under_wsgi(dev_env):
    env = need(dev_env)
    res = env.client.submit("py_async", [1, 2], idempotency_key=key())
    env.wait_state(res.id, asyncd.SUCCEEDED)
    assert env.runs_of(res.id)[0].payload == [1, 2]


def test_idempotent_duplicate_returns_first_id(dev_env):
    env = need(dev_env)
    k = key("dup")
    first = env.client.submit("py_ok", 1, idempotency_key=k)
    second = env.client.submit("py_ok", 1, idempotency_key=k)
    assert not first.duplicate and second.duplicate
    assert (second.id, second.eta) == (first.id, first.eta)
    # The key with another payload is another request: refused, naming the first task.
    with pytest.raises(asyncd.IdempotencyMismatch) as info:
        env.client.submit("py_ok", 2, idempotency_key=k)
    err = info.value
    assert (err.status, err.existing_id, err.field, err.retryable) == (409, first.id, "idempotency_key", False)
    env.wait_state(first.id, asyncd.SUCCEEDED)
    assert len(env.runs_of(first.id)) == 1


def test_delayed_at_and_cancel(dev_env):
    env = need(dev_env)
    c = env.client
    before = datetime.now(timezone.utc)
    res = c.submit_delayed("py_ok", delay=timedelta(hours=1), idempotency_key=key())
    assert timedelta(minutes=59, seconds=59) <= res.eta - before <= timedelta(hours=1, seconds=10)
    assert c.get(res.id).state in (asyncd.PENDING, asyncd.CLAIMED)
    c.cancel(res.id)
    env.wait_state(res.id, asyncd.CANCELLED, 5)
    with pytest.raises(asyncd.NotCancellable) as info:
        c.cancel(res.id)
    assert info.value.status == 409 and info.value.state in (None, asyncd.CANCELLED)

    by_string = c.submit_delayed("py_ok", delay="2h", idempotency_key=key())
    assert by_string.eta - before >= timedelta(hours=2) - timedelta(seconds=1)
    c.cancel(by_string.id)

    eta = (datetime.now(timezone.utc) + timedelta(hours=3)).replace(microsecond=123000)
    at = c.submit_at("py_ok", eta=eta, idempotency_key=key())
    assert at.eta == eta
    c.cancel(at.id)

    soon = c.submit_delayed("py_ok", delay=0.7, idempotency_key=key())
    env.wait_state(soon.id, asyncd.SUCCEEDED)
    runs = env.runs_of(soon.id)
    assert len(runs) == 1 and runs[0].at >= soon.eta


def test_change_a_waiting_task_then_it_runs_with_the_new_values(dev_env):
    env = need(dev_env)
    c = env.client
    res = c.submit_delayed("py_ok", {"v": 1}, delay=timedelta(hours=1), idempotency_key=key())
    got = c.change(res.id, payload={"v": 2}, priority=5)
    assert (got.id, got.payload, got.priority, got.eta) == (res.id, {"v": 2}, 5, res.eta)
    assert env.runs_of(res.id) == []
    c.change(res.id, run_now=True)
    env.wait_state(res.id, asyncd.SUCCEEDED)
    runs = env.runs_of(res.id)
    assert len(runs) == 1 and runs[0].payload == {"v": 2}
    with pytest.raises(asyncd.TaskStarted) as info:
        c.change(res.id, run_now=True)
    assert (info.value.status, info.value.state) == (409, asyncd.SUCCEEDED)
    with pytest.raises(ValueError):
        c.change(res.id, delay=60, eta=datetime.now(timezone.utc))


def test_cancel_finished_task_and_redrive_live_task(dev_env):
    env = need(dev_env)
    res = env.client.submit("py_ok", idempotency_key=key())
    env.wait_state(res.id, asyncd.SUCCEEDED)
    with pytest.raises(asyncd.NotCancellable) as info:
        env.client.cancel(res.id)
    assert info.value.state in (None, asyncd.SUCCEEDED)
    with pytest.raises(asyncd.NotDead):
        env.client.redrive(res.id)


def test_cancel_in_job(dev_env):
    """Issue 15: ``cancel(id, job=)`` reaches a Kafka-routed task that no dispatcher has
    consumed (an id never submitted to py_kafka stands for one, as asyncd dev has no
    brokers): without the job it cannot be told from an unknown id; with it, it is
    recorded as cancelled. A stored task is cancelled with the job as without it, and a
    job no config declares is refused."""
    env = need(dev_env)
    c = env.client
    # Time-ordered (UUIDv7), as the API gives a task without an idempotency key: only such
    # an id is recorded cancelled ahead of consumption (a derived one is cancelled by key).
    unconsumed = "01934a6e-0000-7000-8000-%012x" % (time.time_ns() & 0xFFFFFFFFFFFF)
    with pytest.raises(asyncd.NotFound):
        c.cancel(unconsumed)
    c.cancel(unconsumed, job="py-kafka-job")
    got = c.get(unconsumed)
    assert got.state == asyncd.CANCELLED and "before it was consumed from Kafka" in (got.last_error or ""), got

    waiting = c.submit_delayed("py_ok", delay=timedelta(hours=1), idempotency_key=key())
    with pytest.raises(asyncd.InvalidField) as info:
        c.cancel(waiting.id, job="no-such-job")
    assert (info.value.status, info.value.field) == (400, "job")
    assert c.get(waiting.id).state in (asyncd.PENDING, asyncd.CLAIMED)
    c.cancel(waiting.id, job="py-ok-job")
    env.wait_state(waiting.id, asyncd.CANCELLED, 5)


def test_change_in_job(dev_env):
    """``change_in_job`` reaches a Kafka-routed task that no dispatcher has consumed (an
    id never submitted to py_kafka stands for one, as asyncd dev has no brokers):
    ``change`` cannot tell it from an unknown id; with the job the change is recorded
    (202, PendingChange), and a second one too. A stored task is changed with the job as
    without it (200, TaskStatus) — the server ignores ``?job=`` for a job without Kafka —
    and a job no config declares is refused."""
    env = need(dev_env)
    c = env.client
    unconsumed = "01934a6e-0002-7000-8000-%012x" % (time.time_ns() & 0xFFFFFFFFFFFF)
    with pytest.raises(asyncd.NotFound):
        c.change(unconsumed, priority=7)
    want = asyncd.PendingChange(id=unconsumed, job="py-kafka-job", type="py_kafka", consumed=False)
    assert c.change_in_job("py-kafka-job", unconsumed, priority=7) == want
    assert c.change_in_job("py-kafka-job", unconsumed, delay=timedelta(hours=1), payload={"v": 2}) == want

    waiting = c.submit_delayed("py_ok", {"v": 1}, delay=timedelta(hours=1), idempotency_key=key())
    got = c.change_in_job("py-ok-job", waiting.id, payload={"v": 2}, priority=7)
    assert isinstance(got, asyncd.TaskStatus), got
    assert (got.id, got.payload, got.priority, got.state) == (waiting.id, {"v": 2}, 7, asyncd.PENDING)
    with pytest.raises(asyncd.InvalidField) as info:
        c.change_in_job("no-such-job", waiting.id, run_now=True)
    assert (info.value.status, info.value.field) == (400, "job")
    c.cancel(waiting.id)


def test_cancel_unique(dev_env):
    """``cancel_unique`` cancels the job's unfinished task holding the key, and only it."""
    env = need(dev_env)
    c = env.client
    ukey = key("cancel-by-key")
    held = c.submit_delayed("py_ok", delay=timedelta(hours=1), unique_key=ukey, idempotency_key=key())
    other = c.submit_delayed("py_ok", delay=timedelta(hours=1), unique_key=key("other"), idempotency_key=key())
    with pytest.raises(asyncd.NotFound):
        c.cancel_unique("py-unique-job", ukey)  # another job's tasks hold no such key
    assert c.cancel_unique("py-ok-job", ukey) == asyncd.CancelResult(id=held.id, state=asyncd.CANCELLED)
    env.wait_state(held.id, asyncd.CANCELLED, 5)
    assert c.get(other.id).state != asyncd.CANCELLED
    with pytest.raises(asyncd.NotFound):
        c.cancel_unique("py-ok-job", ukey)
    c.cancel(other.id)


def test_trigger_cron(dev_env):
    """``trigger_cron`` fires the entry now: a task of the job's type with the entry's
    payload, which the executor runs; each call is a new task."""
    env = need(dev_env)
    c = env.client
    before = datetime.now(timezone.utc)
    fired = c.trigger_cron("py-cron-job", "yearly")
    assert (fired.job, fired.entry, fired.type) == ("py-cron-job", "yearly", "py_cron")
    assert before - timedelta(seconds=1) <= fired.eta <= datetime.now(timezone.utc) + timedelta(seconds=1)
    env.wait_state(fired.id, asyncd.SUCCEEDED)
    assert [r.payload for r in env.runs_of(fired.id)] == [{"report": "annual"}]
    again = c.trigger_cron("py-cron-job", "yearly")
    assert again.id != fired.id
    env.wait_state(again.id, asyncd.SUCCEEDED)
    with pytest.raises(asyncd.NotFound) as info:
        c.trigger_cron("py-cron-job", "hourly")
    assert info.value.field == "entry"
    with pytest.raises(asyncd.NotFound) as info:
        c.trigger_cron("no-such-job", "yearly")
    assert info.value.field == "name"


def test_request_errors(dev_env):
    env = need(dev_env)
    c = env.client
    with pytest.raises(asyncd.UnknownTaskType) as info:
        c.submit("no_such_type", idempotency_key=key())
    assert not isinstance(info.value, asyncd.InvalidField)
    assert (info.value.status, info.value.code, info.value.field) == (400, "unknown_task_type", "type")

    for kwargs, fld in [({"priority": 10}, "priority"), ({"max_retries": 101}, "max_retries"),
                        ({"delay": timedelta(days=401)}, "delay")]:
        with pytest.raises(asyncd.InvalidField) as info:
            c.submit("py_ok", idempotency_key=key(), **kwargs)
        assert (info.value.status, info.value.code, info.value.field) == (400, "invalid_field", fld)
    with pytest.raises(asyncd.InvalidField) as info:
        c.submit("py_ok", idempotency_key="k" * 256)
    assert info.value.field == "idempotency_key"

    with pytest.raises(asyncd.PayloadTooLarge) as info:
        # Over the 1 MiB payload limit, within the body limit (payload + 64 KiB).
        c.submit("py_ok", "x" * ((1 << 20) + 1024), idempotency_key=key())
    assert (info.value.status, info.value.field) == (413, "payload")

    for call in (c.get, c.cancel, c.redrive):
        with pytest.raises(asyncd.NotFound) as info:
            call(UNKNOWN_ID)
        assert (info.value.status, info.value.code) == (404, "not_found")

    with pytest.raises(asyncd.MissingIdempotencyKey):
        c.submit("py_ok", {"a": 1})


def test_unique_conflict(dev_env):
    env = need(dev_env)
    c = env.client
    order = time.time_ns()
    first = c.submit_delayed("py_unique", {"order_id": order}, delay=3600, idempotency_key=key())
    with pytest.raises(asyncd.UniqueConflict) as info:
        c.submit_delayed("py_unique", {"order_id": order}, delay=3600, idempotency_key=key())
    assert info.value.status == 409 and info.value.existing_id == first.id
    assert c.get(first.id).unique_key == f"order:{order}"

    ukey = key("explicit")
    held = c.submit_delayed("py_ok", delay=3600, unique_key=ukey, idempotency_key=key())
    with pytest.raises(asyncd.UniqueConflict):
        c.submit("py_ok", unique_key=ukey, idempotency_key=key())
    c.cancel(held.id)
    again = c.submit("py_ok", unique_key=ukey, idempotency_key=key())
    env.wait_state(again.id, asyncd.SUCCEEDED)
    c.cancel(first.id)


def test_permanent_failure_dead_letters_and_redrive(dev_env):
    env = need(dev_env)
    c = env.client
    res = c.submit("py_permanent", {"order_id": 9}, idempotency_key=key())
    dead = env.wait_state(res.id, asyncd.DEAD)
    assert dead.attempt == 1, "a 422 must not be retried"
    assert "bad order" in (dead.last_error or "")
    items = c.dead_letters(type="py_permanent", limit=1000)
    assert res.id in [i.id for i in items]
    assert all(i.type == "py_permanent" and i.state == asyncd.DEAD for i in items)
    assert len(c.dead_letters(limit=1)) == 1

    rd = c.redrive(res.id)
    assert (rd.id, rd.state) == (res.id, asyncd.PENDING)
    wait_until(lambda: len(env.runs_of(res.id)) == 2, 20, "the redriven task to run")
    again = env.wait_state(res.id, asyncd.DEAD)
    assert again.attempt == 1 and env.runs_of(res.id)[1].ctx.attempt == 1


def test_retries(dev_env):
    env = need(dev_env)
    c = env.client
    flaky = c.submit("py_flaky", idempotency_key=key())
    after = c.submit("py_retry_after", idempotency_key=key())
    always = c.submit("py_always_fails", idempotency_key=key(), max_retries=1)
    assert env.wait_state(flaky.id, asyncd.SUCCEEDED).attempt == 2
    assert env.wait_state(after.id, asyncd.SUCCEEDED).attempt == 2
    runs = env.runs_of(after.id)
    assert runs[1].at - runs[0].at >= timedelta(milliseconds=900), "Retry(after=1s) not honoured"
    dead = env.wait_state(always.id, asyncd.DEAD)
    assert (dead.attempt, dead.max_retries, len(env.runs_of(always.id))) == (2, 1, 2)


def test_expiry(dev_env):
    """Expiry, end to end: while its job is paused no attempt can begin, so a task given
    ``start_within`` or ``expires_at`` ends expired once that passes, with the
    ``expires_at`` the server computed from what the SDK sent, and search finds it by
    state. After the job resumes, a task submitted beside them without expiry runs, and
    the expired ones never reach the executor."""
    env = need(dev_env)
    c = env.client
    job = "py-expiry-job"
    assert c.pause_job(job).paused
    resumed = False
    try:
        within = c.submit("py_expiry", "within", idempotency_key=key(), start_within=timedelta(seconds=1))
        # Milliseconds, as the API keeps times.
        at = (datetime.now(timezone.utc) + timedelta(milliseconds=1500))
        at = at.replace(microsecond=at.microsecond // 1000 * 1000)
        until = c.submit("py_expiry", "until", idempotency_key=key(), expires_at=at)
        control = c.submit("py_expiry", "control", idempotency_key=key())

        # Before expiring: expires_at is start_within after the due time, or the time
        # asked; the control task never expires.
        want = {within.id: within.eta + timedelta(seconds=1), until.id: at}
        for task_id, expires_at in want.items():
            got = c.get(task_id)
            assert got.expires_at == expires_at, (task_id, got)
            assert got.state != asyncd.EXPIRED or datetime.now(timezone.utc) >= expires_at, got
        got = c.get(control.id)
        assert got.expires_at is None and got.state in (asyncd.PENDING, asyncd.CLAIMED), got

        for task_id, expires_at in want.items():
            got = env.wait_state(task_id, asyncd.EXPIRED)
            assert (got.expires_at, got.attempt) == (expires_at, 0), got
            assert got.updated_at is not None and got.updated_at >= expires_at, got
        page = c.search(type="py_expiry", state=asyncd.EXPIRED, limit=1000)
        assert set(want) <= {t.id for t in page.items}, page
        assert all(t.state == asyncd.EXPIRED for t in page.items), page

        c.resume_job(job)
        resumed = True
    finally:
        if not resumed:
            c.resume_job(job)
    env.wait_state(control.id, asyncd.SUCCEEDED)
    assert [r.payload for r in env.runs_of(control.id)] == ["control"]
    for task_id in want:
        assert env.runs_of(task_id) == [], f"expired task {task_id} reached the executor"
        assert c.get(task_id).state == asyncd.EXPIRED


def test_expiry_ends_a_retry(dev_env):
    """Expiry counts retries: a task whose first attempt asks to be retried after its
    expiry ends expired after that one attempt, without a second call."""
    env = need(dev_env)
    # Long enough for the first attempt to begin on a loaded machine; the retry asked
    # for is due 30 s after it, past the expiry.
    res = env.client.submit("py_expiry", "retry", idempotency_key=key(), start_within=5)
    got = env.wait_state(res.id, asyncd.EXPIRED, 30)
    assert (got.attempt, got.expires_at) == (1, res.eta + timedelta(seconds=5)), got
    assert [r.ctx.attempt for r in env.runs_of(res.id)] == [1]


def test_expiry_refusals(dev_env):
    """``expires_at`` and ``start_within`` together never reach the server (whose own
    refusal would be an ``InvalidField`` naming start_within): no task is stored under
    the key. An ``expires_at`` not after the task is due is the server's to refuse,
    naming expires_at."""
    env = need(dev_env)
    c = env.client
    k = key("both")
    with pytest.raises(ValueError, match="not both") as info:
        c.submit("py_ok", idempotency_key=k, expires_at=datetime.now(timezone.utc) + timedelta(hours=1),
                 start_within=60)
    assert not isinstance(info.value, asyncd.APIError)
    assert k not in {t.idempotency_key for t in c.search(type="py_ok", limit=1000).items}

    for kwargs in ({"expires_at": datetime.now(timezone.utc) - timedelta(minutes=1)},
                   {"expires_at": datetime.now(timezone.utc) + timedelta(minutes=1), "delay": "1h"}):
        with pytest.raises(asyncd.InvalidField) as err:
            c.submit("py_ok", idempotency_key=key(), **kwargs)
        assert (err.value.status, err.value.field) == (400, "expires_at")


def tasks_of(env: Env, task_type: str, since: Optional[datetime] = None) -> List[asyncd.TaskStatus]:
    """The tasks of ``task_type`` (created after ``since``), newest first."""
    page = env.client.search(type=task_type, created_after=since, limit=1000)
    assert page.next_cursor is None, f"more than 1000 {task_type} tasks"
    return page.items


def assert_eta_near(eta: datetime, before: datetime, after: datetime, span: timedelta) -> None:
    """A due time the server set to its clock at the submit plus ``span``: the submit
    happened between ``before`` and ``after`` on this machine's clock, and the API keeps
    milliseconds."""
    lo = before.replace(microsecond=before.microsecond // 1000 * 1000) + span
    assert lo <= eta <= after + span, (eta, lo, after + span)


def test_debounce_trailing(dev_env):
    """Trailing debounce, end to end. With the job paused nothing can begin, so every
    submit of the key lands while its task waits: the first stores the task (not
    debounced), the next two are folded into it (``debounced``, the same id, the due time
    moved to the period after each), and the task holds the last payload. Once the job
    resumes the executor runs that one task exactly once, with the last payload; no other
    task was stored for the three submits."""
    env = need(dev_env)
    c = env.client
    job = "py-debounce-job"
    assert c.pause_job(job).paused
    resumed = False
    try:
        since = datetime.now(timezone.utc) - timedelta(milliseconds=1)
        period = timedelta(milliseconds=500)
        deb = asyncd.Debounce(key("user"), period, max_delay=timedelta(minutes=1))
        payloads = [{"user_id": 7, "edit": e} for e in ("first", "second", "third")]
        results = []
        for i, p in enumerate(payloads):
            before = datetime.now(timezone.utc)
            res = c.submit("py_debounce", p, idempotency_key=key(), debounce=deb)
            assert_eta_near(res.eta, before, datetime.now(timezone.utc), period)
            assert (res.debounced, res.dropped, res.duplicate) == (i > 0, False, False), (i, res)
            results.append(res)
        first, last = results[0], results[-1]
        assert {r.id for r in results} == {first.id}, results

        # Still waiting: one task for the three submits, carrying the last payload, due
        # when the last answer said.
        got = c.get(first.id)
        assert got.state in (asyncd.PENDING, asyncd.CLAIMED), got
        assert (got.payload, got.eta) == (payloads[-1], last.eta), got
        assert [t.id for t in tasks_of(env, "py_debounce", since)] == [first.id]

        c.resume_job(job)
        resumed = True
    finally:
        if not resumed:
            c.resume_job(job)
    done = env.wait_state(first.id, asyncd.SUCCEEDED)
    assert done.attempt == 1, done
    assert [r.payload for r in env.runs_of(first.id)] == [payloads[-1]], "run exactly once, with the last payload"
    assert [t.id for t in tasks_of(env, "py_debounce", since)] == [first.id]


def test_debounce_leading(dev_env):
    """Leading debounce: the first submit of a key is stored and runs as submitted; one
    within the period of it stores nothing and answers ``dropped`` with the stored
    task's id and the end of the quiet period it extended."""
    env = need(dev_env)
    c = env.client
    deb = asyncd.Debounce(key("user"), timedelta(minutes=1), mode=asyncd.LEADING)
    first = c.submit("py_window", "leading-first", idempotency_key=key(), debounce=deb)
    assert not first.dropped and not first.debounced, first
    k = key()
    before = datetime.now(timezone.utc)
    again = c.submit("py_window", "leading-second", idempotency_key=k, debounce=deb)
    assert (again.dropped, again.debounced, again.duplicate, again.id) == (True, False, False, first.id), again
    assert_eta_near(again.eta, before, datetime.now(timezone.utc), timedelta(minutes=1))
    assert k not in {t.idempotency_key for t in tasks_of(env, "py_window")}
    env.wait_state(first.id, asyncd.SUCCEEDED)
    assert [r.payload for r in env.runs_of(first.id)] == ["leading-first"]


def test_throttle(dev_env):
    """Throttle: within the period of the key's stored task, a submit with
    ``on_limit=REFUSE`` raises :class:`asyncd.Throttled` (409, field throttle) whose
    ``existing_id`` is that task; with ``on_limit=DROP`` it answers ``dropped`` with that
    task's id and the window's end. Neither stores anything; the stored tasks run with
    their own payloads."""
    env = need(dev_env)
    c = env.client
    refuse = asyncd.Throttle(key("user"), timedelta(minutes=1))
    first = c.submit("py_window", "throttle-first", idempotency_key=key(), throttle=refuse)
    assert not first.dropped and not first.debounced, first
    refused_key = key()
    with pytest.raises(asyncd.Throttled) as info:
        c.submit("py_window", "throttle-second", idempotency_key=refused_key, throttle=refuse)
    e = info.value
    assert (e.status, e.code, e.field, e.existing_id, e.retryable) == (409, "throttled", "throttle", first.id, False)

    drop = asyncd.Throttle(key("user"), 60, on_limit=asyncd.DROP)
    before = datetime.now(timezone.utc)
    kept = c.submit("py_window", "throttle-kept", idempotency_key=key(), throttle=drop)
    after = datetime.now(timezone.utc)
    assert not kept.dropped and not kept.debounced, kept
    dropped_key = key()
    dropped = c.submit("py_window", "throttle-dropped", idempotency_key=dropped_key, throttle=drop)
    assert (dropped.dropped, dropped.debounced, dropped.duplicate, dropped.id) == (True, False, False, kept.id), dropped
    # A throttle's window is counted from the submit that stored the task.
    assert_eta_near(dropped.eta, before, after, timedelta(minutes=1))
    stored = {t.idempotency_key for t in tasks_of(env, "py_window")}
    assert refused_key not in stored and dropped_key not in stored

    for task_id, payload in ((first.id, "throttle-first"), (kept.id, "throttle-kept")):
        env.wait_state(task_id, asyncd.SUCCEEDED)
        assert [r.payload for r in env.runs_of(task_id)] == [payload]


def test_debounce_refusals(dev_env):
    """A debounce with a throttle never reaches the server (whose own refusal would be an
    ``InvalidField`` naming throttle): nothing is stored under the key. The values are the
    server's to refuse, each naming its field: a trailing debounce with a delay, a
    debounce waiting on another task, a cap below the period."""
    env = need(dev_env)
    c = env.client
    k = key("both")
    with pytest.raises(ValueError, match="not both") as info:
        c.submit("py_window", idempotency_key=k, debounce=asyncd.Debounce("u", 1), throttle=asyncd.Throttle("u", 1))
    assert not isinstance(info.value, asyncd.APIError)
    assert k not in {t.idempotency_key for t in tasks_of(env, "py_window")}

    trailing = asyncd.Debounce(key("user"), 1)
    for kwargs, field in (({"debounce": trailing, "delay": 60}, "delay"),
                          ({"debounce": trailing, "depends_on": [UNKNOWN_ID]}, "depends_on"),
                          ({"debounce": asyncd.Debounce(key("user"), 60, max_delay=1)}, "debounce.max_delay")):
        with pytest.raises(asyncd.InvalidField) as err:
            c.submit("py_window", idempotency_key=key(), **kwargs)
        assert (err.value.status, err.value.field) == (400, field), kwargs


def test_submit_batch(dev_env):
    env = need(dev_env)
    c = env.client
    seen_key = key("seen")
    seen = c.submit("py_ok", "first", idempotency_key=seen_key)
    res = c.submit_batch([
        asyncd.Task("py_ok", {"n": 1}, idempotency_key=key()),
        {"type": "no_such_type", "idempotency_key": key()},
        asyncd.Task("py_ok", idempotency_key=key(), delay=timedelta(hours=1)),
        asyncd.Task("py_ok", "first", idempotency_key=seen_key),
    ])
    assert [r.status for r in res] == [201, 400, 201, 200]
    assert isinstance(res[1].error, asyncd.UnknownTaskType) and res[1].error.field == "type"
    assert res[2].result.eta > datetime.now(timezone.utc) + timedelta(minutes=59)
    assert res[3].result.duplicate and res[3].result.id == seen.id
    env.wait_state(res[0].result.id, asyncd.SUCCEEDED)
    c.cancel(res[2].result.id)


def test_depends_on(dev_env):
    env = need(dev_env)
    c = env.client
    parent = c.submit_delayed("py_ok", delay=1.5, idempotency_key=key())
    child = c.submit("py_ok", idempotency_key=key(), depends_on=[parent.id])
    got = c.get(child.id)
    assert got.state == asyncd.BLOCKED and got.depends_on == [parent.id]
    env.wait_state(child.id, asyncd.SUCCEEDED)
    assert env.runs_of(child.id)[0].at >= env.runs_of(parent.id)[0].at

    doomed = c.submit_delayed("py_ok", delay=3600, idempotency_key=key())
    orphan = c.submit("py_ok", idempotency_key=key(), depends_on=[doomed.id])
    c.cancel(doomed.id)
    dead = env.wait_state(orphan.id, asyncd.DEAD)
    assert "dependency" in (dead.last_error or "") and env.runs_of(orphan.id) == []


def test_long_running_keeps_lease(dev_env):
    env = need(dev_env)
    c = env.client
    # A short timeout keeps the attempt's first lease (timeout + the dispatcher's grace)
    # short enough to outlast here.
    res = c.submit("py_long", {"rows": 3}, idempotency_key=key(), timeout=1)
    wait_until(lambda: len(env.runs_of(res.id)) == 1, 20, "the long-running handler to start")
    # Hold the handler until its first lease has lapsed by a margin longer than the
    # rescuer's pass: only heartbeats keep the attempt alive past it (a lapsed lease
    # would start attempt 2), and they move lease_until forward.
    first = c.get(res.id)
    assert (first.state, first.attempt) == (asyncd.RUNNING, 1) and first.raw.get("lease_until"), first.raw
    first_until = parse_time(first.raw["lease_until"])
    deadline = first_until + timedelta(seconds=20)
    while True:
        got = c.get(res.id)
        assert (got.state, got.attempt) == (asyncd.RUNNING, 1) and got.raw.get("lease_until"), (
            f"while the handler works (first lease until {first_until}): {got.raw}\n{env.server.log_tail()}")
        now = datetime.now(timezone.utc)
        if now > first_until + timedelta(seconds=1):
            assert parse_time(got.raw["lease_until"]) > now, f"the lease was not extended: {got.raw}"
            break
        assert now < deadline, f"first lease_until {first_until} never passed"
        time.sleep(0.1)
    env.release(res.id).set()
    done = env.wait_state(res.id, asyncd.SUCCEEDED)
    assert done.attempt == 1 and len(env.runs_of(res.id)) == 1
    assert done.result == {"done": True}, "the handler's return value is posted as the result's output"


def test_cancel_running_task_cancels_the_handler(dev_env):
    """Issue 15: a task cancelled while its handler runs is cancelled in the handler: the
    executor helper learns it on its next heartbeat (410 task_cancelled), sets
    ``ctx.cancelled`` and cancels the coroutine; the task ends cancelled after one attempt."""
    env = need(dev_env)
    c = env.client
    res = c.submit("py_cancel", {"rows": 1}, idempotency_key=key())
    wait_until(lambda: len(env.runs_of(res.id)) == 1, 20, "the handler to start")
    assert c.get(res.id).state == asyncd.RUNNING
    c.cancel(res.id)
    assert env.cancel_seen(res.id).wait(20), f"the handler was not cancelled within 20 s\n{env.server.log_tail()}"
    run = env.runs_of(res.id)[0]
    assert run.ctx.cancelled.is_set() and run.ctx.cancel_reason == "the task was cancelled in asyncd", run.ctx.cancel_reason
    done = env.wait_state(res.id, asyncd.CANCELLED, 5)
    assert done.attempt == 1 and len(env.runs_of(res.id)) == 1


def test_source_service_metric(dev_env):
    env = need(dev_env)
    env.client.submit("py_ok", idempotency_key=key())
    with urllib.request.urlopen(env.server.endpoint + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    assert any(
        line.startswith("asyncd_task_submitted_total{") and 'source_service="py-it"' in line and 'task_type="py_ok"' in line
        for line in text.splitlines()
    ), text


def test_concurrent_submits_share_calls_and_keep_their_own_answers(dev_env):
    """Many threads submitting through one call at a time: the submits share batch calls,
    and each still gets exactly what it would alone."""
    env = need(dev_env)
    c = asyncd.Client(env.server.endpoint, timeout=30, token_file=None, submit_calls=1)
    paths: Dict[str, int] = {}
    lock = threading.Lock()
    send = c._send

    def counting(method: str, path: str, *args: Any) -> Any:
        with lock:
            paths[path] = paths.get(path, 0) + 1
        return send(method, path, *args)

    c._send = counting  # type: ignore[method-assign]
    base = key("co")
    # Stored before the threads start, so that another payload under its key is refused
    # whichever order the concurrent submits reach the API in.
    taken = env.client.submit("py_ok", {"n": -1}, idempotency_key=f"{base}-taken", delay=timedelta(hours=1))
    n = 200
    answers: List[Any] = [None] * n

    def one(i: int) -> None:
        typ, payload, k = "py_ok", {"n": i}, f"{base}-{i}"
        if i == 7:  # the same key and payload as task 6: the same task
            payload, k = {"n": 6}, f"{base}-6"
        elif i == 8:  # a stored task's key with another payload: refused
            k = f"{base}-taken"
        elif i == 9:
            typ = "no_such_type"
        try:
            answers[i] = c.submit(typ, payload, idempotency_key=k, delay=timedelta(hours=1))
        except Exception as e:  # noqa: BLE001 - checked below
            answers[i] = e

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
        assert not t.is_alive(), "a submit did not return within 60 s"

    ids: Dict[str, int] = {}
    for i, a in enumerate(answers):
        if i in (7, 8, 9):
            continue
        assert isinstance(a, asyncd.SubmitResult) and a.id, (i, a)
        assert a.id not in ids, f"submits {ids.get(a.id)} and {i} answered the same id {a.id}"
        ids[a.id] = i
    six, seven = answers[6], answers[7]
    assert isinstance(seven, asyncd.SubmitResult) and seven.id == six.id and seven.duplicate != six.duplicate, \
        (six, seven)
    assert isinstance(answers[8], asyncd.IdempotencyMismatch), answers[8]
    assert (answers[8].status, answers[8].field, answers[8].existing_id) == (409, "idempotency_key", taken.id)
    assert isinstance(answers[9], asyncd.UnknownTaskType), answers[9]
    assert (answers[9].status, answers[9].field) == (400, "type")
    for i in (0, 6, 150, n - 1):
        got = env.client.get(answers[i].id)
        assert (got.payload, got.state, got.idempotency_key) == ({"n": i}, asyncd.PENDING, f"{base}-{i}"), (i, got)
    batches, singles = paths.get("/v1/tasks:batch", 0), paths.get("/v1/tasks", 0)
    assert batches > 0 and batches + singles < n // 2, \
        f"{batches} batch calls and {singles} single calls for {n} concurrent submits: they did not share calls"
    for task_id in [*ids, taken.id]:
        try:
            env.client.cancel(task_id)
        except asyncd.NotCancellable:
            pass


def test_transport_error_on_dead_endpoint():
    with pytest.raises(asyncd.TransportError):
        asyncd.Client("http://127.0.0.1:1", timeout=2).submit("py_ok", idempotency_key="k")


def test_batch_delivery(tmp_path):
    """A job with ``executor.batch`` gets its due tasks several to a call (docs/api.md,
    "Batch delivery"); the helper runs the unchanged handler once per task and answers
    each outcome. Its own asyncd dev: the job config needs a server that knows
    ``executor.batch``, and the other tests' server must not depend on it."""
    server = DevServer(tmp_path, signing={SECRET_NAME: {"key": SECRET}})
    client = asyncd.Client(server.endpoint, service_name="py-it-batch", signing_secret=SECRET, timeout=10)
    lock = threading.Lock()
    #: Tasks per call: Asyncd-Batch, or 1 for a single call.
    call_sizes: List[int] = []
    runs: Dict[str, List[asyncd.TaskContext]] = {}

    @client.executor("py_batch")
    def handler(payload: Any, ctx: asyncd.TaskContext) -> None:
        with lock:
            runs.setdefault(ctx.id, []).append(ctx)
        if payload["n"] % 10 == 0 and ctx.attempt == 1:
            raise asyncd.Retry(message="first attempts of every tenth task are retried")

    app = client.wsgi_app()

    def counting_app(environ: Dict[str, Any], start_response: Any) -> Any:
        with lock:
            call_sizes.append(int(environ.get("HTTP_ASYNCD_BATCH", "1")))
        return app(environ, start_response)

    class Quiet(WSGIRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

    executor = make_server("127.0.0.1", 0, counting_app, server_class=asyncd.ThreadingWSGIServer, handler_class=Quiet)
    threading.Thread(target=executor.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    doc = asyncd.job_config_yaml(
        "py-batch-job", "py_batch", f"http://127.0.0.1:{executor.server_port}/tasks/py_batch",
        timeout=10, signing_secret=SECRET_NAME, batch_max_tasks=10, batch_max_wait="200ms",
        max_retries=2, backoff="fixed", initial_backoff=0.2,
    )
    assert "    batch:\n      maxTasks: 10\n      maxWait: \"200ms\"\n" in doc
    (server.config_dir / "py_batch.yaml").write_text(doc)
    try:
        server.start()
        res = client.submit_batch([asyncd.Task("py_batch", {"n": n}, idempotency_key=key(f"batch-{n}"))
                                   for n in range(25)])
        assert [r.status for r in res] == [201] * 25, [r.error for r in res]
        ids = {r.result.id: n for r, n in zip(res, range(25))}

        deadline = time.monotonic() + 30
        pending = set(ids)
        while pending:
            for task_id in list(pending):
                st = client.get(task_id)
                if st.state == asyncd.SUCCEEDED:
                    pending.discard(task_id)
                elif st.state in (asyncd.DEAD, asyncd.CANCELLED):
                    pytest.fail(f"task {task_id} is {st.state}: {st.last_error}\n{server.log_tail()}")
            if pending and time.monotonic() > deadline:
                pytest.fail(f"{len(pending)} of 25 batch tasks not succeeded within 30s (calls seen: {call_sizes})\n"
                            f"{server.log_tail()}")
            time.sleep(0.05)

        with lock:
            sizes, seen = list(call_sizes), {k: list(v) for k, v in runs.items()}
        print(f"tasks per executor call: {sizes}")
        assert sizes and max(sizes) > 1, f"no call carried more than one task: {sizes}"
        assert max(sizes) <= 10, f"a call carried more than maxTasks: {sizes}"
        assert sum(sizes) == 25 + 3, f"25 first attempts and 3 retries, each in one call: {sizes}"
        for task_id, n in ids.items():
            got = client.get(task_id)
            want_attempts = 2 if n % 10 == 0 else 1
            assert got.attempt == want_attempts and len(seen[task_id]) == want_attempts, (task_id, got.raw)
            ctx = seen[task_id][-1]
            assert (ctx.id, ctx.type, ctx.attempt, ctx.idempotency_key) == (task_id, "py_batch", want_attempts,
                                                                           got.idempotency_key)
            assert ctx.lease_token and ctx.callback_url == server.endpoint
        assert len({c.lease_token for v in seen.values() for c in v}) == 28, "each attempt has its own lease token"
    finally:
        server.stop()
        executor.shutdown()
        executor.server_close()


# -- schedules (/v1/schedules), on the job py-sched-job ------------------------------

SCHED_JOB = "py-sched-job"


def wait_schedule(env: Env, name: str, cond: Any, timeout: float = 30.0) -> asyncd.Schedule:
    """Polls the schedule until ``cond(schedule)``, failing with its last seen shape."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = env.client.get_schedule(SCHED_JOB, name)
            if cond(last):
                return last
        except asyncd.AsyncdError as e:
            last = e
        time.sleep(0.05)
    pytest.fail(f"schedule {name} not as wanted within {timeout}s: last {last!r}\n{env.server.log_tail()}")


def test_schedule_fires(dev_env):
    """A schedule every second fires: its task, its payload's templates rendered, runs on
    the executor. Deleted, it is gone; the task it created stays."""
    env = need(dev_env)
    c = env.client
    name = key("every-second")
    s = c.create_schedule(SCHED_JOB, name, every="1s", overlap=asyncd.SKIP,  # each firing when due
                          payload={"customer": 42, "at": "{{scheduled_at}}", "schedule": "{{schedule}}"})
    assert (s.job, s.name, s.type, s.source, s.every, s.overlap, s.paused) == (
        SCHED_JOB, name, "py_sched", asyncd.SOURCE_API, "1s", asyncd.SKIP, False)
    fired = wait_schedule(env, name, lambda s: s.fired >= 1 and s.last_task_id)
    assert fired.last_firing is not None
    task = c.get(fired.last_task_id)
    assert task.type == "py_sched"
    assert (task.payload["customer"], task.payload["schedule"]) == (42, name)
    assert parse_time(task.payload["at"]).tzinfo is not None and task.payload["at"].endswith("Z")
    env.wait_state(task.id, asyncd.SUCCEEDED)

    c.delete_schedule(SCHED_JOB, name)
    with pytest.raises(asyncd.NotFound) as info:
        c.get_schedule(SCHED_JOB, name)
    assert info.value.field == "name"
    with pytest.raises(asyncd.NotFound):
        c.delete_schedule(SCHED_JOB, name)
    assert c.get(task.id).id == task.id


def test_schedule_lifecycle(dev_env):
    """Put, create, change, pause, resume, trigger and the refusals, on one schedule."""
    env = need(dev_env)
    c = env.client
    name = key("customer")
    # Hourly from a start a day ahead, so that nothing fires during the test.
    start = (datetime.now(timezone.utc) + timedelta(days=1)).replace(microsecond=0)
    spec: Dict[str, Any] = dict(every=timedelta(hours=1), start_at=start, payload={"customer": 7}, priority=2,
                                catch_up=0, jitter=timedelta(seconds=90))
    s, created = c.put_schedule(SCHED_JOB, name, **spec)
    assert created
    assert (s.priority, s.catch_up, s.jitter, s.start_at, s.end_at) == (2, "0s", "1m 30s", start, None)
    assert s.next_firing is not None and s.next_firing >= start
    s, created = c.put_schedule(SCHED_JOB, name, **dict(spec, priority=4))
    assert not created and s.priority == 4

    with pytest.raises(asyncd.ScheduleExists) as exists:
        c.create_schedule(SCHED_JOB, name, **spec)
    assert (exists.value.status, exists.value.field, exists.value.retryable) == (409, "name", False)

    s = c.change_schedule(SCHED_JOB, name, priority=6, jitter=None)
    assert (s.priority, s.jitter, s.every) == (6, None, "1h")
    got = c.get_schedule(SCHED_JOB, name)
    assert (got.priority, got.jitter) == (6, None)
    s = c.change_schedule(SCHED_JOB, name, cron="CRON_TZ=Europe/Berlin 0 9 * * MON")  # cron replaces every
    assert (s.cron, s.every) == ("CRON_TZ=Europe/Berlin 0 9 * * MON", None)

    s = c.pause_schedule(SCHED_JOB, name)
    assert s.paused and s.next_firing is None
    got = c.get_schedule(SCHED_JOB, name)
    assert got.paused and got.next_firing is None
    s = c.resume_schedule(SCHED_JOB, name)
    assert not s.paused and s.next_firing is not None

    before = datetime.now(timezone.utc)
    fired = c.trigger_schedule(SCHED_JOB, name)
    assert (fired.job, fired.entry, fired.type) == (SCHED_JOB, name, "py_sched")
    assert before - timedelta(seconds=1) <= fired.eta <= datetime.now(timezone.utc) + timedelta(seconds=1)
    task = c.get(fired.id)
    assert (task.type, task.priority) == ("py_sched", 6)
    env.wait_state(fired.id, asyncd.SUCCEEDED)
    assert [r.payload for r in env.runs_of(fired.id)] == [{"customer": 7}]

    # A bad spec is refused naming the member; nothing is created.
    bad = key("bad")
    with pytest.raises(asyncd.InvalidField) as info:
        c.create_schedule(SCHED_JOB, bad, cron="0 9 * * MON")
    assert (info.value.status, info.value.field) == (400, "cron")
    with pytest.raises(asyncd.InvalidField) as info:
        c.put_schedule(SCHED_JOB, bad, every=0.5)
    assert info.value.field == "every"
    with pytest.raises(asyncd.MalformedJSON) as malformed:
        c.change_schedule(SCHED_JOB, name, no_such_member=1)
    assert malformed.value.field == "no_such_member"
    with pytest.raises(asyncd.NotFound):
        c.get_schedule(SCHED_JOB, bad)
    with pytest.raises(asyncd.NotFound) as info:
        c.create_schedule("no-such-job", bad, every="1h")
    assert info.value.field == "job"

    c.delete_schedule(SCHED_JOB, name)
    with pytest.raises(asyncd.NotFound):
        c.get_schedule(SCHED_JOB, name)


def test_list_schedules(dev_env):
    """Pages of one schedule each, followed by their cursors, list every schedule of the
    job once — the config's entry among them — as one page and iter_schedules do."""
    env = need(dev_env)
    c = env.client
    prefix = key("list")
    mine = [f"{prefix}-{x}" for x in "abc"]
    for name in mine:
        c.create_schedule(SCHED_JOB, name, every="1h", paused=True)
    try:
        paged: List[str] = []
        cursor: Optional[str] = None
        for _ in range(1000):
            page = c.list_schedules(SCHED_JOB, cursor=cursor, limit=1)
            assert len(page.items) <= 1
            assert all(s.job == SCHED_JOB for s in page.items)
            paged += [s.name for s in page.items]
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
        else:
            pytest.fail(f"no last page: {paged}")
        assert paged == sorted(paged) and len(paged) == len(set(paged)), paged
        assert set(mine) | {"nightly"} <= set(paged)

        whole = c.list_schedules(SCHED_JOB, limit=asyncd.MAX_SCHEDULE_PAGE)
        assert whole.next_cursor is None and [s.name for s in whole.items] == paged
        walked = list(c.iter_schedules(SCHED_JOB))
        assert [s.name for s in walked] == paged
        assert {s.name: s.source for s in walked}["nightly"] == asyncd.SOURCE_CONFIG

        async def walk_async() -> List[str]:
            ac = asyncd.AsyncClient(env.server.endpoint, timeout=10)
            return [s.name async for s in ac.iter_schedules(SCHED_JOB, page_size=2)]

        assert asyncio.run(walk_async()) == paged
        with pytest.raises(asyncd.InvalidField) as info:
            c.list_schedules(SCHED_JOB, limit=asyncd.MAX_SCHEDULE_PAGE + 1)
        assert info.value.field == "limit"
    finally:
        for name in mine:
            c.delete_schedule(SCHED_JOB, name)


def test_backfill_schedule(dev_env):
    """A backfill creates the firings of a past range once: repeated, it creates none."""
    env = need(dev_env)
    c = env.client
    name = key("backfill")
    # Hourly since a start a month ago (an ``every`` schedule has no firing before it).
    start = (datetime.now(timezone.utc) - timedelta(days=30)).replace(minute=0, second=0, microsecond=0)
    c.create_schedule(SCHED_JOB, name, every="1h", start_at=start, catch_up=0, payload={"at": "{{scheduled_at}}"})
    try:
        frm, to = start + timedelta(days=1), start + timedelta(days=1, hours=5)
        first = c.backfill_schedule(SCHED_JOB, name, frm, to)
        assert first.firings == 5 and first.created == first.firings
        assert c.backfill_schedule(SCHED_JOB, name, frm, to) == asyncd.BackfillResult(firings=5, created=0)
        assert c.backfill_schedule(SCHED_JOB, name, frm, to + timedelta(hours=1)) == asyncd.BackfillResult(6, 1)
        with pytest.raises(asyncd.InvalidField) as info:
            c.backfill_schedule(SCHED_JOB, name, to, frm)
        assert info.value.field == "to"
        with pytest.raises(asyncd.InvalidField) as info:
            c.backfill_schedule(SCHED_JOB, name, start, start + timedelta(hours=asyncd.MAX_BACKFILL + 1))
        assert info.value.field == "to"
    finally:
        c.delete_schedule(SCHED_JOB, name)


def test_config_schedule_is_read_only(dev_env):
    """The job's spec.cron entry is a schedule of source config: read-only here, but it
    can be triggered and backfilled."""
    env = need(dev_env)
    c = env.client
    s = c.get_schedule(SCHED_JOB, "nightly")
    assert (s.source, s.cron, s.type, s.payload) == (asyncd.SOURCE_CONFIG, NIGHTLY["schedule"], "py_sched",
                                                     NIGHTLY["payload"])
    for call in (lambda: c.change_schedule(SCHED_JOB, "nightly", priority=5),
                 lambda: c.pause_schedule(SCHED_JOB, "nightly"), lambda: c.resume_schedule(SCHED_JOB, "nightly"),
                 lambda: c.delete_schedule(SCHED_JOB, "nightly"),
                 lambda: c.put_schedule(SCHED_JOB, "nightly", every="1h")):
        with pytest.raises(asyncd.ScheduleReadOnly) as info:
            call()
        assert (info.value.status, info.value.retryable) == (409, False)
    with pytest.raises(asyncd.ScheduleExists):
        c.create_schedule(SCHED_JOB, "nightly", every="1h")

    fired = c.trigger_schedule(SCHED_JOB, "nightly")
    assert (fired.entry, fired.type) == ("nightly", "py_sched")
    env.wait_state(fired.id, asyncd.SUCCEEDED)
    assert [r.payload for r in env.runs_of(fired.id)] == [NIGHTLY["payload"]]
    # Two new years in [2020, 2022); a repeat creates none.
    frm, to = datetime(2020, 1, 1, tzinfo=timezone.utc), datetime(2022, 1, 1, tzinfo=timezone.utc)
    assert c.backfill_schedule(SCHED_JOB, "nightly", frm, to).firings == 2
    assert c.backfill_schedule(SCHED_JOB, "nightly", frm, to) == asyncd.BackfillResult(firings=2, created=0)
    after = c.get_schedule(SCHED_JOB, "nightly")
    assert (after.priority, after.paused) == (s.priority, False)


def test_async_client_schedules(dev_env):
    """The AsyncClient's schedule calls against the server."""
    env = need(dev_env)
    name = key("async")

    async def main() -> None:
        ac = asyncd.AsyncClient(env.server.endpoint, timeout=10)
        s, created = await ac.put_schedule(SCHED_JOB, name, every="1h", paused=True)
        assert created and s.paused
        s = await ac.change_schedule(SCHED_JOB, name, priority=3)
        assert s.priority == 3 and (await ac.get_schedule(SCHED_JOB, name)).priority == 3
        assert not (await ac.resume_schedule(SCHED_JOB, name)).paused
        assert (await ac.pause_schedule(SCHED_JOB, name)).paused
        fired = await ac.trigger_schedule(SCHED_JOB, name)
        assert fired.entry == name
        await ac.delete_schedule(SCHED_JOB, name)
        with pytest.raises(asyncd.NotFound):
            await ac.get_schedule(SCHED_JOB, name)

    asyncio.run(main())
