-- Per-key limits (docs/design.md, "Per-key limits"): the job's `concurrencyKey`
-- rendered from the payload at submit, NULL for a job without one.
ALTER TABLE tasks ADD COLUMN concurrency_key TEXT;

-- The fair claim reads a keyed job's pending, claimed and running tasks from it, key
-- by key, and the start of attempts counts each key's running ones. Keyless tasks
-- are in it too (a NULL key): those of a job that was given a concurrencyKey later
-- are claimed as one key of their own.
CREATE INDEX tasks_keyed ON tasks (task_type, concurrency_key, claim_rank, id)
    WHERE state IN ('pending', 'claimed', 'running');
