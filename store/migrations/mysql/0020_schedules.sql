-- See migrations/sqlite/0020_schedules.sql.
CREATE TABLE schedules (
    task_type     VARCHAR(255) NOT NULL,
    name          VARCHAR(200) NOT NULL,
    source        VARCHAR(16) NOT NULL,
    spec          MEDIUMTEXT NOT NULL,
    paused        BIGINT NOT NULL,
    next_at       BIGINT NULL,
    wake_at       BIGINT NULL,
    buffered_at   BIGINT NULL,
    last_task_id  VARCHAR(36) NULL,
    last_fired_at BIGINT NULL,
    fired         BIGINT NOT NULL DEFAULT 0,
    version       BIGINT NOT NULL,
    created_at    BIGINT NOT NULL,
    updated_at    BIGINT NOT NULL,
    PRIMARY KEY (task_type, name),
    KEY schedules_waking (wake_at),
    KEY schedules_config (task_type, source)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
