-- See migrations/sqlite/0021_kafka_changes.sql.
CREATE TABLE kafka_changes (
    id         VARCHAR(36) NOT NULL,
    task_type  VARCHAR(255) NOT NULL,
    trigger_at BIGINT NULL,
    payload    LONGTEXT NULL,
    priority   SMALLINT NULL,
    changed_at BIGINT NOT NULL,
    PRIMARY KEY (id),
    KEY kafka_changes_changed (changed_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
