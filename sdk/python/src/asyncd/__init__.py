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
    DEFAULT_SUBMIT_CALLS,
    DEFAULT_TOKEN_FILE,
    DROP,
    EXPIRED,
    LEADING,
    PENDING,
    REFUSE,
    RUNNING,
    SOURCE_SERVICE_HEADER,
    SUCCEEDED,
    TRAILING,
    AsyncClient,
    BatchResult,
    BulkResult,
    CancelResult,
    Client,
    CronTrigger,
    Debounce,
    JobStatus,
    RedriveResult,
    SubmitResult,
    Task,
    TaskPage,
    TaskStatus,
    Throttle,
)
from ._cron import InvalidCron, is_valid_cron, validate_cron
from ._errors import (
    APIError,
    AsyncdError,
    AuthUnavailable,
    ClockSkew,
    SigningUnavailable,
    IdempotencyMismatch,
    KafkaUnavailable,
    RateLimited,
    StoreUnavailable,
    Unavailable,
    is_retryable,
    BadSignature,
    Conflict,
    Forbidden,
    InvalidField,
    MalformedJSON,
    MalformedTimestamp,
    MissingIdempotencyKey,
    NotCancellable,
    NotDead,
    NotFound,
    PayloadTooLarge,
    Replayed,
    StaleLease,
    StaleTimestamp,
    TaskCancelled,
    TaskStarted,
    Throttled,
    TransportError,
    Unauthenticated,
    UniqueConflict,
    UnknownTaskType,
)
from ._executor import (
    BATCH_HEADER,
    DEFAULT_BATCH_CONCURRENCY,
    DEFAULT_LEASE,
    MAX_REPLAY_ENTRIES,
    Cancelled,
    SIGNATURE_TOLERANCE,
    Executor,
    Permanent,
    Retry,
    TaskContext,
    ThreadingWSGIServer,
    Verifier,
    batch_canonical_string,
    canonical_string,
    sign,
    verify_signature,
)
from ._retry import RetryPolicy
from ._idempotency import canonical_json, idempotency_key_from
from ._jobconfig import job_config, job_config_yaml, to_yaml
from ._time import format_duration, parse_duration

__version__ = "0.1.0"

__all__ = [
    "AsyncClient", "AuthUnavailable", "Cancelled", "ClockSkew", "SigningUnavailable", "IdempotencyMismatch", "KafkaUnavailable",
    "RateLimited", "RetryPolicy", "StoreUnavailable", "Unavailable", "is_retryable",
    "APIError", "AsyncdError", "BadSignature", "BATCH_HEADER", "batch_canonical_string", "BatchResult", "BulkResult",
    "BLOCKED", "CANCELLED", "CancelResult", "CLAIMED", "Client", "CronTrigger",
    "canonical_json", "canonical_string", "Conflict", "DEAD", "Debounce", "DEFAULT_ENDPOINT",
    "DEFAULT_BATCH_CONCURRENCY", "DEFAULT_LEASE", "DEFAULT_SUBMIT_CALLS", "DEFAULT_TOKEN_FILE", "DROP", "EXPIRED", "Executor", "Forbidden", "InvalidCron",
    "InvalidField", "JobStatus", "LEADING", "MalformedJSON", "MalformedTimestamp", "MAX_REPLAY_ENTRIES",
    "MissingIdempotencyKey", "NotCancellable", "NotDead", "NotFound", "PayloadTooLarge",
    "PENDING", "Permanent", "RedriveResult", "REFUSE", "Replayed", "Retry", "RUNNING",
    "SIGNATURE_TOLERANCE", "SOURCE_SERVICE_HEADER", "StaleLease", "StaleTimestamp",
    "SubmitResult", "SUCCEEDED", "Task", "TaskCancelled", "TaskContext", "TaskStarted", "TaskPage", "TaskStatus", "ThreadingWSGIServer", "Throttle", "Throttled", "TRAILING",
    "TransportError", "Unauthenticated", "UniqueConflict", "UnknownTaskType", "Verifier",
    "format_duration", "idempotency_key_from", "is_valid_cron", "job_config", "job_config_yaml",
    "parse_duration", "sign", "to_yaml", "validate_cron", "verify_signature",
]
