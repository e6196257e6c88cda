-- Per-key rate limits (`concurrencyKey.rateLimit`; docs/design.md, "Per-key limits"):
-- one token bucket per job and key, made by the first attempt of the key that begins.
-- `id` is the task type and the key with U+001F between them, so the bucket is taken
-- with the statements of every limits row (`GateRow`); `tokens` in thousandths of a
-- token as of `refilled_at` (UTC milliseconds). The start of a keyed job's attempts
-- takes the buckets of its batch's keys after the job's `job_limits` row and its
-- limiters' rows, in key order. The retention pass deletes buckets idle for a day (full
-- again at any rate the spec accepts, unless its burst outlasts a day of refills).
CREATE TABLE key_buckets (
    id          TEXT PRIMARY KEY,
    tokens      INTEGER NOT NULL,
    refilled_at INTEGER NOT NULL
);
CREATE INDEX key_buckets_idle ON key_buckets (refilled_at);
