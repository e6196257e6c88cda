"""Errors raised by the asyncd client, mirroring the API's error codes."""

from __future__ import annotations

import json
from typing import Any, Dict, Optional, Type


class AsyncdError(Exception):
    """Base class of every error this package raises."""


class MissingIdempotencyKey(AsyncdError, ValueError):
    """A submit without an idempotency key: refused before anything is sent, since a
    retried submit could otherwise enqueue the task twice."""

    def __init__(self, message: str = "submit needs an idempotency_key (see asyncd.idempotency_key_from)") -> None:
        super().__init__(message)


class TransportError(AsyncdError):
    """The API could not be reached (connection refused, timeout, TLS, ...). Retryable:
    a submit carries its idempotency key, so sending it again cannot enqueue twice."""

    retryable = True
    retry_after: Optional[float] = None


class BadSignature(AsyncdError):
    """An executor call whose Asyncd-Signature does not verify."""


class MalformedTimestamp(BadSignature):
    """An executor call without a readable Asyncd-Timestamp."""


class StaleTimestamp(BadSignature):
    """An executor call whose Asyncd-Timestamp is more than five minutes off."""


class Replayed(BadSignature):
    """A second executor call for a (task, attempt) already delivered within the window."""


class APIError(AsyncdError):
    """A refusal by the asyncd API. ``code`` is the API's error code; subclasses exist
    per code so callers can ``except asyncd.NotFound``."""

    code_name: str = ""
    #: What the message starts with before the code (a 429 says it is a rate limit).
    _lead: str = ""

    def __init__(
        self,
        status: int,
        code: str,
        message: str = "",
        field: Optional[str] = None,
        existing_id: Optional[str] = None,
        state: Optional[str] = None,
        body: Any = None,
        retry_after: Optional[float] = None,
    ) -> None:
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        self.existing_id = existing_id
        self.state = state
        self.body = body
        #: The answer's ``Retry-After`` in seconds (the 503s and 429s send one), else
        #: None (also when it was unreadable).
        self.retry_after = retry_after
        text = f"{self._lead}{code} ({status})"
        if field:
            text += f" field {field}"
        if message:
            text += f": {message}"
        super().__init__(text)

    def __reduce__(self) -> Any:
        # Rebuilt from its fields, so copy.copy works: a call shared by several submits
        # gives each its own copy of the error it failed with (and pickle works too).
        return (type(self), (self.status, self.code, self.message, self.field, self.existing_id, self.state,
                             self.body, self.retry_after))

    @property
    def retryable(self) -> bool:
        """Whether the same call may succeed if sent again: the 503s
        (:class:`Unavailable`), every 429 (:class:`RateLimited`) and a proxy's 502 or
        504. Every other refusal is about the request and answers the same again."""
        # asyncd answers 429 (auth_unavailable, under --auth kubernetes, when one address
        # sends too many new tokens) while authenticating the caller, before the handler
        # reads the body, so nothing was stored or changed; a proxy's 429 did not forward
        # the call at all. Sending it again is safe for a submit on both counts, as it is
        # anyway with its idempotency key.
        if self.status in (429, 503):
            return True
        return self.code == "http_error" and self.status in (502, 504)


class MalformedJSON(APIError):
    code_name = "malformed_json"


class InvalidField(APIError):
    code_name = "invalid_field"


class UnknownTaskType(APIError):
    """No AsyncJobConfig declares the task type (``field`` is ``"type"``). Its own class,
    as in the Go and Rust SDKs (not an :class:`InvalidField`)."""

    code_name = "unknown_task_type"


class PayloadTooLarge(APIError):
    code_name = "payload_too_large"


class NotFound(APIError):
    code_name = "not_found"


class Unauthenticated(APIError):
    """401: no bearer token, or one the server does not accept (unknown, expired, for
    another audience). Give the client ``token=`` or ``token_file=``."""

    code_name = "unauthenticated"


class Forbidden(APIError):
    """403: the token's caller may not do this to this job."""

    code_name = "forbidden"


class Conflict(APIError):
    """Base of the 409 answers."""


class UniqueConflict(Conflict):
    """A pending task already holds the unique key; ``existing_id`` names it."""

    code_name = "unique_conflict"


class NotCancellable(Conflict):
    """The task is past pending; ``state`` names where it is, when the API says."""

    code_name = "not_cancellable"


class IdempotencyMismatch(Conflict):
    """The idempotency key belongs to a task with another type or payload;
    ``existing_id`` names it. Use a new key for a new request."""

    code_name = "idempotency_mismatch"


class StaleLease(Conflict):
    code_name = "stale_lease"


class NotDead(Conflict):
    code_name = "not_dead"


class TaskStarted(Conflict):
    """A change of a task that is no longer waiting to begin; ``state`` says whether it
    is running or ended. Nothing changed."""

    code_name = "task_started"


class Throttled(Conflict):
    """A submit under a :class:`asyncd.Throttle` with ``on_limit=REFUSE`` while its key's
    window is open: ``existing_id`` names the task the key last stored, ``field`` is
    ``"throttle"``. Nothing was stored; the same submit is refused until the window
    closes (not retryable)."""

    code_name = "throttled"


class ScheduleExists(Conflict):
    """:meth:`asyncd.Client.create_schedule` of a name the job already has a schedule
    of (``field`` is ``"name"``); nothing changed. :meth:`asyncd.Client.put_schedule`
    writes over it instead."""

    code_name = "schedule_exists"


class ScheduleReadOnly(Conflict):
    """A change, pause, resume, delete or put of a schedule that is its job's
    ``spec.cron`` entry (``source == "config"``): change the AsyncJobConfig instead. It
    can still be triggered and backfilled."""

    code_name = "schedule_read_only"


class TaskCancelled(APIError):
    """410: a heartbeat or result of an attempt whose task was cancelled while it ran.
    The executor helpers cancel the handler; nothing it sends is recorded."""

    code_name = "task_cancelled"


class Unavailable(APIError):
    """Base of the 503 answers: nothing was done; retry (``retry_after`` says when).
    :class:`asyncd.RetryPolicy` does it for you."""


class RateLimited(APIError):
    """429: the server, or a proxy before it, asks this client to slow down; nothing was
    done. Every 429 is this class whatever its ``code`` (asyncd's own is
    ``auth_unavailable``: too many new bearer tokens from one address under
    ``--auth kubernetes``). Retryable: :class:`asyncd.RetryPolicy` waits its
    ``retry_after`` (at most ``max_backoff``) and sends the call again, so one that still
    raises this has used up its attempts."""

    _lead = "rate limited: "


class StoreUnavailable(Unavailable):
    code_name = "store_unavailable"


class KafkaUnavailable(Unavailable):
    code_name = "kafka_unavailable"


class AuthUnavailable(Unavailable):
    code_name = "auth_unavailable"


class ClockSkew(Unavailable):
    code_name = "clock_skew"


class SigningUnavailable(Unavailable):
    code_name = "signing_unavailable"


_BY_CODE: Dict[str, Type[APIError]] = {
    cls.code_name: cls
    for cls in (MalformedJSON, InvalidField, UnknownTaskType, PayloadTooLarge, NotFound,
                Unauthenticated, Forbidden, UniqueConflict, IdempotencyMismatch, NotCancellable,
                StaleLease, NotDead, TaskStarted, Throttled, ScheduleExists, ScheduleReadOnly, TaskCancelled, StoreUnavailable, KafkaUnavailable, AuthUnavailable, ClockSkew,
                SigningUnavailable)
}


def is_retryable(err: BaseException) -> bool:
    """Whether ``err`` is worth sending again: a retryable :class:`APIError` or a
    :class:`TransportError`."""
    return isinstance(err, TransportError) or (isinstance(err, APIError) and err.retryable)


def parse_retry_after(value: Optional[str], now: Optional[float] = None) -> Optional[float]:
    """A ``Retry-After`` header (seconds or an HTTP date) in seconds, or None."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(int(value))
    try:
        from email.utils import parsedate_to_datetime
        import time as _time

        at = parsedate_to_datetime(value).timestamp()
    # Python before 3.10 returns None for what it cannot parse (AttributeError here).
    except (TypeError, ValueError, IndexError, AttributeError):
        return None
    return max(0.0, at - (_time.time() if now is None else now))


def error_from_response(status: int, raw: bytes, retry_after: Optional[float] = None) -> APIError:
    """Builds the APIError subclass for an answer's status and body."""
    try:
        body = json.loads(raw.decode("utf-8")) if raw else None
    except (ValueError, UnicodeDecodeError):
        body = None
    text = raw.decode("utf-8", "replace").strip()
    if len(text) > 512:
        text = text[:512] + "…"
    err = error_from_body(status, body, text)
    err.retry_after = retry_after
    return err


def error_from_body(status: int, body: Any, text: str = "") -> APIError:
    """Builds the APIError subclass for a decoded ``{"error": {...}}`` body."""
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(body, dict) and isinstance(err, dict) and isinstance(err.get("code"), str):
        code = err["code"]
        cls = RateLimited if status == 429 else _BY_CODE.get(code, APIError)
        # docs/api.md does not say whether existing_id/state sit inside "error" or
        # beside it; accept both.
        return cls(
            status,
            code,
            str(err.get("message") or ""),
            field=err.get("field"),
            existing_id=err.get("existing_id") or body.get("existing_id"),
            state=err.get("state") or body.get("state"),
            body=body,
        )
    return (RateLimited if status == 429 else APIError)(status, "http_error", text, body=body)
