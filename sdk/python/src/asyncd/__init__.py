"""Client and executor helpers for the asyncd task queue.

Submit with :class:`Client`; serve tasks with ``@client.executor("type")`` and
``client.wsgi_app()`` / ``client.asgi_app()``. Standard library only.
"""

from ._client import (
    BLOCKED,
    CANCELLED,
    CLAIMED,
    DEAD,
    DEFAULT_ENDPOINT,
    DEFAULT_TOKEN_FILE,
    PENDING,
    RUNNING,
    SOURCE_SERVICE_HEADER,
    SUCCEEDED,
    BatchResult,
    Client,
    RedriveResult,
    SubmitResult,
    Task,
    TaskStatus,
)
from ._cron import InvalidCron, is_valid_cron, validate_cron
from ._errors import (
    APIError,
    AsyncdError,
    BadSignature,
    Conflict,
    Forbidden,
    InvalidField,
    MalformedJSON,
    MissingIdempotencyKey,
    NotCancellable,
    NotDead,
    NotFound,
    PayloadTooLarge,
    StaleLease,
    TransportError,
    Unauthenticated,
    UniqueConflict,
    UnknownTaskType,
)
from ._executor import (
    DEFAULT_LEASE,
    SIGNATURE_TOLERANCE,
    Executor,
    Permanent,
    Retry,
    TaskContext,
    ThreadingWSGIServer,
    sign,
    verify_signature,
)
from ._idempotency import canonical_json, idempotency_key_from
from ._jobconfig import job_config, job_config_yaml, to_yaml
from ._time import format_duration, parse_duration

__version__ = "0.1.0"

__all__ = [
    "APIError", "AsyncdError", "BadSignature", "BatchResult", "BLOCKED", "CANCELLED", "CLAIMED", "Client",
    "Conflict", "DEAD", "DEFAULT_ENDPOINT", "DEFAULT_LEASE", "DEFAULT_TOKEN_FILE", "Executor", "Forbidden",
    "InvalidCron", "InvalidField",
    "MalformedJSON", "MissingIdempotencyKey", "NotCancellable", "NotDead", "NotFound", "PENDING",
    "PayloadTooLarge", "Permanent", "RUNNING", "RedriveResult", "Retry", "SIGNATURE_TOLERANCE",
    "SOURCE_SERVICE_HEADER", "SUCCEEDED", "StaleLease", "SubmitResult", "Task", "TaskContext", "TaskStatus",
    "ThreadingWSGIServer", "TransportError", "Unauthenticated", "UniqueConflict", "UnknownTaskType", "canonical_json",
    "format_duration", "idempotency_key_from", "is_valid_cron", "job_config", "job_config_yaml",
    "parse_duration", "sign", "to_yaml", "validate_cron", "verify_signature",
]
