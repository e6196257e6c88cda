-- See migrations/sqlite/0019_key_windows.sql. The key is bytes, as the tasks' keys are.
CREATE TABLE key_windows (
    task_type  VARCHAR(255) NOT NULL,
    kind       VARCHAR(16) NOT NULL,
    window_key VARBINARY(1024) NOT NULL,
    task_id    VARCHAR(36) NULL,
    opened_at  BIGINT NOT NULL,
    closes_at  BIGINT NOT NULL,
    PRIMARY KEY (task_type, kind, window_key),
    KEY key_windows_closing (closes_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
