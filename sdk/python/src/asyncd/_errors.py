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
    """The API could not be reached (connection refused, timeout, TLS, ...)."""


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

    def __init__(
        self,
        status: int,
        code: str,
        message: str = "",
        field: Optional[str] = None,
        existing_id: Optional[str] = None,
        state: Optional[str] = None,
        body: Any = None,
    ) -> None:
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        self.existing_id = existing_id
        self.state = state
        self.body = body
        text = f"{code} ({status})"
        if field:
            text += f" field {field}"
        if message:
            text += f": {message}"
        super().__init__(text)


class MalformedJSON(APIError):
    code_name = "malformed_json"


class InvalidField(APIError):
    code_name = "invalid_field"


class UnknownTaskType(InvalidField):
    """No AsyncJobConfig declares the task type. A subclass of InvalidField: the
    ``type`` field is what is wrong."""

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


class StaleLease(Conflict):
    code_name = "stale_lease"


class NotDead(Conflict):
    code_name = "not_dead"


_BY_CODE: Dict[str, Type[APIError]] = {
    cls.code_name: cls
    for cls in (MalformedJSON, InvalidField, UnknownTaskType, PayloadTooLarge, NotFound,
                Unauthenticated, Forbidden, UniqueConflict, NotCancellable, StaleLease, NotDead)
}


def error_from_response(status: int, raw: bytes) -> APIError:
    """Builds the APIError subclass for an answer's status and body."""
    try:
        body = json.loads(raw.decode("utf-8")) if raw else None
    except (ValueError, UnicodeDecodeError):
        body = None
    text = raw.decode("utf-8", "replace").strip()
    if len(text) > 512:
        text = text[:512] + "…"
    return error_from_body(status, body, text)


def error_from_body(status: int, body: Any, text: str = "") -> APIError:
    """Builds the APIError subclass for a decoded ``{"error": {...}}`` body."""
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(body, dict) and isinstance(err, dict) and isinstance(err.get("code"), str):
        code = err["code"]
        cls = _BY_CODE.get(code, APIError)
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
    return APIError(status, "http_error", text, body=body)
