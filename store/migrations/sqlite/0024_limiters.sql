-- Limiters shared across jobs (AsyncLimiter; docs/design.md, "Limiters shared across
-- jobs"): one row per limiter, keyed by its id (`namespace/name`, or the bare name in a
-- config folder), made by the first attempt that begins under it. Every start of an
-- attempt of a job that names the limiter takes the row after the job's own
-- `job_limits` row (0009), counts the running attempts of the limiter's task types
-- against its concurrency, and takes tokens from its bucket: `tokens` in thousandths of
-- a token, as of `refilled_at` (UTC milliseconds).
CREATE TABLE limiters (
    id          TEXT PRIMARY KEY,
    tokens      INTEGER NOT NULL,
    refilled_at INTEGER NOT NULL
);
