-- Times are milliseconds since the Unix epoch, UTC.
CREATE TABLE tasks (
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
    idempotency_key TEXT UNIQUE,
    unique_key      TEXT,
    -- unique_key while the task is unfinished, NULL after: the constraint that keeps a
    -- second pending task for the same key out, on every backend (NULLs never collide).
    unique_active   TEXT UNIQUE,
    cron_key        TEXT UNIQUE,
    source_service  TEXT,
    last_error      TEXT,
    result          TEXT,
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL
);
CREATE INDEX tasks_due ON tasks (state, trigger_at, id);
CREATE INDEX tasks_lease ON tasks (state, lease_until);

CREATE TABLE task_deps (
    task_id    TEXT NOT NULL,
    depends_on TEXT NOT NULL,
    PRIMARY KEY (task_id, depends_on)
);
CREATE INDEX task_deps_reverse ON task_deps (depends_on);
