-- Limiters shared across jobs (AsyncLimiter; docs/design.md, "Limiters shared across
-- jobs"): one row per limiter, keyed by its id (`namespace/name`, or the bare name in a
-- config folder), made by the first attempt that begins under it. Every start of an
-- attempt of a job that names the limiter takes the row after the job's own
-- `job_limits` row (0009), counts the running attempts of the limiter's task types
-- against its concurrency, and takes tokens from its bucket: `tokens` in thousandths of
-- a token, as of `refilled_at` (UTC milliseconds).
--
-- `waiting` is the task type of a job that found the limiter full with work left, as of
-- `waiting_at` ('' and 0: none): while it is recent, the other jobs' starts leave it the
-- next slot freed, so a job with a deep backlog that refills each slot as it frees it
-- does not starve the limiter's other jobs.
CREATE TABLE limiters (
    id          TEXT PRIMARY KEY,
    tokens      INTEGER NOT NULL,
    refilled_at INTEGER NOT NULL,
    waiting     TEXT NOT NULL DEFAULT '',
    waiting_at  INTEGER NOT NULL DEFAULT 0
);
