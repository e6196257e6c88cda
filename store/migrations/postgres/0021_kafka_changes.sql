-- See migrations/sqlite/0021_kafka_changes.sql.
CREATE TABLE kafka_changes (
    id         VARCHAR(36) COLLATE "C" PRIMARY KEY,
    task_type  TEXT NOT NULL,
    trigger_at BIGINT,
    payload    TEXT,
    priority   SMALLINT,
    changed_at BIGINT NOT NULL
);
CREATE INDEX kafka_changes_changed ON kafka_changes (changed_at);
