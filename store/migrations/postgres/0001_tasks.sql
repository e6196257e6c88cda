-- The same table as migrations/sqlite/0001_tasks.sql; see there for what the columns mean.
-- Times are milliseconds since the Unix epoch, UTC.
--
-- Ids are compared and ordered byte-wise (COLLATE "C"), as SQLite does: claims are
-- ordered by (trigger_at, id), and a database whose default collation is a language
-- one must not reorder them (or make the tasks_due index unusable for that ORDER BY).
CREATE TABLE tasks (
    id              VARCHAR(36) COLLATE "C" PRIMARY KEY,  -- UUIDv7
    task_type       TEXT NOT NULL,
    payload         TEXT NOT NULL,          -- JSON, byte-exact (JSONB would re-serialise it)
    state           TEXT NOT NULL,
    priority        SMALLINT NOT NULL DEFAULT 0,
    trigger_at      BIGINT NOT NULL,
    attempt         INTEGER NOT NULL DEFAULT 0,
    max_retries     INTEGER NOT NULL,
    timeout_ms      BIGINT NOT NULL,
    lease_token     BIGINT NOT NULL DEFAULT 0,
    lease_until     BIGINT,
    owner           TEXT,
    idempotency_key TEXT UNIQUE,
    unique_key      TEXT,
    -- unique_key while the task is unfinished, NULL after (NULLs never collide).
    unique_active   TEXT UNIQUE,
    cron_key        TEXT UNIQUE,
    source_service  TEXT,
    last_error      TEXT,
    result          TEXT,
    created_at      BIGINT NOT NULL,
    updated_at      BIGINT NOT NULL
);
-- Partial indexes where the other backends lead with `state`: the planner's idea of how
-- many rows are in a state is always stale on a queue table, and with a state-led index
-- it reaches `WHERE id = $1 AND state = 'claimed'` (every start, finish and heartbeat)
-- through the state when it believes few rows are claimed, walking all in-flight tasks
-- instead of one primary-key lookup. These indexes cannot serve those statements.
--
-- The claim walks this index in (trigger_at, id) order and stops after LIMIT rows, so
-- its cost does not grow with the backlog; it also holds only pending tasks.
CREATE INDEX tasks_due ON tasks (trigger_at, id) WHERE state = 'pending';
-- The rescuer's scan: lease_until is set exactly while a task is claimed or running.
CREATE INDEX tasks_lease ON tasks (lease_until) WHERE lease_until IS NOT NULL;
-- Dead letters, newest first. (A redrive's `id = $1 AND state = 'dead'` may walk this
-- one, but that is rare and bounded by the dead letters.)
CREATE INDEX tasks_dead ON tasks (updated_at, id) WHERE state = 'dead';

CREATE TABLE task_deps (
    task_id    VARCHAR(36) COLLATE "C" NOT NULL,
    depends_on VARCHAR(36) COLLATE "C" NOT NULL,
    PRIMARY KEY (task_id, depends_on)
);
CREATE INDEX task_deps_reverse ON task_deps (depends_on);
