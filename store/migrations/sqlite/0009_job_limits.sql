-- Flow control across dispatchers (docs/design.md, "Limits"). One row per task type,
-- created by the first attempt that begins: the start of attempts locks it (every
-- dispatcher's, so they take turns), counts the type's running attempts against
-- `spec.concurrency` and takes tokens from the bucket `spec.rateLimit` describes:
-- `tokens` in thousandths of a token, as of `refilled_at` (UTC milliseconds).
CREATE TABLE job_limits (
    task_type TEXT PRIMARY KEY,
    tokens INTEGER NOT NULL,
    refilled_at INTEGER NOT NULL
);

-- The count of a type's running attempts reads only those.
CREATE INDEX tasks_running ON tasks (task_type) WHERE state = 'running';
