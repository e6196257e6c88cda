"""Serving asyncd's executor contract: signature check, dispatch by task type, and
the mapping of a handler's outcome onto HTTP answers (docs/api.md)."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import inspect
import json
import logging
import math
import socketserver
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Awaitable, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server as _make_server

from ._errors import (
    APIError,
    BadSignature,
    MalformedTimestamp,
    NotFound,
    Replayed,
    StaleLease,
    StaleTimestamp,
    TaskCancelled,
    TransportError,
    error_from_response,
    parse_retry_after,
)
from ._time import Duration, duration_seconds, format_duration, parse_duration, parse_time

log = logging.getLogger("asyncd")

SIGNATURE_TOLERANCE = timedelta(minutes=5)
"""How far Asyncd-Timestamp may be from the executor's clock: beyond it a call is
refused as stale, and within it the same (task, attempt) is refused as a replay."""

MAX_REPLAY_ENTRIES = 100_000
"""The (task, attempt) pairs a :class:`Verifier` remembers. An entry is kept only until
its call's timestamp leaves the window (the call is refused as stale after that), so
the bound is reached only past about 160 verified calls per second sustained over a
window; it keeps the cache to some tens of MiB whatever callers send. Past it the
oldest entries are forgotten first."""

DEFAULT_LEASE = timedelta(seconds=30)

DEFAULT_BATCH_CONCURRENCY = 64
"""How many tasks of one batch call an :class:`Executor` runs at a time, by default."""

_MAX_BODY = 32 << 20

_SIGNED_HEADERS = (
    "asyncd-timestamp",
    "asyncd-task-id",
    "asyncd-attempt",
    "idempotency-key",
    "asyncd-lease-token",
    "asyncd-callback-url",
)

Key = Union[str, bytes]
Keys = Union[Key, Sequence[Key]]


def _keys(keys: Optional[Keys]) -> List[bytes]:
    if keys is None:
        return []
    if isinstance(keys, (str, bytes)):
        keys = [keys]
    return [k.encode() if isinstance(k, str) else bytes(k) for k in keys]


def _lower(headers: Mapping[str, str]) -> Dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}


def canonical_string(headers: Mapping[str, str], body: bytes) -> bytes:
    """The bytes Asyncd-Signature covers: the values of Asyncd-Timestamp,
    Asyncd-Task-Id, Asyncd-Attempt, Idempotency-Key, Asyncd-Lease-Token and
    Asyncd-Callback-Url, exactly as sent, each followed by a line feed, then the body."""
    h = _lower(headers)
    return b"".join(h.get(name, "").encode() + b"\n" for name in _SIGNED_HEADERS) + body


BATCH_HEADER = "Asyncd-Batch"
"""Marks a batch call (a job with ``executor.batch``): its value is the number of tasks
in the body, ``{"tasks": [...]}``, and the call carries no per-task headers."""


def _batch_headers(headers: Mapping[str, str]) -> Dict[str, str]:
    """A batch call's headers as its signature covers them: the per-task fields empty,
    whatever the call carries in their place (each task's are in the signed body)."""
    h = _lower(headers)
    for name in _SIGNED_HEADERS[1:5]:
        h.pop(name, None)
    return h


def batch_canonical_string(headers: Mapping[str, str], body: bytes) -> bytes:
    """The bytes a batch call's Asyncd-Signature covers: :func:`canonical_string` with
    Asyncd-Task-Id, Asyncd-Attempt, Idempotency-Key and Asyncd-Lease-Token empty, i.e.
    ``<timestamp>\\n\\n\\n\\n\\n<callback url>\\n<body>``."""
    return canonical_string(_batch_headers(headers), body)


def sign(keys: Keys, headers: Mapping[str, str], body: bytes) -> str:
    """The Asyncd-Signature value asyncd sends for a call with these headers and body:
    ``"v2=" + hex HMAC-SHA256(key, canonical_string)`` per key, comma-separated."""
    canonical = canonical_string(headers, body)
    return ",".join("v2=" + hmac.new(k, canonical, hashlib.sha256).hexdigest() for k in _keys(keys))


def _verify(keys: List[bytes], headers: Mapping[str, str], body: bytes, now: Optional[float]) -> int:
    usable = [k for k in keys if k]
    if not usable:
        raise BadSignature("no signing key configured")
    h = _lower(headers)
    try:
        ts = int((h.get("asyncd-timestamp") or "").strip())
    except ValueError:
        raise MalformedTimestamp("missing or malformed Asyncd-Timestamp") from None
    now = time.time() if now is None else now
    if abs(now - ts) > SIGNATURE_TOLERANCE.total_seconds():
        raise StaleTimestamp("timestamp more than 5 minutes off")
    canonical = canonical_string(h, body)
    sent = []
    for part in (h.get("asyncd-signature") or "").split(","):
        part = part.strip()
        if part.startswith("v2="):
            try:
                sent.append(bytes.fromhex(part[3:]))
            except ValueError:
                continue
    for key in usable:
        want = hmac.new(key, canonical, hashlib.sha256).digest()
        if any(hmac.compare_digest(got, want) for got in sent):
            return ts
    raise BadSignature("signature mismatch")


def verify_signature(keys: Keys, headers: Mapping[str, str], body: bytes, now: Optional[float] = None) -> None:
    """Raises :class:`BadSignature` (or its subclasses :class:`MalformedTimestamp`,
    :class:`StaleTimestamp`) unless the call's Asyncd-Timestamp is within five minutes
    of ``now`` and one of its ``v2=`` signatures matches one of ``keys`` (two while a
    key is rotated; empty keys are ignored). Replays are refused by a :class:`Verifier`."""
    _verify(_keys(keys), headers, body, now)


class Verifier:
    """Checks signatures like :func:`verify_signature` and also refuses, with
    :class:`Replayed`, a second call for the same (task, attempt) within the window, so
    a captured call never runs twice in this process. A batch call is checked with
    :meth:`verify_batch` and its replays per task with :meth:`check_replay`. Thread-safe."""

    def __init__(self, keys: Keys, max_entries: int = MAX_REPLAY_ENTRIES) -> None:
        self._keys = _keys(keys)
        self._max = max_entries
        self._lock = threading.Lock()
        # "<task id>\n<attempt>\n<lease token>" -> unix second it may be forgotten, oldest first.
        self._seen: "OrderedDict[str, int]" = OrderedDict()

    def verify(self, headers: Mapping[str, str], body: bytes, now: Optional[float] = None) -> None:
        # Only a verified call is recorded: forged calls can neither fill the cache nor
        # block the real one.
        ts = _verify(self._keys, headers, body, now)
        h = _lower(headers)
        self.check_replay(h.get("asyncd-task-id", ""), h.get("asyncd-attempt", ""), h.get("asyncd-lease-token", ""),
                          ts, now)

    def verify_batch(self, headers: Mapping[str, str], body: bytes, now: Optional[float] = None) -> int:
        """Checks a batch call's (``Asyncd-Batch``) signature, whose canonical string has
        the four per-task fields empty (:func:`batch_canonical_string`), and returns its
        timestamp. Replays are refused per task of the body: pass each task's id,
        attempt and lease token with that timestamp to :meth:`check_replay`."""
        return _verify(self._keys, _batch_headers(headers), body, now)

    def check_replay(self, task_id: str, attempt: Union[str, int], lease_token: str, timestamp: int,
                     now: Optional[float] = None) -> None:
        """Raises :class:`Replayed` if this (task, attempt, lease token) was accepted
        within the window; otherwise remembers it until ``timestamp`` (the verified
        call's) leaves the window. Call it only for verified calls."""
        # The lease token too: a redriven task starts again at attempt 1, with a new token.
        key = f"{task_id}\n{attempt}\n{lease_token}"
        now = time.time() if now is None else now
        with self._lock:
            while self._seen:
                first, until = next(iter(self._seen.items()))
                if until >= now:
                    break
                del self._seen[first]
            until = self._seen.get(key)
            if until is not None and until >= now:
                raise Replayed("this task attempt was already delivered")
            self._seen.pop(key, None)
            while len(self._seen) >= self._max:
                self._seen.popitem(last=False)
            self._seen[key] = timestamp + int(SIGNATURE_TOLERANCE.total_seconds())

    def __len__(self) -> int:
        with self._lock:
            return len(self._seen)


class Retry(Exception):
    """Raise to have asyncd retry the task after ``after`` (503 with Retry-After).
    Without ``after`` (or with 0) asyncd picks the time with its exponential backoff."""

    def __init__(self, after: Optional[Duration] = None, message: str = "retry") -> None:
        self.after = after
        super().__init__(message)


class Permanent(Exception):
    """Raise when no retry can fix the failure: the task goes to dead letters (422)."""


class Cancelled(Exception):
    """Raised by :meth:`TaskContext.check` once the attempt is cancelled: its deadline
    passed (asyncd has given up on the call and will run the task again), its lease was
    lost, or the executor is shutting down. Asyncd retries the task."""


@dataclass
class TaskContext:
    """The task and attempt a handler is running."""

    id: str
    type: str
    #: The task's idempotency key, else its id: key side effects on it, since asyncd
    #: delivers at least once.
    idempotency_key: str
    attempt: int
    #: Opaque: echoed in heartbeats and results.
    lease_token: str
    eta: Optional[datetime]
    callback_url: str
    #: The call's W3C ``traceparent`` (the submitter's trace, under the attempt's span
    #: when asyncd exports spans) and ``tracestate``; None without. Pass them to
    #: ``Client.submit(traceparent=..., tracestate=...)`` or an OpenTelemetry propagator
    #: to continue the trace.
    traceparent: Optional[str] = None
    tracestate: Optional[str] = None
    #: Set when asyncd refused a heartbeat: the task was cancelled, or a newer attempt
    #: owns it; a long-running handler should stop (``cancelled`` is set too).
    lease_lost: threading.Event = field(default_factory=threading.Event, repr=False)
    #: When the attempt's time is up (``time.monotonic()`` seconds), for a handler
    #: registered with ``timeout=``; None otherwise.
    deadline: Optional[float] = None
    #: Set once the handler should stop: the deadline passed, the lease was lost, or
    #: the executor is shutting down. Wait on it (``ctx.cancelled.wait(5)``) instead of
    #: sleeping, or call :meth:`check` between steps.
    cancelled: threading.Event = field(default_factory=threading.Event, repr=False)
    #: Why ``cancelled`` was set.
    cancel_reason: str = ""
    _on_cancel: List[Callable[[], None]] = field(default_factory=list, repr=False)
    _cancel_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def remaining(self) -> Optional[float]:
        """Seconds left before the deadline (never negative), or None without one."""
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())

    def check(self) -> None:
        """Raises :class:`Cancelled` once the attempt is cancelled."""
        if self.cancelled.is_set():
            raise Cancelled(self.cancel_reason or "cancelled")

    def cancel(self, reason: str) -> None:
        with self._cancel_lock:
            if self.cancelled.is_set():
                return
            self.cancel_reason = reason
            self.cancelled.set()
            callbacks, self._on_cancel = self._on_cancel, []
        for callback in callbacks:
            callback()

    def _when_cancelled(self, callback: Callable[[], None]) -> None:
        """Runs ``callback`` once the attempt is cancelled (at once if it already is)."""
        with self._cancel_lock:
            if not self.cancelled.is_set():
                self._on_cancel.append(callback)
                return
        callback()


Handler = Callable[..., Any]


@dataclass
class _Registration:
    fn: Handler
    wants_ctx: bool
    is_async: bool
    lease: Optional[float]  # seconds; set for long-running executors
    timeout: Optional[float] = None  # seconds: the attempt's deadline, when given


@dataclass
class _Answer:
    status: int
    body: Dict[str, Any]
    headers: List[Tuple[str, str]] = field(default_factory=list)


@dataclass
class _Outcome:
    """What became of one task: the answer to a single call, or its result in the
    answer to a batch call (docs/api.md, "Batch delivery")."""

    #: The batch result's status: "success", "accepted", "retry" or "failed".
    status: str
    #: The single call's answer: 200, 202, 401, 422, 500, 501 or 503.
    http: int
    error: Optional[str] = None
    #: Whole seconds; 0: asyncd's backoff decides.
    retry_after: int = 0
    #: Seconds, when accepted as long-running.
    lease: Optional[float] = None
    #: The handler's return value (a single call's 200 body carries it).
    output: Any = None

    def answer(self) -> _Answer:
        if self.status == "success":
            return _Answer(self.http, {} if self.output is None else {"output": self.output})
        if self.status == "accepted":
            return _Answer(self.http, {"lease": format_duration(timedelta(seconds=self.lease or 0))})
        headers = [("Retry-After", str(self.retry_after))] if self.retry_after > 0 else []
        return _Answer(self.http, {"error": self.error}, headers)

    def result(self, task_id: str) -> Dict[str, Any]:
        r: Dict[str, Any] = {"id": task_id, "status": self.status}
        if self.error is not None:
            r["error"] = self.error
        if self.retry_after > 0:
            r["retry_after"] = format_duration(timedelta(seconds=self.retry_after))
        if self.lease is not None:
            r["lease"] = format_duration(timedelta(seconds=self.lease))
        return r


@dataclass
class _Task:
    """One task of a call, ready to run: a single call's, or one entry of a batch's."""

    ctx: TaskContext
    payload: Any
    #: The handler to run, or the outcome of a task answered without running one (no
    #: handler for its type, a replayed entry of a batch).
    run: Union[_Registration, _Outcome]


_REASONS = {200: "OK", 202: "Accepted", 400: "Bad Request", 401: "Unauthorized", 405: "Method Not Allowed",
            413: "Payload Too Large", 422: "Unprocessable Entity", 500: "Internal Server Error",
            501: "Not Implemented", 503: "Service Unavailable"}


def _wants_ctx(fn: Handler) -> bool:
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return True
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2 or any(p.kind == p.VAR_POSITIONAL for p in params)


class Executor:
    """Registry of task handlers, served as a WSGI or ASGI app at the URL an
    AsyncJobConfig's ``spec.executor.url`` names.

    A handler takes ``(payload)`` or ``(payload, ctx: TaskContext)``, may be ``async``,
    and its outcome becomes the answer: returning → 200; ``raise Retry(after)`` → 503
    with Retry-After; ``raise Permanent(...)`` → 422 (dead letters); any other
    exception → 500 (retried with backoff).

    A batch call (``Asyncd-Batch``, a job with ``executor.batch``) runs the same
    handler once per task, at most ``batch_concurrency`` at a time, and answers 200
    with each task's outcome mapped the same way: ``success``, ``accepted`` (with its
    ``lease``), ``retry`` (with ``retry_after``) or ``failed``.
    """

    def __init__(
        self,
        signing_secret: Optional[Keys] = None,
        *,
        callback_endpoint: Optional[str] = None,
        callback_timeout: float = 10.0,
        batch_concurrency: int = DEFAULT_BATCH_CONCURRENCY,
    ) -> None:
        if batch_concurrency < 1:
            raise ValueError("batch_concurrency must be at least 1")
        # None: calls are not checked. Otherwise every call must verify with one of the
        # keys (two while rotating); an empty key is never accepted.
        self._verifier = None if signing_secret is None else Verifier(signing_secret)
        self._batch_concurrency = batch_concurrency
        self._callback_endpoint = callback_endpoint
        self._callback_timeout = callback_timeout
        self._handlers: Dict[str, _Registration] = {}
        self._lock = threading.Lock()
        self._inflight: List[threading.Thread] = []

    # -- registration ---------------------------------------------------------

    def executor(
        self, task_type: str, *, long_running: bool = False, lease: Duration = DEFAULT_LEASE,
        timeout: Optional[Duration] = None,
    ) -> Callable[[Handler], Handler]:
        """Decorator registering a handler for ``task_type``.

        With ``long_running=True`` the call is answered 202 ``{"lease": ...}`` at once,
        the handler runs in a background thread, a heartbeat is sent every lease/3 and
        the outcome is posted to the task's result endpoint (the return value as
        ``output``). Use it for work that may outlast the job's timeout. ``lease`` and
        ``timeout`` take a timedelta, seconds or a string (``"30s"``).

        ``timeout`` (set it to the job's ``spec.executor.timeout``) gives each attempt
        a deadline: ``ctx.deadline``/``ctx.remaining()`` tell it, and ``ctx.cancelled``
        is set when it passes, since asyncd has then given up on the call and will run
        the task again; a handler that goes on would overlap the next attempt. An
        ``async`` handler is cancelled at the deadline. A sync one cannot be stopped
        from outside: it should wait on ``ctx.cancelled`` or call ``ctx.check()``."""

        def register(fn: Handler) -> Handler:
            self.register(task_type, fn, long_running=long_running, lease=lease, timeout=timeout)
            return fn

        return register

    def register(
        self, task_type: str, fn: Handler, *, long_running: bool = False, lease: Duration = DEFAULT_LEASE,
        timeout: Optional[Duration] = None,
    ) -> None:
        seconds = _seconds(lease) if long_running else None
        if seconds is not None and seconds <= 0:
            raise ValueError("lease must be positive")
        deadline = None if timeout is None else _seconds(timeout)
        if deadline is not None and deadline <= 0:
            raise ValueError("timeout must be positive")
        reg = _Registration(fn, _wants_ctx(fn), inspect.iscoroutinefunction(fn), seconds, deadline)
        with self._lock:
            self._handlers[task_type] = reg

    # -- the contract, independent of WSGI/ASGI ---------------------------------

    def _prepare(
        self, method: str, headers: Mapping[str, str], body: bytes
    ) -> Union[_Answer, _Task, List[_Task]]:
        """Checks a call and reads its task, or a batch call's tasks; an :class:`_Answer`
        when the call itself is refused."""
        if method != "POST":
            return _Answer(405, {"error": "method not allowed"}, [("Allow", "POST")])
        h = _lower(headers)
        if BATCH_HEADER.lower() in h:
            return self._prepare_batch(h, body)
        if self._verifier is not None:
            try:
                self._verifier.verify(h, body)
            except BadSignature as e:
                _log_refusal(h.get("asyncd-task-id", ""), h.get("asyncd-attempt", ""), e, _refusal_hint(h, e))
                return _Answer(401, {"error": f"bad signature: {e}"})
        try:
            env = json.loads(body)
            if not isinstance(env, dict) or not isinstance(env.get("type"), str):
                raise ValueError
        except ValueError:
            # The same body would come again on a retry, so this is permanent.
            log.error("asyncd: refused an executor call (400): task %s: the body is not an asyncd task",
                      h.get("asyncd-task-id", ""), extra={"task_id": h.get("asyncd-task-id", ""), "status": 400})
            return _Answer(400, {"error": "body is not an asyncd task"})
        return self._task(h, env)

    def _prepare_batch(self, h: Dict[str, str], body: bytes) -> Union[_Answer, List[_Task]]:
        """A batch call: its signature covers the body with the per-task fields empty;
        each entry carries what a single call has in headers, and is read into the
        same context. A replayed entry is refused as a single call would be (401, a
        permanent failure): that entry fails, without running its handler."""
        timestamp = 0
        if self._verifier is not None:
            try:
                timestamp = self._verifier.verify_batch(h, body)
            except BadSignature as e:
                log.error("asyncd: refused a batch executor call of %s tasks (401: asyncd will not retry them; "
                          "redrive the tasks once fixed): %s; %s", h.get("asyncd-batch", "?"), e,
                          _refusal_hint(h, e), extra={"status": 401})
                return _Answer(401, {"error": f"bad signature: {e}"})
        try:
            entries = _batch_entries(body)
        except ValueError as e:
            log.error("asyncd: refused a batch executor call (400): the body is not a batch of asyncd tasks: %s", e,
                      extra={"status": 400})
            return _Answer(400, {"error": f"body is not a batch of asyncd tasks: {e}"})
        tasks = []
        for entry in entries:
            th = {
                "asyncd-task-id": entry["id"],
                "asyncd-attempt": str(entry["attempt"]),
                "idempotency-key": entry["idempotency_key"],
                "asyncd-lease-token": entry["lease_token"],
                "asyncd-callback-url": h.get("asyncd-callback-url", ""),
            }
            for name in ("traceparent", "tracestate"):
                if isinstance(entry.get(name), str):
                    th[name] = entry[name]
            if self._verifier is not None:
                try:
                    self._verifier.check_replay(entry["id"], th["asyncd-attempt"], entry["lease_token"], timestamp)
                except Replayed as e:
                    _log_refusal(entry["id"], th["asyncd-attempt"], e, _refusal_hint(h, e), batch=True)
                    refused = _Outcome("failed", 401, error=f"bad signature: {e}")
                    tasks.append(_Task(self._context(th, entry), entry.get("payload"), refused))
                    continue
            tasks.append(self._task(th, entry, batch=True))
        return tasks

    def _task(self, headers: Mapping[str, str], env: Dict[str, Any], batch: bool = False) -> _Task:
        """The task of a verified call: ``headers`` (lower-case names) and body ``env``;
        for a batch call, one entry of its body and the headers a single call would have."""
        ctx = self._context(headers, env)
        with self._lock:
            reg = self._handlers.get(env["type"])
        if reg is None:
            # 501, not 404: a 4xx would dead-letter the task, while the usual cause is
            # a rollout that has not reached this replica yet; a 5xx is retried.
            log.warning("asyncd: refused %s: task %s: no executor for task type %r; asyncd will retry",
                        "a task of a batch executor call (result retry)" if batch else "an executor call (501)",
                        ctx.id, env["type"],
                        extra={"task_id": ctx.id, "task_type": env["type"], "status": 501})
            refused = _Outcome("retry", 501, error=f"no executor for task type {env['type']!r}")
            return _Task(ctx, env.get("payload"), refused)
        if reg.timeout is not None:
            ctx.deadline = time.monotonic() + reg.timeout
        return _Task(ctx, env.get("payload"), reg)

    def _context(self, headers: Mapping[str, str], env: Dict[str, Any]) -> TaskContext:
        task_id = str(env.get("id") or headers.get("asyncd-task-id") or "")
        attempt = env.get("attempt")
        if not isinstance(attempt, int):
            try:
                attempt = int(headers.get("asyncd-attempt", "0"))
            except ValueError:
                attempt = 0
        token = headers.get("asyncd-lease-token", "")
        eta = None
        if isinstance(env.get("eta"), str):
            try:
                eta = parse_time(env["eta"])
            except ValueError:
                eta = None
        return TaskContext(
            id=task_id,
            type=env["type"],
            idempotency_key=headers.get("idempotency-key") or task_id,
            attempt=attempt,
            lease_token=token,
            eta=eta,
            callback_url=(headers.get("asyncd-callback-url") or self._callback_endpoint or "").rstrip("/"),
            traceparent=headers.get("traceparent") or None,
            tracestate=headers.get("tracestate") or None,
        )

    @staticmethod
    def _args(reg: _Registration, payload: Any, ctx: TaskContext) -> Tuple[Any, ...]:
        return (payload, ctx) if reg.wants_ctx else (payload,)

    def _run_sync(self, reg: _Registration, payload: Any, ctx: TaskContext) -> Any:
        timer = None
        if reg.timeout is not None:
            # Until the deadline set when the call came: a task of a batch call may have
            # waited for a free slot, and asyncd's timeout covers the whole call.
            left = ctx.remaining()
            timer = threading.Timer(reg.timeout if left is None else left, ctx.cancel,
                                    (f"timed out after {format_duration(timedelta(seconds=reg.timeout))}",))
            timer.daemon = True
            timer.start()
        try:
            result = reg.fn(*self._args(reg, payload, ctx))
            if inspect.isawaitable(result):
                result = asyncio.run(_await_cancellable(result, ctx))
            return result
        finally:
            if timer is not None:
                timer.cancel()

    @staticmethod
    def _log_outcome(ctx: TaskContext, exc: Optional[BaseException], took: float) -> None:
        """Logs an attempt that did not succeed, and one that outlived its deadline."""
        extra = {"task_id": ctx.id, "task_type": ctx.type, "attempt": ctx.attempt}
        timed_out = ctx.deadline is not None and time.monotonic() >= ctx.deadline
        if timed_out or isinstance(exc, (Cancelled, asyncio.TimeoutError)):
            detail = "" if exc is None or isinstance(exc, Cancelled) else f"; error: {type(exc).__name__}: {exc}"
            log.error("asyncd: task %s (%s) attempt %d %s (the handler ran %.3fs): asyncd has given up on the "
                      "call and will run it again%s", ctx.id, ctx.type, ctx.attempt,
                      ctx.cancel_reason or "timed out: its deadline passed", took, detail, extra=extra)
        elif exc is None:
            return
        elif isinstance(exc, Permanent):
            log.error("asyncd: task %s (%s) attempt %d failed permanently; it goes to dead letters: %s",
                      ctx.id, ctx.type, ctx.attempt, exc, extra=extra)
        elif isinstance(exc, Retry):
            log.warning("asyncd: task %s (%s) attempt %d asked to be retried: %s", ctx.id, ctx.type,
                        ctx.attempt, exc, extra=extra)
        else:
            log.error("asyncd: task %s (%s) attempt %d failed; asyncd will retry it: %s: %s", ctx.id, ctx.type,
                      ctx.attempt, type(exc).__name__, exc, exc_info=exc, extra=extra)

    @staticmethod
    def _outcome(exc: Optional[BaseException], result: Any = None) -> _Outcome:
        if exc is None:
            return _Outcome("success", 200, output=result)
        if isinstance(exc, Retry):
            return _Outcome("retry", 503, error=str(exc), retry_after=_retry_after_seconds(exc.after))
        if isinstance(exc, Permanent):
            return _Outcome("failed", 422, error=str(exc) or type(exc).__name__)
        return _Outcome("retry", 500, error=f"{type(exc).__name__}: {exc}")

    def _finish(self, ctx: TaskContext, started: float, exc: Optional[BaseException], result: Any = None) -> _Outcome:
        self._log_outcome(ctx, exc, time.monotonic() - started)
        return self._outcome(exc, result)

    def _start_long_running(self, reg: _Registration, payload: Any, ctx: TaskContext) -> _Outcome:
        assert reg.lease is not None
        t = threading.Thread(target=self._long_running, args=(reg, payload, ctx), name=f"asyncd-{ctx.id}", daemon=True)
        with self._lock:
            # Started under the lock: another start dropping the threads that are not
            # alive must not drop this one before it runs (wait() would miss it).
            self._inflight = [x for x in self._inflight if x.is_alive()]
            t.start()
            self._inflight.append(t)
        return _Outcome("accepted", 202, lease=reg.lease)

    def _run(self, task: _Task) -> _Outcome:
        """Runs one task in this thread — a single call's, or one of a batch call's — and
        maps its handler's outcome."""
        if isinstance(task.run, _Outcome):
            return task.run
        reg, payload, ctx = task.run, task.payload, task.ctx
        if reg.lease is not None:
            return self._start_long_running(reg, payload, ctx)
        started = time.monotonic()
        try:
            result = self._run_sync(reg, payload, ctx)
        except Exception as e:  # noqa: BLE001 - every failure maps onto an answer
            return self._finish(ctx, started, e)
        return self._finish(ctx, started, None, result)

    async def _run_async(self, task: _Task) -> _Outcome:
        """:meth:`_run` on an event loop: an ``async`` handler runs on it, a sync one in
        the loop's default thread pool."""
        if isinstance(task.run, _Outcome):
            return task.run
        reg, payload, ctx = task.run, task.payload, task.ctx
        if reg.lease is not None:
            return self._start_long_running(reg, payload, ctx)
        started = time.monotonic()
        try:
            if reg.is_async:
                result = await asyncio.wait_for(reg.fn(*self._args(reg, payload, ctx)), ctx.remaining())
            else:
                loop = asyncio.get_running_loop()
                result = await loop.run_in_executor(None, self._run_sync, reg, payload, ctx)
        except Exception as e:  # noqa: BLE001
            return self._finish(ctx, started, e)
        return self._finish(ctx, started, None, result)

    def _run_batch(self, tasks: List[_Task]) -> _Answer:
        """Runs a batch call's tasks concurrently, at most ``batch_concurrency`` at a
        time, and answers 200 with one result per task."""
        if not tasks:
            return _batch_answer(tasks, [])

        def one(task: _Task) -> _Outcome:
            started = time.monotonic()
            try:
                return self._run(task)
            except BaseException as e:  # noqa: BLE001 - one task's failure must not sink the others' results
                return self._finish(task.ctx, started, e)

        workers = min(len(tasks), self._batch_concurrency)
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="asyncd-batch") as pool:
            return _batch_answer(tasks, list(pool.map(one, tasks)))

    async def _run_batch_async(self, tasks: List[_Task]) -> _Answer:
        """:meth:`_run_batch` on an event loop."""
        slots = asyncio.Semaphore(min(len(tasks), self._batch_concurrency) or 1)

        async def one(task: _Task) -> _Outcome:
            async with slots:
                started = time.monotonic()
                try:
                    return await self._run_async(task)
                except asyncio.CancelledError:
                    raise
                except BaseException as e:  # noqa: BLE001 - one task's failure must not sink the others' results
                    return self._finish(task.ctx, started, e)

        return _batch_answer(tasks, list(await asyncio.gather(*(one(t) for t in tasks))))

    def handle(self, method: str, headers: Mapping[str, str], body: bytes) -> Tuple[int, List[Tuple[str, str]], bytes]:
        """Serves one executor call, or batch call, synchronously: ``headers`` with
        lower-case names. Returns status, headers and body; useful to plug into any
        framework."""
        prepared = self._prepare(method, headers, body)
        if isinstance(prepared, _Answer):
            return _encode(prepared)
        if isinstance(prepared, list):
            return _encode(self._run_batch(prepared))
        return _encode(self._run(prepared).answer())

    # -- long-running -----------------------------------------------------------

    def _long_running(self, reg: _Registration, payload: Any, ctx: TaskContext) -> None:
        lease = reg.lease or DEFAULT_LEASE.total_seconds()
        stop = threading.Event()
        lease_until = [time.monotonic() + lease]

        def heartbeats() -> None:
            while not stop.wait(lease / 3):
                try:
                    self._callback(ctx, "heartbeat", {"lease_token": ctx.lease_token, "lease": format_duration(timedelta(seconds=lease))})
                    lease_until[0] = time.monotonic() + lease
                except TaskCancelled:
                    ctx.lease_lost.set()
                    ctx.cancel("the task was cancelled in asyncd")
                    return
                except (StaleLease, NotFound):
                    ctx.lease_lost.set()
                    ctx.cancel("lease lost: a newer attempt owns the task")
                    return
                except (APIError, TransportError) as e:
                    log.warning("asyncd heartbeat for %s failed: %s", ctx.id, e)

        hb = threading.Thread(target=heartbeats, name=f"asyncd-hb-{ctx.id}", daemon=True)
        hb.start()
        exc: Optional[BaseException] = None
        result: Any = None
        started = time.monotonic()
        try:
            result = self._run_sync(reg, payload, ctx)
        except Exception as e:  # noqa: BLE001
            exc = e
        stop.set()
        hb.join()
        if ctx.lease_lost.is_set() and ctx.cancel_reason == "the task was cancelled in asyncd":
            log.info("asyncd: long-running task %s (%s) attempt %d was cancelled while it ran (its heartbeat said "
                     "so); the handler was cancelled and its result is dropped", ctx.id, ctx.type, ctx.attempt,
                     extra={"task_id": ctx.id, "task_type": ctx.type, "attempt": ctx.attempt})
            return
        if ctx.lease_lost.is_set():
            log.warning("asyncd: long-running task %s (%s) attempt %d lost its lease (a heartbeat was refused): "
                        "a newer attempt owns it; this attempt's result is dropped", ctx.id, ctx.type, ctx.attempt,
                        extra={"task_id": ctx.id, "task_type": ctx.type, "attempt": ctx.attempt})
            return  # a newer attempt owns the task; asyncd would refuse our result
        self._log_outcome(ctx, exc, time.monotonic() - started)
        body: Dict[str, Any] = {"lease_token": ctx.lease_token, "status": "success"}
        if isinstance(exc, Permanent):
            body.update(status="failed", error=str(exc) or type(exc).__name__)
        elif isinstance(exc, Retry):
            body.update(status="retry", error=str(exc))
            if exc.after is not None and _retry_after_seconds(exc.after) > 0:
                body["retry_after"] = format_duration(exc.after)
        elif exc is not None:
            body.update(status="retry", error=f"{type(exc).__name__}: {exc}")
        elif result is not None:
            body["output"] = result
        self._post_result(ctx, body, lease_until[0])

    def _post_result(self, ctx: TaskContext, body: Dict[str, Any], lease_until: float) -> None:
        # Transport failures and 5xx are retried until the lease would have lapsed
        # anyway; after that asyncd retries the task itself.
        backoff = 0.1
        while True:
            try:
                self._callback(ctx, "result", body)
                return
            except APIError as e:
                if e.status < 500:
                    log.warning("asyncd result for %s refused: %s", ctx.id, e)
                    return
                err: Exception = e
            except TransportError as e:
                err = e
            if time.monotonic() + backoff > lease_until:
                log.warning("asyncd result for %s not delivered: %s", ctx.id, err)
                return
            time.sleep(backoff)
            backoff = min(backoff * 2, 5.0)

    def _callback(self, ctx: TaskContext, what: str, body: Dict[str, Any]) -> Any:
        if not ctx.callback_url:
            raise TransportError("no Asyncd-Callback-Url and no callback endpoint configured")
        url = f"{ctx.callback_url}/v1/tasks/{urllib.parse.quote(ctx.id, safe='')}/{what}"
        return http_json("POST", url, body, timeout=self._callback_timeout)

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Waits for long-running handlers still at work to post their results; returns
        False if some were still running at the timeout. Call it on shutdown."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            threads = list(self._inflight)
        for t in threads:
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in threads)

    # -- WSGI / ASGI --------------------------------------------------------------

    def wsgi_app(self) -> Callable[[Dict[str, Any], Callable[..., Any]], Iterable[bytes]]:
        """A WSGI application serving the executor contract at any path."""

        def app(environ: Dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            headers = {k[5:].replace("_", "-").lower(): v for k, v in environ.items() if k.startswith("HTTP_")}
            try:
                length = int(environ.get("CONTENT_LENGTH") or 0)
            except ValueError:
                length = 0
            if length > _MAX_BODY:
                status, hdrs, body = _encode(_Answer(413, {"error": "body too large"}))
            else:
                raw = environ["wsgi.input"].read(length) if length > 0 else b""
                status, hdrs, body = self.handle(environ.get("REQUEST_METHOD", "GET"), headers, raw)
            start_response(f"{status} {_REASONS.get(status, '')}".strip(), hdrs)
            return [body]

        return app

    def asgi_app(self) -> Callable[[Dict[str, Any], Callable[[], Awaitable[Dict[str, Any]]], Callable[[Dict[str, Any]], Awaitable[None]]], Awaitable[None]]:
        """An ASGI 3 application serving the executor contract at any path. Sync
        handlers run in the loop's default thread pool so they do not block it."""

        async def app(scope: Dict[str, Any], receive: Callable[[], Awaitable[Dict[str, Any]]],
                      send: Callable[[Dict[str, Any]], Awaitable[None]]) -> None:
            if scope["type"] == "lifespan":
                while True:
                    msg = await receive()
                    if msg["type"] == "lifespan.startup":
                        await send({"type": "lifespan.startup.complete"})
                    elif msg["type"] == "lifespan.shutdown":
                        await send({"type": "lifespan.shutdown.complete"})
                        return
            if scope["type"] != "http":
                return
            chunks: List[bytes] = []
            size = 0
            while True:
                msg = await receive()
                if msg["type"] == "http.disconnect":
                    return
                chunk = msg.get("body", b"")
                size += len(chunk)
                if size > _MAX_BODY:
                    await _asgi_send(send, _encode(_Answer(413, {"error": "body too large"})))
                    return
                chunks.append(chunk)
                if not msg.get("more_body"):
                    break
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
            answer = await self._handle_async(scope.get("method", "GET"), headers, b"".join(chunks))
            await _asgi_send(send, answer)

        return app

    async def _handle_async(self, method: str, headers: Mapping[str, str], body: bytes) -> Tuple[int, List[Tuple[str, str]], bytes]:
        prepared = self._prepare(method, headers, body)
        if isinstance(prepared, _Answer):
            return _encode(prepared)
        if isinstance(prepared, list):
            return _encode(await self._run_batch_async(prepared))
        return _encode((await self._run_async(prepared)).answer())

    def make_server(self, host: str = "127.0.0.1", port: int = 8080) -> WSGIServer:
        """A threaded stdlib WSGI server for this executor (``port=0`` picks a free
        port; see ``server.server_port``). Call ``serve_forever()`` on it."""
        return _make_server(host, port, self.wsgi_app(), server_class=ThreadingWSGIServer, handler_class=_QuietHandler)


class ThreadingWSGIServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        log.debug("%s - %s", self.address_string(), format % args)


async def _await_cancellable(aw: Awaitable[Any], ctx: TaskContext) -> Any:
    """Awaits a coroutine handler in its own event loop, cancelling it (Python's own
    cancellation: ``CancelledError`` inside the handler) once ``ctx`` is cancelled — the
    task was cancelled in asyncd, its lease was lost, or its deadline passed."""
    task = asyncio.ensure_future(aw)
    loop = asyncio.get_running_loop()

    def cancel_task() -> None:
        try:
            loop.call_soon_threadsafe(task.cancel)
        except RuntimeError:  # the loop has closed: the handler is done anyway
            pass

    ctx._when_cancelled(cancel_task)
    try:
        return await asyncio.wait_for(task, ctx.remaining())
    except asyncio.CancelledError:
        if ctx.cancelled.is_set():
            raise Cancelled(ctx.cancel_reason or "cancelled") from None
        raise


def _batch_entries(body: bytes) -> List[Dict[str, Any]]:
    """The tasks of a batch call's body, ``{"tasks": [...]}``; raises ValueError saying
    what is wrong. Each entry must carry what a single call has in its headers."""
    doc = json.loads(body)
    if not isinstance(doc, dict) or not isinstance(doc.get("tasks"), list):
        raise ValueError('not an object with a "tasks" array')
    for i, t in enumerate(doc["tasks"]):
        if not isinstance(t, dict):
            raise ValueError(f"tasks[{i}] is not an object")
        for name in ("id", "type", "idempotency_key", "lease_token"):
            if not isinstance(t.get(name), str):
                raise ValueError(f"tasks[{i}].{name} is missing or not a string")
        if not t["id"] or not t["type"]:
            raise ValueError(f"tasks[{i}] has an empty id or type")
        if not isinstance(t.get("attempt"), int) or isinstance(t["attempt"], bool):
            raise ValueError(f"tasks[{i}].attempt is missing or not an integer")
    return doc["tasks"]


def _batch_answer(tasks: Sequence[_Task], outcomes: Sequence[_Outcome]) -> _Answer:
    return _Answer(200, {"results": [o.result(t.ctx.id) for t, o in zip(tasks, outcomes)]})


def _log_refusal(task_id: str, attempt: str, err: BadSignature, hint: str, batch: bool = False) -> None:
    what = "a task of a batch executor call (result failed" if batch else "an executor call (401"
    log.error("asyncd: refused %s: asyncd will not retry it; redrive the task once fixed): task %s attempt %s: %s; %s",
              what, task_id, attempt, err, hint, extra={"task_id": task_id, "status": 401})


def _refusal_hint(headers: Mapping[str, str], err: BadSignature) -> str:
    """What usually causes a signature refusal."""
    if str(err) == "no signing key configured":
        return ("this executor has no usable signing key (is the variable holding the job's signing secret "
                "empty?): it refuses every call")
    if not headers.get("asyncd-signature"):
        return ("the call is unsigned: the job has no spec.executor.signing (asyncd signs the calls of jobs "
                "that configure it), or the caller is not asyncd")
    if isinstance(err, StaleTimestamp):
        return "the clocks of asyncd and this executor differ by more than 5 minutes"
    if isinstance(err, Replayed):
        return "this attempt was delivered before (a replayed call)"
    return "the signing key differs from the job's signing Secret"


async def _asgi_send(send: Callable[[Dict[str, Any]], Awaitable[None]], answer: Tuple[int, List[Tuple[str, str]], bytes]) -> None:
    status, headers, body = answer
    await send({
        "type": "http.response.start",
        "status": status,
        "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers],
    })
    await send({"type": "http.response.body", "body": body})


def _encode(a: _Answer) -> Tuple[int, List[Tuple[str, str]], bytes]:
    body = json.dumps(a.body, default=str).encode("utf-8")
    headers = [("Content-Type", "application/json"), ("Content-Length", str(len(body)))] + a.headers
    return a.status, headers, body


def _seconds(after: Optional[Duration]) -> float:
    if after is None:
        return 0.0
    return parse_duration(after).total_seconds() if isinstance(after, str) else duration_seconds(after)


def _retry_after_seconds(after: Optional[Duration]) -> int:
    # Rounds up: Retry-After has whole seconds and retrying early is what the handler
    # asked not to happen. 0 means "no Retry-After": asyncd's backoff decides.
    return max(0, math.ceil(_seconds(after)))


def http_json(method: str, url: str, body: Any = None, *, headers: Optional[Mapping[str, str]] = None,
              timeout: float = 30.0) -> Any:
    """One JSON request; raises the APIError subclass for 4xx/5xx answers and
    TransportError when the server cannot be reached."""
    return http_json_status(method, url, body, headers=headers, timeout=timeout)[1]


def http_json_status(method: str, url: str, body: Any = None, *, headers: Optional[Mapping[str, str]] = None,
                     timeout: float = 30.0) -> Tuple[int, Any]:
    """:func:`http_json` that also returns the status of the 2xx answer."""
    data = None
    hdrs = {"Accept": "application/json"}
    if isinstance(body, bytes):  # JSON already encoded by the caller
        data = body
        hdrs["Content-Type"] = "application/json"
    elif body is not None:
        data = json.dumps(body, allow_nan=False).encode("utf-8")
        hdrs["Content-Type"] = "application/json"
    if headers:
        hdrs.update(headers)
    req = urllib.request.Request(url, data=data, headers=hdrs, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status = resp.status
            raw = resp.read()
    except urllib.error.HTTPError as e:
        raw = e.read() if e.fp is not None else b""
        retry_after = parse_retry_after(e.headers.get("Retry-After") if e.headers else None)
        raise error_from_response(e.code, raw, retry_after) from None
    except (urllib.error.URLError, OSError) as e:
        raise TransportError(f"{method} {url}: {getattr(e, 'reason', e)}") from e
    if not raw.strip():
        return status, None
    try:
        return status, json.loads(raw)
    except ValueError as e:
        raise TransportError(f"{method} {url}: answer is not JSON") from e
