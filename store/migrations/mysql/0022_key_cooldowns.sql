-- See migrations/sqlite/0022_key_cooldowns.sql. The key is bytes, as the tasks' keys are.
CREATE TABLE key_cooldowns (
    task_type       VARCHAR(255) NOT NULL,
    concurrency_key VARBINARY(1024) NOT NULL,
    ends_at         BIGINT NOT NULL,
    PRIMARY KEY (task_type, concurrency_key),
    KEY key_cooldowns_ending (ends_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
