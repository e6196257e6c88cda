-- Fewer index writes per task, second step (issue 30). The three keys a task may carry
-- (`idempotency_key`, `unique_active`, `cron_key`) were UNIQUE column constraints, whose
-- indexes hold an entry for every task, NULL or not: three b-tree inserts per submit for
-- keys most tasks never set. They are now partial unique indexes over the tasks that
-- set them. SQLite cannot drop a column constraint, so the table is rebuilt as its
-- documentation prescribes (new table, copy, drop, rename, indexes again); on a large
-- database this migration takes as long as copying the table. Same columns, same
-- order, same generated columns.
--
-- `tasks_running` goes too: the start's count of a type's running attempts reads
-- `tasks_by_type_state` (task_type, state), whose `state IN (…)` term the statement
-- repeats, and the count per concurrency key `tasks_keyed`. A task no longer enters
-- and leaves a third index as its attempt begins and ends.
CREATE TABLE tasks_rebuilt (
    id              TEXT PRIMARY KEY,       -- UUIDv7: sorts by creation time
    task_type       TEXT NOT NULL,
    payload         TEXT NOT NULL,          -- JSON
    state           TEXT NOT NULL,
    priority        INTEGER NOT NULL DEFAULT 0,
    trigger_at      INTEGER NOT NULL,
    attempt         INTEGER NOT NULL DEFAULT 0,
    max_retries     INTEGER NOT NULL,
    timeout_ms      INTEGER NOT NULL,
    lease_token     INTEGER NOT NULL DEFAULT 0,
    lease_until     INTEGER,
    owner           TEXT,
    idempotency_key TEXT,
    unique_key      TEXT,
    -- unique_key while the task is unfinished, NULL after: the partial unique index
    -- below keeps a second pending task for the same key out.
    unique_active   TEXT,
    cron_key        TEXT,
    source_service  TEXT,
    last_error      TEXT,
    result          TEXT,
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL,
    lease_secret    TEXT,
    -- See 0006 (priority ranks) and 0012 (unique keys held after success).
    claim_rank      INTEGER GENERATED ALWAYS AS (trigger_at - priority * 10000) VIRTUAL,
    concurrency_key TEXT,
    traceparent     TEXT,
    tracestate      TEXT,
    unique_for      INTEGER NOT NULL DEFAULT 0,
    unique_until    INTEGER GENERATED ALWAYS AS
        (CASE WHEN state = 'succeeded' AND unique_active IS NOT NULL THEN updated_at + unique_for END)
        VIRTUAL
);
INSERT INTO tasks_rebuilt (id, task_type, payload, state, priority, trigger_at, attempt,
        max_retries, timeout_ms, lease_token, lease_until, owner, idempotency_key,
        unique_key, unique_active, cron_key, source_service, last_error, result,
        created_at, updated_at, lease_secret, concurrency_key, traceparent, tracestate,
        unique_for)
    SELECT id, task_type, payload, state, priority, trigger_at, attempt, max_retries,
        timeout_ms, lease_token, lease_until, owner, idempotency_key, unique_key,
        unique_active, cron_key, source_service, last_error, result, created_at,
        updated_at, lease_secret, concurrency_key, traceparent, tracestate, unique_for
    FROM tasks;
DROP TABLE tasks;
ALTER TABLE tasks_rebuilt RENAME TO tasks;

CREATE UNIQUE INDEX tasks_idempotency_key ON tasks (idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE UNIQUE INDEX tasks_unique_active ON tasks (unique_active)
    WHERE unique_active IS NOT NULL;
CREATE UNIQUE INDEX tasks_cron_key ON tasks (cron_key) WHERE cron_key IS NOT NULL;
-- The indexes the table had, but `tasks_running`, as 0001–0015 left them.
CREATE INDEX tasks_lease ON tasks (state, lease_until);
CREATE INDEX tasks_finished ON tasks (task_type, state, updated_at)
    WHERE state IN ('succeeded', 'cancelled', 'dead');
CREATE INDEX tasks_created ON tasks (task_type, created_at, id);
CREATE INDEX tasks_by_type_state ON tasks (task_type, state, trigger_at)
    WHERE state IN ('pending', 'claimed', 'running');
CREATE INDEX tasks_unique_until ON tasks (unique_until) WHERE unique_until IS NOT NULL;
CREATE INDEX tasks_ranked_by_type ON tasks (task_type, claim_rank, id) WHERE state = 'pending';
CREATE INDEX tasks_pending_ranked ON tasks (claim_rank, id) WHERE state = 'pending';
CREATE INDEX tasks_dead_due ON tasks (trigger_at, id) WHERE state = 'dead';
CREATE INDEX tasks_keyed ON tasks (task_type, concurrency_key, claim_rank, id)
    WHERE state IN ('pending', 'claimed', 'running') AND concurrency_key IS NOT NULL;
