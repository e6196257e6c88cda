"""The asyncd API client."""

from __future__ import annotations

import asyncio
import functools
import json
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from datetime import datetime
from typing import (Any, AsyncIterator, Awaitable, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple,
                    Type, TypeVar, Union)

from ._coalesce import DEFAULT_SUBMIT_CALLS, AsyncSubmitQueue, Outcome, SubmitQueue, failed_all
from ._errors import APIError, MissingIdempotencyKey, error_from_body
from ._executor import DEFAULT_BATCH_CONCURRENCY, Executor, http_json, http_json_status
from ._retry import RetryPolicy
from ._time import Duration, format_duration, format_time, parse_time

DEFAULT_ENDPOINT = "http://127.0.0.1:7700"
# Where a pod mounts its projected ServiceAccount token for the audience "asyncd"
# (docs/security.md); read when the client is given no ``token``.
DEFAULT_TOKEN_FILE = "/var/run/secrets/asyncd/token"
# Seconds a token read from a file is used before the file is read again: the kubelet
# renews a projected token at 80% of its lifetime (at least 10 minutes), so a minute is
# always in time.
TOKEN_FILE_REFRESH = 60.0
"""Where ``asyncd dev`` listens unless told otherwise."""

SOURCE_SERVICE_HEADER = "Asyncd-Source-Service"

# Debounce modes and what a throttled submit gets (:class:`Debounce`, :class:`Throttle`).
TRAILING, LEADING = "trailing", "leading"
REFUSE, DROP = "refuse", "drop"

# What a schedule's firing does while the previous one has not finished (its
# ``overlap``; docs/api.md, "Schedules"): ALLOW runs it anyway (the default; the API also
# reads "AllowAll"), SKIP skips it, BUFFER_ONE holds it back until the previous one
# finishes (at most one is held), CANCEL_OTHER cancels the previous one.
ALLOW, SKIP, BUFFER_ONE, CANCEL_OTHER = "Allow", "Skip", "BufferOne", "CancelOther"

# Who manages a schedule (:attr:`Schedule.source`): the API, or its job's config
# (``spec.cron``: read-only through the API).
SOURCE_API, SOURCE_CONFIG = "api", "config"

#: The most schedules one :meth:`Client.list_schedules` page holds (the default is 100).
MAX_SCHEDULE_PAGE = 1000
#: The most firings one :meth:`Client.backfill_schedule` creates.
MAX_BACKFILL = 10_000

# Task states. EXPIRED: no attempt had begun by the task's ``expires_at``; it never
# reached the executor.
BLOCKED, PENDING, CLAIMED, RUNNING, SUCCEEDED, DEAD, CANCELLED, EXPIRED = (
    "blocked", "pending", "claimed", "running", "succeeded", "dead", "cancelled", "expired")


@dataclass(frozen=True)
class Debounce:
    """Combines a submit with its job's other submits of the same ``key`` (the
    ``debounce=`` of a submit; docs/api.md, "Debounce and throttle").

    ``mode=TRAILING`` (the default): the job keeps one waiting task per key. Each submit
    replaces its payload and moves it to ``period`` after that submit, never later than
    ``max_delay`` (optional, at least ``period``) after the burst's first submit. The
    first submit is stored as usual; a later one is folded into the waiting task: its
    :class:`SubmitResult` has ``debounced`` set, ``id`` the waiting task's and ``eta``
    its new due time. A trailing debounce sets the due time itself, so the submit takes
    no ``delay`` or ``eta`` (:class:`asyncd.InvalidField` naming it).

    ``mode=LEADING``: a submit after ``period`` without one of its key is stored and runs
    as submitted; one within ``period`` of the key's last submit stores nothing and
    answers ``dropped``, ``id`` the task the key last stored, ``eta`` when the quiet
    period ends (each dropped submit extends it).

    ``key`` is 1 to 255 bytes; ``period`` and ``max_delay`` are timedelta, seconds or
    "90s" (1ms to 400 days)."""

    key: str
    period: Duration
    max_delay: Optional[Duration] = None
    mode: str = TRAILING

    def to_json(self) -> Dict[str, Any]:
        body: Dict[str, Any] = {"key": self.key, "period": format_duration(self.period)}
        if self.max_delay is not None:
            body["max_delay"] = format_duration(self.max_delay)
        body["mode"] = self.mode
        return body


@dataclass(frozen=True)
class Throttle:
    """Stores at most one task of the job's ``key`` per ``period``, counted from the
    submit that stored it (the ``throttle=`` of a submit). A submit within that period
    stores nothing: with ``on_limit=REFUSE`` (the default) it raises
    :class:`asyncd.Throttled`, whose ``existing_id`` names the key's task; with
    ``on_limit=DROP`` it returns a :class:`SubmitResult` with ``dropped`` set, ``id`` the
    key's task and ``eta`` when the window closes.

    ``key`` is 1 to 255 bytes; ``period`` is timedelta, seconds or "90s" (1ms to 400
    days)."""

    key: str
    period: Duration
    on_limit: str = REFUSE

    def to_json(self) -> Dict[str, Any]:
        return {"key": self.key, "period": format_duration(self.period), "on_limit": self.on_limit}


@dataclass
class Task:
    """One submit, for :meth:`Client.submit_batch` (the keyword arguments of
    :meth:`Client.submit` as fields)."""

    type: str
    payload: Any = None
    idempotency_key: Optional[str] = None
    delay: Optional[Duration] = None
    eta: Optional[datetime] = None
    priority: Optional[int] = None
    unique_key: Optional[str] = None
    max_retries: Optional[int] = None
    timeout: Optional[Duration] = None
    depends_on: Optional[Sequence[str]] = None
    #: At most one of the two: if no attempt has begun by ``expires_at`` (an aware
    #: datetime), or ``start_within`` (timedelta, seconds or "90s") after the task is due,
    #: retries included, it ends :data:`EXPIRED` without reaching the executor.
    expires_at: Optional[datetime] = None
    start_within: Optional[Duration] = None
    #: At most one of the two (a :class:`Debounce` or a :class:`Throttle`, or a mapping
    #: of its fields): the task is combined with its job's other submits of the same key.
    #: With neither, the job's ``spec.debounce`` or ``spec.throttle`` applies, if any.
    debounce: Optional[Union[Debounce, Mapping[str, Any]]] = None
    throttle: Optional[Union[Throttle, Mapping[str, Any]]] = None


@dataclass(frozen=True)
class SubmitResult:
    id: str
    eta: datetime
    route: str  # "store" or "kafka"
    #: True when the idempotency key was seen before; ``id`` is the first task's.
    duplicate: bool = False
    #: A trailing :class:`Debounce` folded the submit into its key's waiting task
    #: (answered 200): ``id`` is that task's, ``eta`` its new due time, and it now carries
    #: this submit's payload.
    debounced: bool = False
    #: A leading :class:`Debounce` or a :class:`Throttle` with ``on_limit=DROP`` held the
    #: submit back and stored nothing (answered 200): ``id`` is the task the key last
    #: stored, ``eta`` when its window closes.
    dropped: bool = False

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "SubmitResult":
        return cls(id=d["id"], eta=parse_time(d["eta"]), route=d.get("route", ""), duplicate=bool(d.get("duplicate")),
                   debounced=bool(d.get("debounced")), dropped=bool(d.get("dropped")))


@dataclass(frozen=True)
class BatchResult:
    """One item of a batch answer: ``result`` or ``error`` is set."""

    status: int
    result: Optional[SubmitResult] = None
    error: Optional[APIError] = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class TaskStatus:
    """A task as ``GET /v1/tasks/{id}`` shows it."""

    id: str
    type: str
    payload: Any
    state: str
    priority: int
    eta: Optional[datetime]
    attempt: int
    max_retries: int
    idempotency_key: Optional[str]
    unique_key: Optional[str]
    depends_on: List[str]
    last_error: Optional[str]
    result: Any
    created_at: Optional[datetime]
    updated_at: Optional[datetime]
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    #: When the task expires unless an attempt has begun by then; None when it never does.
    expires_at: Optional[datetime] = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "TaskStatus":
        def t(key: str) -> Optional[datetime]:
            v = d.get(key)
            return parse_time(v) if isinstance(v, str) else None

        return cls(
            id=d["id"], type=d.get("type", ""), payload=d.get("payload"), state=d.get("state", ""),
            priority=d.get("priority") or 0, eta=t("eta"), attempt=d.get("attempt") or 0,
            max_retries=d.get("max_retries") or 0, idempotency_key=d.get("idempotency_key"),
            unique_key=d.get("unique_key"), depends_on=list(d.get("depends_on") or []),
            last_error=d.get("last_error"), result=d.get("result"), created_at=t("created_at"),
            updated_at=t("updated_at"), raw=dict(d), expires_at=t("expires_at"),
        )


@dataclass(frozen=True)
class RedriveResult:
    id: str
    state: str
    eta: Optional[datetime]


@dataclass(frozen=True)
class CancelResult:
    """The task :meth:`Client.cancel_unique` cancelled."""

    id: str
    state: str


@dataclass(frozen=True)
class PendingChange:
    """:meth:`Client.change_in_job`'s answer for a task of a Kafka-routed job that no
    dispatcher has consumed yet: the change is recorded under the task's id, and the task
    takes it when it is stored. ``consumed`` is always ``False``."""

    id: str
    job: str
    type: str
    consumed: bool = False

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "PendingChange":
        return cls(id=d["id"], job=d["job"], type=d["type"], consumed=bool(d.get("consumed", False)))

    def to_json(self) -> Dict[str, Any]:
        return {"id": self.id, "job": self.job, "type": self.type, "consumed": self.consumed}


@dataclass(frozen=True)
class CronTrigger:
    """The task :meth:`Client.trigger_cron` fired: its id, job, cron entry, type and due
    time."""

    id: str
    job: str
    entry: str
    type: str
    eta: datetime


@dataclass(frozen=True)
class TaskPage:
    """One page of :meth:`Client.search`, newest first. ``next_cursor`` is set while there
    may be more: pass it as ``cursor``."""

    items: List[TaskStatus]
    next_cursor: Optional[str]
    truncated: bool


@dataclass(frozen=True)
class BulkResult:
    """One call of :meth:`Client.redrive_dead_letters` or :meth:`Client.purge_dead_letters`:
    matching before it, acted on by it, left alone (unique key held / waited on), still
    to do after it, and the ``dead_before`` cutoff it used."""

    matched: int
    affected: int
    skipped: int
    remaining: int
    dry_run: bool
    dead_before: datetime


@dataclass(frozen=True)
class JobStatus:
    """Whether a job's attempts may begin: ``paused_at`` is set while it is paused through
    the API, ``paused_by_config`` while its AsyncJobConfig says ``spec.paused``."""

    job: str
    task_type: str
    paused: bool
    paused_at: Optional[datetime]
    paused_by_config: bool


def _opt_time(d: Mapping[str, Any], key: str) -> Optional[datetime]:
    v = d.get(key)
    return parse_time(v) if isinstance(v, str) else None


def _write_time(t: Optional[datetime]) -> Optional[str]:
    return format_time(t) if t is not None else None


@dataclass(frozen=True)
class Schedule:
    """A schedule as ``/v1/schedules`` answers it (docs/api.md, "Schedules"): its spec —
    ``cron`` or ``every``, ``payload``, ``priority``, ``overlap``, ``catch_up``,
    ``start_at``, ``end_at``, ``jitter``, ``paused`` — and where it stands. Durations
    (``every``, ``catch_up``, ``jitter``) are strings as the API writes them (``"15m"``);
    :func:`asyncd.parse_duration` reads the common forms."""

    job: str
    name: str
    #: The job's task type.
    type: str
    #: :data:`SOURCE_API`, or :data:`SOURCE_CONFIG` for its job's ``spec.cron`` entry.
    source: str
    cron: Optional[str]
    every: Optional[str]
    payload: Any
    priority: int
    overlap: str
    #: None: the default (an hour).
    catch_up: Optional[str]
    start_at: Optional[datetime]
    end_at: Optional[datetime]
    jitter: Optional[str]
    paused: bool
    #: The next firing not yet created; None while paused, ended or not planned yet.
    next_firing: Optional[datetime]
    #: The latest firing created (for a schedule that allows overlaps, up to a minute
    #: ahead) and its task; None before the first.
    last_firing: Optional[datetime]
    last_task_id: Optional[str]
    #: :data:`BUFFER_ONE`: the firing held back until the previous one finishes.
    buffered_firing: Optional[datetime]
    #: Tasks its firings created.
    fired: int
    created_at: Optional[datetime]
    updated_at: Optional[datetime]
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Schedule":
        return cls(
            job=d["job"], name=d["name"], type=d.get("type", ""), source=d.get("source", ""),
            cron=d.get("cron"), every=d.get("every"), payload=d.get("payload"), priority=d.get("priority") or 0,
            overlap=d.get("overlap") or ALLOW, catch_up=d.get("catch_up"), start_at=_opt_time(d, "start_at"),
            end_at=_opt_time(d, "end_at"), jitter=d.get("jitter"), paused=bool(d.get("paused")),
            next_firing=_opt_time(d, "next_firing"), last_firing=_opt_time(d, "last_firing"),
            last_task_id=d.get("last_task_id"), buffered_firing=_opt_time(d, "buffered_firing"),
            fired=d.get("fired") or 0, created_at=_opt_time(d, "created_at"), updated_at=_opt_time(d, "updated_at"),
            raw=dict(d),
        )

    def to_json(self) -> Dict[str, Any]:
        """The schedule as the API writes it (the optional spec members only when set)."""
        out: Dict[str, Any] = {"job": self.job, "name": self.name, "type": self.type, "source": self.source}
        for key in ("cron", "every"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        out.update(payload=self.payload, priority=self.priority, overlap=self.overlap)
        if self.catch_up is not None:
            out["catch_up"] = self.catch_up
        for key in ("start_at", "end_at"):
            if getattr(self, key) is not None:
                out[key] = format_time(getattr(self, key), key)
        if self.jitter is not None:
            out["jitter"] = self.jitter
        out.update(paused=self.paused, next_firing=_write_time(self.next_firing),
                   last_firing=_write_time(self.last_firing), last_task_id=self.last_task_id,
                   buffered_firing=_write_time(self.buffered_firing), fired=self.fired,
                   created_at=_write_time(self.created_at), updated_at=_write_time(self.updated_at))
        return out


@dataclass(frozen=True)
class SchedulePage:
    """One page of :meth:`Client.list_schedules`, by name. ``next_cursor`` is set while
    there may be more: pass it as ``cursor``."""

    items: List[Schedule]
    next_cursor: Optional[str]

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "SchedulePage":
        return cls(items=[Schedule.from_json(i) for i in d.get("items") or []], next_cursor=d.get("next_cursor"))

    def to_json(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"items": [i.to_json() for i in self.items]}
        if self.next_cursor is not None:
            out["next_cursor"] = self.next_cursor
        return out


@dataclass(frozen=True)
class BackfillResult:
    """:meth:`Client.backfill_schedule`'s answer: the firings in the range, and of those
    the ones this call created (the rest existed already)."""

    firings: int
    created: int

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "BackfillResult":
        return cls(firings=d["firings"], created=d["created"])

    def to_json(self) -> Dict[str, Any]:
        return {"firings": self.firings, "created": self.created}


# The members of a schedule's spec that are durations, and times.
_SPEC_DURATIONS = ("every", "catch_up", "jitter")
_SPEC_TIMES = ("start_at", "end_at")


def _schedule_spec(cron: Optional[str] = None, every: Optional[Duration] = None, payload: Any = None,
                   priority: Optional[int] = None, overlap: Optional[str] = None,
                   catch_up: Optional[Duration] = None, start_at: Optional[datetime] = None,
                   end_at: Optional[datetime] = None, jitter: Optional[Duration] = None,
                   paused: Optional[bool] = None) -> Dict[str, Any]:
    """The body of a schedule's PUT: the members given (``payload`` always)."""
    body: Dict[str, Any] = {"payload": payload}
    for key, value in (("cron", cron), ("priority", priority), ("overlap", overlap), ("paused", paused)):
        if value is not None:
            body[key] = value
    for key, d in (("every", every), ("catch_up", catch_up), ("jitter", jitter)):
        if d is not None:
            body[key] = format_duration(d)
    for key, t in (("start_at", start_at), ("end_at", end_at)):
        if t is not None:
            body[key] = format_time(t, key)
    return body


def _schedule_patch(changes: Mapping[str, Any]) -> Dict[str, Any]:
    if not changes:
        raise ValueError("change_schedule needs at least one member to change")
    body: Dict[str, Any] = {}
    for key, value in changes.items():
        if value is not None and key in _SPEC_DURATIONS:
            value = format_duration(value)
        elif value is not None and key in _SPEC_TIMES:
            value = format_time(value, key)
        body[key] = value
    return body


class Client(Executor):
    """Talks to the asyncd API; also an :class:`Executor`, so the same object can
    register handlers with ``@client.executor("type")`` and serve them.

    ``token`` is sent as ``Authorization: Bearer <token>`` on every API call. Without it
    the token is read from ``token_file`` (default :data:`DEFAULT_TOKEN_FILE`, where a pod
    mounts its projected ServiceAccount token), re-read every
    :data:`TOKEN_FILE_REFRESH` seconds since the kubelet rotates it; a missing file sends
    no token (``asyncd dev`` needs none).

    ``retry`` (off unless given) sends an API call again after a retryable failure:
    see :class:`asyncd.RetryPolicy`.

    ``submit_calls`` (default :data:`DEFAULT_SUBMIT_CALLS`) is how many submit calls the
    client has in flight at once. While they are all busy, the submits of other threads
    queue and go together in the next free call, one ``POST /v1/tasks:batch`` (up to
    1000 tasks and 1 MiB); each :meth:`submit` still returns its own task's result or
    raises its own error, exactly as alone. A submit that finds a call free is sent at
    once, alone. ``0`` sends every submit alone; a submit with a ``traceparent`` always
    is, since a batch's tasks all join the batch call's trace."""

    def __init__(
        self,
        endpoint: str = DEFAULT_ENDPOINT,
        service_name: Optional[str] = None,
        *,
        timeout: float = 30.0,
        signing_secret: Optional[Union[str, bytes, Sequence[Union[str, bytes]]]] = None,
        token: Optional[str] = None,
        token_file: Optional[str] = DEFAULT_TOKEN_FILE,
        retry: Optional[RetryPolicy] = None,
        batch_concurrency: int = DEFAULT_BATCH_CONCURRENCY,
        submit_calls: int = DEFAULT_SUBMIT_CALLS,
    ) -> None:
        if submit_calls < 0:
            raise ValueError("submit_calls must be 0 (off) or more")
        self.endpoint = endpoint.rstrip("/")
        self.retry = retry
        self.service_name = service_name
        self.timeout = timeout
        self._token = token
        self._token_file = token_file
        self._token_lock = threading.Lock()
        self._file_token: Optional[str] = None
        self._token_read_at: Optional[float] = None
        self._submits = SubmitQueue(submit_calls, self._answer_call) if submit_calls else None
        super().__init__(signing_secret, callback_endpoint=self.endpoint, batch_concurrency=batch_concurrency)

    def _bearer(self) -> Optional[str]:
        if self._token is not None:
            return self._token
        if not self._token_file:
            return None
        with self._token_lock:
            now = time.monotonic()
            if self._token_read_at is None or now - self._token_read_at >= TOKEN_FILE_REFRESH:
                try:
                    with open(self._token_file, encoding="utf-8") as f:
                        self._file_token = f.read().strip() or None
                except OSError:
                    self._file_token = None
                self._token_read_at = now
            return self._file_token

    # -- submit ------------------------------------------------------------------

    def submit(
        self,
        task_type: str,
        payload: Any = None,
        *,
        idempotency_key: Optional[str] = None,
        delay: Optional[Duration] = None,
        eta: Optional[datetime] = None,
        priority: Optional[int] = None,
        unique_key: Optional[str] = None,
        max_retries: Optional[int] = None,
        timeout: Optional[Duration] = None,
        depends_on: Optional[Sequence[str]] = None,
        traceparent: Optional[str] = None,
        tracestate: Optional[str] = None,
        expires_at: Optional[datetime] = None,
        start_within: Optional[Duration] = None,
        debounce: Optional[Debounce] = None,
        throttle: Optional[Throttle] = None,
    ) -> SubmitResult:
        """Enqueues a task. ``idempotency_key`` is required (a repeat returns the first
        task); :func:`asyncd.idempotency_key_from` derives one from payload fields.
        ``traceparent`` (W3C Trace Context, with its ``tracestate``) puts the task in
        that trace: every executor call receives it.

        ``expires_at`` (an aware datetime, after the task is due) or ``start_within``
        (timedelta, seconds or "90s" after it is due), not both: if no attempt has begun
        by then, retries included, the task ends :data:`EXPIRED` without reaching the
        executor. With neither, the job's ``spec.startWithin`` applies, if it has one.

        ``debounce`` (a :class:`Debounce`) or ``throttle`` (a :class:`Throttle`), not
        both, combine the task with its job's other submits of the same key: the answer
        may be ``debounced`` or ``dropped`` (see :class:`SubmitResult`), or
        :class:`asyncd.Throttled` raised. With neither, the job's ``spec.debounce`` or
        ``spec.throttle`` applies, if it has one. Not with ``depends_on``.

        Called from several threads at once, submits share calls (``submit_calls``)."""
        task = Task(task_type, payload, idempotency_key, delay, eta, priority, unique_key,
                    max_retries, timeout, depends_on, expires_at=expires_at, start_within=start_within,
                    debounce=debounce, throttle=throttle)
        trace = _trace_headers(traceparent, tracestate)
        if self._submits is None or trace:
            return SubmitResult.from_json(self._request("POST", "/v1/tasks", self._body(task), trace))
        return self._submits.submit(self._encode(task))

    def submit_delayed(self, task_type: str, payload: Any = None, *, delay: Duration, **kwargs: Any) -> SubmitResult:
        """Enqueues a task to run after ``delay`` (timedelta, seconds or "90s")."""
        return self.submit(task_type, payload, delay=delay, **kwargs)

    def submit_at(self, task_type: str, payload: Any = None, *, eta: datetime, **kwargs: Any) -> SubmitResult:
        """Enqueues a task to run at ``eta`` (a timezone-aware datetime)."""
        return self.submit(task_type, payload, eta=eta, **kwargs)

    def submit_batch(self, tasks: Sequence[Union[Task, Mapping[str, Any]]], *,
                     traceparent: Optional[str] = None, tracestate: Optional[str] = None) -> List[BatchResult]:
        """Enqueues up to 1000 tasks in one call; each result says how its item fared.
        ``traceparent`` puts every task of the batch in that trace."""
        bodies = []
        for i, t in enumerate(tasks):
            task = t if isinstance(t, Task) else Task(**t)
            try:
                bodies.append(self._encode(task))
            except MissingIdempotencyKey as e:
                raise MissingIdempotencyKey(f"task {i}: {e}") from None
        return self._post_batch(bodies, _trace_headers(traceparent, tracestate))

    def _encode(self, t: Task) -> bytes:
        # Encoded in the submitting caller: a payload that is not JSON raises in its own
        # submit rather than failing a call shared with others, and each task's size is
        # known before a call is filled.
        return json.dumps(self._body(t), allow_nan=False).encode("utf-8")

    def _post_one(self, raw: bytes) -> SubmitResult:
        return SubmitResult.from_json(self._request("POST", "/v1/tasks", raw))

    def _post_batch(self, raws: Sequence[bytes], trace: Optional[Dict[str, str]] = None) -> List[BatchResult]:
        answer = self._request("POST", "/v1/tasks:batch", b'{"tasks":[' + b",".join(raws) + b"]}", trace)
        results = answer.get("results") if isinstance(answer, dict) else None
        if not isinstance(results, list) or len(results) != len(raws):
            raise APIError(200, "http_error", f"batch of {len(raws)} answered with {answer!r}")
        out = []
        for r in results:
            status = int(r.get("status", 0))
            if isinstance(r.get("error"), dict):
                out.append(BatchResult(status, error=error_from_body(status, r)))
            else:
                out.append(BatchResult(status, result=SubmitResult.from_json(r)))
        return out

    def _answer_call(self, raws: List[bytes]) -> List[Outcome]:
        """One shared submit call: each submit's own outcome, as if it had been alone."""
        if len(raws) == 1:
            return [_outcome(self._post_one, raws[0])]
        try:
            items = self._post_batch(raws)
        except Exception as e:  # noqa: BLE001 - each submit in the call raises it
            if _too_large(e):
                return [_outcome(self._post_one, r) for r in raws]
            return failed_all(e, len(raws))
        return [(i.result, i.error) for i in items]

    def _body(self, t: Task) -> Dict[str, Any]:
        if not t.type:
            raise ValueError("a task needs a type")
        if not t.idempotency_key:
            raise MissingIdempotencyKey()
        if t.delay is not None and t.eta is not None:
            raise ValueError("a task takes a delay or an eta, not both")
        if t.expires_at is not None and t.start_within is not None:
            raise ValueError("a task takes an expires_at or a start_within, not both")
        if t.debounce is not None and t.throttle is not None:
            raise ValueError("a task takes a debounce or a throttle, not both")
        body: Dict[str, Any] = {"type": t.type, "payload": t.payload, "idempotency_key": t.idempotency_key}
        if t.delay is not None:
            body["delay"] = format_duration(t.delay)
        if t.eta is not None:
            body["eta"] = format_time(t.eta)
        if t.expires_at is not None:
            body["expires_at"] = format_time(t.expires_at, "expires_at")
        if t.start_within is not None:
            body["start_within"] = format_duration(t.start_within)
        if t.priority is not None:
            body["priority"] = t.priority
        if t.unique_key is not None:
            body["unique_key"] = t.unique_key
        if t.max_retries is not None:
            body["max_retries"] = t.max_retries
        if t.timeout is not None:
            body["timeout"] = format_duration(t.timeout)
        if t.depends_on:
            body["depends_on"] = list(t.depends_on)
        if t.debounce is not None:
            body["debounce"] = _window(t.debounce, Debounce).to_json()
        if t.throttle is not None:
            body["throttle"] = _window(t.throttle, Throttle).to_json()
        if self.service_name:
            body["source_service"] = self.service_name
        return body

    # -- inspect, cancel, dead letters ----------------------------------------------

    def get(self, task_id: str) -> TaskStatus:
        """The task with ``task_id``; raises :class:`asyncd.NotFound`."""
        return TaskStatus.from_json(self._request("GET", f"/v1/tasks/{_q(task_id)}"))

    def change(self, task_id: str, *, payload: Any = None, delay: Optional[Duration] = None,
               eta: Optional[datetime] = None, run_now: bool = False,
               priority: Optional[int] = None) -> TaskStatus:
        """Changes a task that has not begun (blocked, pending or claimed) in place, its id
        kept (``PATCH /v1/tasks/{id}``), and returns it as :meth:`get` would. What is left
        out (``None``) keeps its value: ``payload`` (``None`` cannot be set), the due time
        (``delay`` or ``eta``, or ``run_now=True`` for now) and ``priority``. A dispatcher
        that claimed the task loses the claim, so no attempt begins with the values
        replaced. Raises :class:`asyncd.TaskStarted` (``.state`` says whether it runs or
        ended) once an attempt has begun, and :class:`asyncd.InvalidField` for a payload
        from which the job renders another unique or concurrency key."""
        body = _change_body(payload, delay, eta, run_now, priority)
        return TaskStatus.from_json(self._request("PATCH", f"/v1/tasks/{_q(task_id)}", body))

    def change_in_job(self, job: str, task_id: str, *, payload: Any = None, delay: Optional[Duration] = None,
                      eta: Optional[datetime] = None, run_now: bool = False,
                      priority: Optional[int] = None) -> Union[TaskStatus, PendingChange]:
        """:meth:`change` naming the task's job (its AsyncJobConfig's name;
        ``PATCH /v1/tasks/{id}?job=``). A stored task is changed as :meth:`change` changes
        it, and returned as a :class:`TaskStatus` (200). A task of a Kafka-routed job whose
        message no dispatcher has consumed yet — which :meth:`change` raises
        :class:`asyncd.NotFound` for — gets the change recorded, and takes it when it is
        stored: the answer is a :class:`PendingChange` (202). A second change before then
        adds to the first. The server recognizes such a task by a time-ordered id, the id
        it gives a task submitted without an idempotency key; a task submitted with one
        (as every submit of this SDK is) has an id derived from the key and is found only
        once stored. A new payload before consumption raises :class:`asyncd.InvalidField`
        (``field == "payload"``) when the job renders keys from the payload; a job no
        config declares, :class:`asyncd.InvalidField` (``field == "job"``)."""
        if not job:
            raise ValueError("change_in_job needs a job")
        body = _change_body(payload, delay, eta, run_now, priority)
        path = f"/v1/tasks/{_q(task_id)}?" + urllib.parse.urlencode({"job": job})
        status, d = self._request_status("PATCH", path, body)
        if status == 202:
            return PendingChange.from_json(d)
        return TaskStatus.from_json(d)

    def cancel(self, task_id: str, job: Optional[str] = None) -> None:
        """Cancels a task that has not finished (a running attempt is told on its next
        heartbeat); raises :class:`asyncd.NotCancellable` (``.state`` says where it is)
        for a finished one.

        ``job`` names the task's job (its AsyncJobConfig's name;
        ``DELETE /v1/tasks/{id}?job=``): a task of a Kafka-routed job that no dispatcher
        has consumed yet is not in the store, so without it that task is
        :class:`asyncd.NotFound`; with it, it is recorded as cancelled and never runs. A
        job no config declares raises :class:`asyncd.InvalidField` (``field == "job"``)."""
        path = f"/v1/tasks/{_q(task_id)}"
        if job is not None:
            path += "?" + urllib.parse.urlencode({"job": job})
        self._request("DELETE", path)

    def cancel_unique(self, job: str, unique_key: str) -> CancelResult:
        """Cancels the unfinished task of ``job`` (its AsyncJobConfig's name) that holds
        ``unique_key`` (``DELETE /v1/tasks?job=&unique_key=``); raises
        :class:`asyncd.NotFound` when no unfinished task holds it."""
        q = urllib.parse.urlencode({"job": job, "unique_key": unique_key})
        d = self._request("DELETE", f"/v1/tasks?{q}")
        return CancelResult(id=d["id"], state=d["state"])

    def trigger_cron(self, job: str, entry: str) -> CronTrigger:
        """Fires the cron entry named ``entry`` (its ``spec.cron[].name``) of ``job`` once,
        now, besides its schedule (``POST /v1/jobs/{job}/cron/{entry}/trigger``): a new
        task with the entry's payload, due now. An unknown job or entry raises
        :class:`asyncd.NotFound`, whose ``field`` says which."""
        d = self._request("POST", f"/v1/jobs/{_q(job)}/cron/{_q(entry)}/trigger")
        return CronTrigger(id=d["id"], job=d["job"], entry=d["entry"], type=d["type"],
                           eta=parse_time(d["eta"]))

    def dead_letters(self, type: Optional[str] = None, limit: Optional[int] = None) -> List[TaskStatus]:  # noqa: A002
        """Dead tasks, newest first, optionally of one type (limit: server default 100)."""
        q: Dict[str, Any] = {}
        if type:
            q["type"] = type
        if limit is not None:
            q["limit"] = limit
        path = "/v1/dead-letters" + ("?" + urllib.parse.urlencode(q) if q else "")
        answer = self._request("GET", path)
        return [TaskStatus.from_json(i) for i in (answer or {}).get("items", [])]

    def redrive(self, task_id: str) -> RedriveResult:
        """Puts a dead task back to pending, due now, attempts reset."""
        d = self._request("POST", f"/v1/dead-letters/{_q(task_id)}/redrive")
        eta = d.get("eta")
        return RedriveResult(id=d["id"], state=d["state"], eta=parse_time(eta) if isinstance(eta, str) else None)

    def search(self, *, job: Optional[str] = None, type: Optional[str] = None,  # noqa: A002
               state: Optional[str] = None, unique_key: Optional[str] = None,
               created_after: Optional[datetime] = None, eta_before: Optional[datetime] = None,
               limit: Optional[int] = None, cursor: Optional[str] = None) -> TaskPage:
        """Tasks matching every filter given, newest first, one page (``GET /v1/tasks``)."""
        q: Dict[str, Any] = {k: v for k, v in (("job", job), ("type", type), ("state", state),
                                                ("unique_key", unique_key), ("limit", limit),
                                                ("cursor", cursor)) if v is not None}
        if created_after is not None:
            q["created_after"] = format_time(created_after)
        if eta_before is not None:
            q["eta_before"] = format_time(eta_before)
        d = self._request("GET", "/v1/tasks" + ("?" + urllib.parse.urlencode(q) if q else "")) or {}
        return TaskPage(items=[TaskStatus.from_json(i) for i in d.get("items", [])],
                        next_cursor=d.get("next_cursor"), truncated=bool(d.get("truncated")))

    def redrive_dead_letters(self, **filter: Any) -> BulkResult:
        """Redrives up to ``limit`` (default 1000) dead letters matching the filter —
        ``job`` or ``type`` (required), ``error_prefix``, ``dead_after``, ``dead_before``
        (datetimes), ``dry_run`` — oldest death first. Call again with the answer's
        ``dead_before`` until ``remaining`` is 0: each call is idempotent, so an
        interrupted loop is finished by running it again."""
        return self._bulk("redrive", filter)

    def purge_dead_letters(self, **filter: Any) -> BulkResult:
        """Deletes dead letters matching the filter, as :meth:`redrive_dead_letters`
        redrives them."""
        return self._bulk("purge", filter)

    def _bulk(self, action: str, filter: Mapping[str, Any]) -> BulkResult:  # noqa: A002
        body = {k: (format_time(v) if isinstance(v, datetime) else v) for k, v in filter.items() if v is not None}
        d = self._request("POST", f"/v1/dead-letters/{action}", body)
        return BulkResult(matched=d["matched"], affected=d["affected"], skipped=d["skipped"],
                          remaining=d["remaining"], dry_run=bool(d["dry_run"]),
                          dead_before=parse_time(d["dead_before"]))

    def pause_job(self, job: str) -> JobStatus:
        """Pauses the job (its AsyncJobConfig's name): no attempt of it begins, its tasks
        wait in the store until :meth:`resume_job`. Idempotent."""
        return self._job_status(self._request("POST", f"/v1/jobs/{_q(job)}/pause"))

    def resume_job(self, job: str) -> JobStatus:
        """Lifts the API's pause; ``paused`` stays true while the config pauses the job."""
        return self._job_status(self._request("POST", f"/v1/jobs/{_q(job)}/resume"))

    @staticmethod
    def _job_status(d: Any) -> JobStatus:
        at = d.get("paused_at")
        return JobStatus(
            job=d["job"],
            task_type=d["task_type"],
            paused=bool(d["paused"]),
            paused_at=parse_time(at) if isinstance(at, str) else None,
            paused_by_config=bool(d["paused_by_config"]),
        )

    # -- schedules -----------------------------------------------------------------

    def create_schedule(self, job: str, name: str, *, cron: Optional[str] = None, every: Optional[Duration] = None,
                        payload: Any = None, priority: Optional[int] = None, overlap: Optional[str] = None,
                        catch_up: Optional[Duration] = None, start_at: Optional[datetime] = None,
                        end_at: Optional[datetime] = None, jitter: Optional[Duration] = None,
                        paused: Optional[bool] = None) -> Schedule:
        """Creates the schedule ``name`` of ``job`` (its AsyncJobConfig's name) with the
        spec given (``POST /v1/schedules``; docs/api.md, "Schedules"):

        - ``cron`` (``"CRON_TZ=Area/City"`` and a 5- or 6-field expression) or ``every``
          (an interval of at least 1 s, counted from ``start_at`` or else from the
          creation), exactly one;
        - ``payload`` of each firing, in whose strings ``{{scheduled_at}}`` becomes the
          firing's instant and ``{{schedule}}`` the schedule's name;
        - ``priority`` (0..9); ``overlap`` (:data:`ALLOW`, :data:`SKIP`,
          :data:`BUFFER_ONE`, :data:`CANCEL_OTHER`); ``catch_up`` (how far back missed
          firings are still created, up to 7 days, ``0`` for none; default an hour);
          ``start_at``, ``end_at`` (aware datetimes); ``jitter`` (up to an hour and up to
          ``every``); ``paused``.

        Durations are timedelta, seconds or strings (``"15m"``). A name the job already
        has raises :class:`asyncd.ScheduleExists` (``field == "name"``): use
        :meth:`put_schedule` to write over it. A bad spec raises
        :class:`asyncd.InvalidField` naming the member; an unknown job
        :class:`asyncd.NotFound` (``field == "job"``). Under ``retry=``, a create that
        was stored but whose answer was lost raises :class:`asyncd.ScheduleExists` from
        its retry; :meth:`put_schedule` is safe to repeat."""
        body = {"job": job, "name": name,
                **_schedule_spec(cron, every, payload, priority, overlap, catch_up, start_at, end_at, jitter, paused)}
        return Schedule.from_json(self._request("POST", "/v1/schedules", body))

    def put_schedule(self, job: str, name: str, *, cron: Optional[str] = None, every: Optional[Duration] = None,
                     payload: Any = None, priority: Optional[int] = None, overlap: Optional[str] = None,
                     catch_up: Optional[Duration] = None, start_at: Optional[datetime] = None,
                     end_at: Optional[datetime] = None, jitter: Optional[Duration] = None,
                     paused: Optional[bool] = None) -> Tuple[Schedule, bool]:
        """Creates the schedule ``name`` of ``job``, or writes the spec over it (``PUT
        /v1/schedules/{job}/{name}``; the keywords of :meth:`create_schedule`, a member
        left out taking its default): an upsert, for a caller that keeps one schedule per
        customer without knowing which exist. Returns the schedule and whether it was
        created (201) rather than written over (200). A job's ``spec.cron`` entry raises
        :class:`asyncd.ScheduleReadOnly`."""
        body = _schedule_spec(cron, every, payload, priority, overlap, catch_up, start_at, end_at, jitter, paused)
        status, d = self._request_status("PUT", _schedule_path(job, name), body)
        return Schedule.from_json(d), status == 201

    def get_schedule(self, job: str, name: str) -> Schedule:
        """The schedule ``name`` of ``job``; raises :class:`asyncd.NotFound` when the job
        has none of that name (``field == "name"``; ``"job"`` for an unknown job)."""
        return Schedule.from_json(self._request("GET", _schedule_path(job, name)))

    def list_schedules(self, job: str, cursor: Optional[str] = None, limit: Optional[int] = None) -> SchedulePage:
        """One page of ``job``'s schedules, by name, its ``spec.cron`` entries among them
        (``source == "config"``): at most ``limit`` (1 to :data:`MAX_SCHEDULE_PAGE`;
        the server's default, 100, when None), after ``cursor``, a previous page's
        ``next_cursor``. :meth:`iter_schedules` goes through every page."""
        q: Dict[str, Any] = {"job": job}
        if cursor is not None:
            q["cursor"] = cursor
        if limit is not None:
            q["limit"] = limit
        return SchedulePage.from_json(self._request("GET", "/v1/schedules?" + urllib.parse.urlencode(q)) or {})

    def iter_schedules(self, job: str, page_size: int = MAX_SCHEDULE_PAGE) -> Iterator[Schedule]:
        """Every schedule of ``job``, by name, read ``page_size`` at a time."""
        cursor: Optional[str] = None
        while True:
            page = self.list_schedules(job, cursor, page_size)
            yield from page.items
            if not page.next_cursor or not page.items:
                return
            cursor = page.next_cursor

    def change_schedule(self, job: str, name: str, **changes: Any) -> Schedule:
        """Changes members of the schedule's spec (``PATCH /v1/schedules/{job}/{name}``),
        the keywords of :meth:`create_schedule`: each given replaces the schedule's, one
        given as None clears it (back to its default), the rest are kept; giving ``cron``
        drops ``every`` and the reverse. At least one is needed (``ValueError``). The
        schedule is planned afresh from the time of the call; firings already created (at
        most a minute ahead) keep their values. A job's ``spec.cron`` entry raises
        :class:`asyncd.ScheduleReadOnly`; a member the spec does not have
        :class:`asyncd.MalformedJSON`, a bad value :class:`asyncd.InvalidField`, each
        naming it."""
        return Schedule.from_json(self._request("PATCH", _schedule_path(job, name), _schedule_patch(changes)))

    def pause_schedule(self, job: str, name: str) -> Schedule:
        """Pauses the schedule: it creates no firings (``next_firing`` is None) until
        :meth:`resume_schedule`; firings already created stay."""
        return Schedule.from_json(self._request("POST", _schedule_path(job, name, "/pause")))

    def resume_schedule(self, job: str, name: str) -> Schedule:
        """Resumes a paused schedule: it goes on with its next firing; the firings of the
        pause are not caught up."""
        return Schedule.from_json(self._request("POST", _schedule_path(job, name, "/resume")))

    def delete_schedule(self, job: str, name: str) -> None:
        """Deletes the schedule (``DELETE /v1/schedules/{job}/{name}``); the firings it
        created stay. A job's ``spec.cron`` entry raises :class:`asyncd.ScheduleReadOnly`."""
        self._request("DELETE", _schedule_path(job, name))

    def trigger_schedule(self, job: str, name: str) -> CronTrigger:
        """Fires the schedule once, now, besides its firings (``POST
        /v1/schedules/{job}/{name}/trigger``): the task it created, as :meth:`trigger_cron`
        returns it (``entry`` is the schedule's name). A ``spec.cron`` entry can be
        triggered too."""
        d = self._request("POST", _schedule_path(job, name, "/trigger"))
        return CronTrigger(id=d["id"], job=d["job"], entry=d["entry"], type=d["type"], eta=parse_time(d["eta"]))

    def backfill_schedule(self, job: str, name: str, from_: datetime, to: datetime) -> BackfillResult:
        """Creates the schedule's firings whose instants fall in ``[from_, to)`` (aware
        datetimes), as if it had been running then: those whose instant has passed are due
        at once, the others at their instant. At most :data:`MAX_BACKFILL` per call (more,
        or a ``to`` not after ``from_``, raises :class:`asyncd.InvalidField` naming
        ``to``). Each firing is created once however often the backfill is repeated:
        ``created`` counts the new ones among ``firings``. Overlap does not apply. An
        ``every`` schedule has no firing before its ``start_at`` (or, without one, its
        creation). A ``spec.cron`` entry can be backfilled too."""
        body = {"from": format_time(from_, "from_"), "to": format_time(to, "to")}
        return BackfillResult.from_json(self._request("POST", _schedule_path(job, name, "/backfill"), body))

    def _request(self, method: str, path: str, body: Any = None, extra: Optional[Dict[str, str]] = None) -> Any:
        if self.retry is None:
            return self._send(method, path, body, extra)
        return self.retry.run(lambda: self._send(method, path, body, extra))

    def _request_status(self, method: str, path: str, body: Any = None) -> Tuple[int, Any]:
        """:meth:`_request` that also returns the status of the 2xx answer (of the last
        attempt, under ``retry``)."""
        if self.retry is None:
            return self._send_status(method, path, body)
        return self.retry.run(lambda: self._send_status(method, path, body))

    def _api_headers(self, extra: Optional[Dict[str, str]] = None) -> Optional[Dict[str, str]]:
        headers = {SOURCE_SERVICE_HEADER: self.service_name} if self.service_name else {}
        headers.update(extra or {})
        token = self._bearer()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return headers or None

    def _send(self, method: str, path: str, body: Any = None, extra: Optional[Dict[str, str]] = None) -> Any:
        return http_json(method, self.endpoint + path, body, headers=self._api_headers(extra), timeout=self.timeout)

    def _send_status(self, method: str, path: str, body: Any = None) -> Tuple[int, Any]:
        return http_json_status(method, self.endpoint + path, body, headers=self._api_headers(), timeout=self.timeout)


W = TypeVar("W", Debounce, Throttle)


def _window(value: Any, cls: Type[W]) -> W:
    """A :class:`Debounce` or :class:`Throttle` given as such or as a mapping of its
    fields (a batch's dict tasks)."""
    if isinstance(value, cls):
        return value
    if isinstance(value, Mapping):
        return cls(**value)
    raise TypeError(f"{cls.__name__.lower()} must be an asyncd.{cls.__name__} or a mapping, not {type(value).__name__}")


def _outcome(post_one: Callable[[bytes], SubmitResult], raw: bytes) -> Outcome:
    try:
        return post_one(raw), None
    except Exception as e:  # noqa: BLE001 - the submit raises it
        return None, e


def _too_large(err: BaseException) -> bool:
    # The API's batch body limit is below what a shared call carried: each task alone
    # fits whatever a single submit of it would, so the call is sent again task by task.
    return isinstance(err, APIError) and err.status == 413


def _trace_headers(traceparent: Optional[str], tracestate: Optional[str]) -> Dict[str, str]:
    headers = {}
    if traceparent:
        headers["traceparent"] = traceparent
        if tracestate:
            headers["tracestate"] = tracestate
    return headers


def _change_body(payload: Any, delay: Optional[Duration], eta: Optional[datetime], run_now: bool,
                 priority: Optional[int]) -> Dict[str, Any]:
    """The body of ``PATCH /v1/tasks/{id}``: what is ``None`` is left out."""
    if delay is not None and eta is not None:
        raise ValueError("a change takes a delay or an eta, not both")
    body: Dict[str, Any] = {}
    if payload is not None:
        body["payload"] = payload
    if delay is not None:
        body["delay"] = format_duration(delay)
    if eta is not None:
        body["eta"] = format_time(eta)
    if run_now:
        body["run_now"] = True
    if priority is not None:
        body["priority"] = priority
    return body


def _q(task_id: str) -> str:
    return urllib.parse.quote(task_id, safe="")


def _schedule_path(job: str, name: str, rest: str = "") -> str:
    """``/v1/schedules/{job}/{name}`` and what follows it, the segments escaped."""
    return f"/v1/schedules/{_q(job)}/{_q(name)}{rest}"


T = TypeVar("T")


class AsyncClient:
    """The :class:`Client` API for asyncio code (an ASGI app, say): every call is a
    coroutine, and the blocking HTTP request runs in a worker thread
    (``asyncio.to_thread``), so awaiting it never blocks the event loop. Retries
    (``retry=``) wait with ``asyncio.sleep``; cancelling the awaiting task stops them.
    Takes the same arguments as :class:`Client`.

    Concurrent submits (tasks of one event loop) share calls as the :class:`Client`'s
    threads do (``submit_calls``); a submit cancelled while it is queued is not sent."""

    def __init__(self, endpoint: str = DEFAULT_ENDPOINT, service_name: Optional[str] = None, *,
                 retry: Optional[RetryPolicy] = None, submit_calls: int = DEFAULT_SUBMIT_CALLS,
                 **kwargs: Any) -> None:
        if submit_calls < 0:
            raise ValueError("submit_calls must be 0 (off) or more")
        # The wrapped client sends single attempts; the retries happen here, off the
        # thread. Its submits come from here one call at a time, so it queues none itself.
        self._client = Client(endpoint, service_name, submit_calls=0, **kwargs)
        self.endpoint = self._client.endpoint
        self.retry = retry
        self._submits = AsyncSubmitQueue(submit_calls, self._answer_call) if submit_calls else None

    async def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        def attempt() -> Awaitable[T]:
            return asyncio.get_running_loop().run_in_executor(None, functools.partial(fn, *args, **kwargs))

        if self.retry is None:
            return await attempt()
        return await self.retry.run_async(attempt)

    async def submit(self, task_type: str, payload: Any = None, **kwargs: Any) -> SubmitResult:
        """:meth:`Client.submit`."""
        if self._submits is None or kwargs.get("traceparent"):
            return await self._call(self._client.submit, task_type, payload, **kwargs)
        kwargs.pop("traceparent", None)
        kwargs.pop("tracestate", None)
        result: SubmitResult = await self._submits.submit(self._client._encode(Task(task_type, payload, **kwargs)))
        return result

    async def submit_delayed(self, task_type: str, payload: Any = None, *, delay: Duration,
                             **kwargs: Any) -> SubmitResult:
        """:meth:`Client.submit_delayed`."""
        return await self.submit(task_type, payload, delay=delay, **kwargs)

    async def submit_at(self, task_type: str, payload: Any = None, *, eta: datetime, **kwargs: Any) -> SubmitResult:
        """:meth:`Client.submit_at`."""
        return await self.submit(task_type, payload, eta=eta, **kwargs)

    async def _answer_call(self, raws: List[bytes]) -> List[Outcome]:
        """:meth:`Client._answer_call`, each call retried here."""
        async def one(raw: bytes) -> Outcome:
            try:
                return await self._call(self._client._post_one, raw), None
            except Exception as e:  # noqa: BLE001 - the submit raises it
                return None, e

        if len(raws) == 1:
            return [await one(raws[0])]
        try:
            items = await self._call(self._client._post_batch, raws)
        except Exception as e:  # noqa: BLE001 - each submit in the call raises it
            if _too_large(e):
                return [await one(r) for r in raws]
            return failed_all(e, len(raws))
        return [(i.result, i.error) for i in items]

    async def submit_batch(self, tasks: Sequence[Union[Task, Mapping[str, Any]]], **kwargs: Any) -> List[BatchResult]:
        """:meth:`Client.submit_batch`."""
        return await self._call(self._client.submit_batch, tasks, **kwargs)

    async def get(self, task_id: str) -> TaskStatus:
        """:meth:`Client.get`."""
        return await self._call(self._client.get, task_id)

    async def change(self, task_id: str, **kwargs: Any) -> TaskStatus:
        """:meth:`Client.change`."""
        return await self._call(self._client.change, task_id, **kwargs)

    async def change_in_job(self, job: str, task_id: str, **kwargs: Any) -> Union[TaskStatus, PendingChange]:
        """:meth:`Client.change_in_job`."""
        return await self._call(self._client.change_in_job, job, task_id, **kwargs)

    async def cancel(self, task_id: str, job: Optional[str] = None) -> None:
        """:meth:`Client.cancel`."""
        await self._call(self._client.cancel, task_id, job)

    async def cancel_unique(self, job: str, unique_key: str) -> CancelResult:
        """:meth:`Client.cancel_unique`."""
        return await self._call(self._client.cancel_unique, job, unique_key)

    async def trigger_cron(self, job: str, entry: str) -> CronTrigger:
        """:meth:`Client.trigger_cron`."""
        return await self._call(self._client.trigger_cron, job, entry)

    async def dead_letters(self, type: Optional[str] = None, limit: Optional[int] = None) -> List[TaskStatus]:  # noqa: A002
        """:meth:`Client.dead_letters`."""
        return await self._call(self._client.dead_letters, type, limit)

    async def redrive(self, task_id: str) -> RedriveResult:
        """:meth:`Client.redrive`."""
        return await self._call(self._client.redrive, task_id)

    async def search(self, **filters: Any) -> TaskPage:
        """:meth:`Client.search`."""
        return await self._call(self._client.search, **filters)

    async def redrive_dead_letters(self, **filter: Any) -> BulkResult:  # noqa: A002
        """:meth:`Client.redrive_dead_letters`."""
        return await self._call(self._client.redrive_dead_letters, **filter)

    async def purge_dead_letters(self, **filter: Any) -> BulkResult:  # noqa: A002
        """:meth:`Client.purge_dead_letters`."""
        return await self._call(self._client.purge_dead_letters, **filter)

    async def create_schedule(self, job: str, name: str, **spec: Any) -> Schedule:
        """:meth:`Client.create_schedule`."""
        return await self._call(self._client.create_schedule, job, name, **spec)

    async def put_schedule(self, job: str, name: str, **spec: Any) -> Tuple[Schedule, bool]:
        """:meth:`Client.put_schedule`."""
        return await self._call(self._client.put_schedule, job, name, **spec)

    async def get_schedule(self, job: str, name: str) -> Schedule:
        """:meth:`Client.get_schedule`."""
        return await self._call(self._client.get_schedule, job, name)

    async def list_schedules(self, job: str, cursor: Optional[str] = None, limit: Optional[int] = None) -> SchedulePage:
        """:meth:`Client.list_schedules`."""
        return await self._call(self._client.list_schedules, job, cursor, limit)

    async def iter_schedules(self, job: str, page_size: int = MAX_SCHEDULE_PAGE) -> AsyncIterator[Schedule]:
        """:meth:`Client.iter_schedules`, for ``async for``."""
        cursor: Optional[str] = None
        while True:
            page = await self.list_schedules(job, cursor, page_size)
            for item in page.items:
                yield item
            if not page.next_cursor or not page.items:
                return
            cursor = page.next_cursor

    async def change_schedule(self, job: str, name: str, **changes: Any) -> Schedule:
        """:meth:`Client.change_schedule`."""
        return await self._call(self._client.change_schedule, job, name, **changes)

    async def pause_schedule(self, job: str, name: str) -> Schedule:
        """:meth:`Client.pause_schedule`."""
        return await self._call(self._client.pause_schedule, job, name)

    async def resume_schedule(self, job: str, name: str) -> Schedule:
        """:meth:`Client.resume_schedule`."""
        return await self._call(self._client.resume_schedule, job, name)

    async def delete_schedule(self, job: str, name: str) -> None:
        """:meth:`Client.delete_schedule`."""
        await self._call(self._client.delete_schedule, job, name)

    async def trigger_schedule(self, job: str, name: str) -> CronTrigger:
        """:meth:`Client.trigger_schedule`."""
        return await self._call(self._client.trigger_schedule, job, name)

    async def backfill_schedule(self, job: str, name: str, from_: datetime, to: datetime) -> BackfillResult:
        """:meth:`Client.backfill_schedule`."""
        return await self._call(self._client.backfill_schedule, job, name, from_, to)
