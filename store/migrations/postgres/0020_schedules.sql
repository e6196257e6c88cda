-- See migrations/sqlite/0020_schedules.sql.
CREATE TABLE schedules (
    task_type     TEXT NOT NULL,
    name          TEXT COLLATE "C" NOT NULL,
    source        TEXT NOT NULL,
    spec          TEXT NOT NULL,
    paused        BIGINT NOT NULL,
    next_at       BIGINT,
    wake_at       BIGINT,
    buffered_at   BIGINT,
    last_task_id  VARCHAR(36) COLLATE "C",
    last_fired_at BIGINT,
    fired         BIGINT NOT NULL DEFAULT 0,
    version       BIGINT NOT NULL,
    created_at    BIGINT NOT NULL,
    updated_at    BIGINT NOT NULL,
    PRIMARY KEY (task_type, name)
);
CREATE INDEX schedules_waking ON schedules (wake_at) WHERE wake_at IS NOT NULL;
CREATE INDEX schedules_config ON schedules (task_type, source) WHERE source = 'config';
