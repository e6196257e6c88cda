-- The same tables as migrations/sqlite/0001_tasks.sql; see there for what the columns
-- mean. Times are milliseconds since the Unix epoch, UTC. Needs InnoDB (row locks,
-- SKIP LOCKED: MariaDB >= 10.6 or MySQL >= 8.0).
--
-- Text compares byte-wise (utf8mb4_bin), as SQLite does: ids order claims by
-- (trigger_at, id) and must sort as the dispatcher sorts them, and a task type or id
-- differing only in letter case is a different one.
--
-- The dedupe keys are VARBINARY rather than VARCHAR: every utf8mb4 collation available
-- on both MariaDB and MySQL is PAD SPACE, under which 'k' and 'k ' are the same UNIQUE
-- value, while SQLite and PostgreSQL keep them apart. The store reads them back as
-- UTF-8 (they are only ever written from Rust strings). 1024 bytes is well above the
-- API's 255-byte key limit and within InnoDB's 3072-byte index key limit.
CREATE TABLE tasks (
    id              VARCHAR(36) NOT NULL,   -- UUIDv7
    task_type       VARCHAR(255) NOT NULL,
    payload         LONGTEXT NOT NULL,      -- JSON, byte-exact (the JSON type may re-serialise)
    state           VARCHAR(16) NOT NULL,
    priority        SMALLINT NOT NULL DEFAULT 0,
    trigger_at      BIGINT NOT NULL,
    attempt         INT NOT NULL DEFAULT 0,
    max_retries     INT NOT NULL,
    timeout_ms      BIGINT NOT NULL,
    lease_token     BIGINT NOT NULL DEFAULT 0,
    lease_until     BIGINT NULL,
    owner           VARCHAR(255) NULL,
    idempotency_key VARBINARY(1024) NULL,
    unique_key      VARBINARY(1024) NULL,
    -- unique_key while the task is unfinished, NULL after: MySQL has no partial
    -- indexes, but NULLs never collide in a UNIQUE index, which does the same.
    unique_active   VARBINARY(1024) NULL,
    cron_key        VARBINARY(1024) NULL,
    source_service  VARCHAR(255) NULL,
    last_error      LONGTEXT NULL,
    result          LONGTEXT NULL,
    created_at      BIGINT NOT NULL,
    updated_at      BIGINT NOT NULL,
    PRIMARY KEY (id),
    UNIQUE KEY tasks_idempotency_key (idempotency_key),
    UNIQUE KEY tasks_unique_active (unique_active),
    UNIQUE KEY tasks_cron_key (cron_key),
    -- The claim walks this index in order and stops after LIMIT rows, so its cost (and
    -- the rows it locks) does not grow with the backlog.
    KEY tasks_due (state, trigger_at, id),
    KEY tasks_lease (state, lease_until)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE task_deps (
    task_id    VARCHAR(36) NOT NULL,
    depends_on VARCHAR(36) NOT NULL,
    PRIMARY KEY (task_id, depends_on),
    KEY task_deps_reverse (depends_on)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
