-- Key cooldowns: a key of a job with a `concurrencyKey` whose executor answered 429 or
-- 503 with `Retry-After` rests until then (`ends_at`, UTC milliseconds). The fair claim
-- (`claim_fair`) leaves out the pending tasks of a key resting past its `now`, so that
-- key's tasks wait while the job's other keys go on. One row per job (task type) and
-- key; a later end replaces an earlier one, never the reverse. The retention pass
-- deletes cooldowns that ended.
CREATE TABLE key_cooldowns (
    task_type       TEXT NOT NULL,
    concurrency_key TEXT NOT NULL,
    ends_at         INTEGER NOT NULL,
    PRIMARY KEY (task_type, concurrency_key)
);
CREATE INDEX key_cooldowns_ending ON key_cooldowns (ends_at);
