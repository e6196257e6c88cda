-- Changes of Kafka-routed tasks not consumed yet (`PATCH /v1/tasks/{id}?job=…` while the
-- message waits in the topic). The change writes a cancelled row under the task's id (as
-- a cancel ahead of consumption does), so the consumer's insert of the message finds the
-- id taken, and this row: the consumer then replaces the placeholder with the consumed
-- task, changed (`trigger_at`, `payload`, `priority`, each NULL to keep the message's).
-- A cancel of the placeholder deletes the change, and the message is dropped.
CREATE TABLE kafka_changes (
    id         TEXT PRIMARY KEY,
    task_type  TEXT NOT NULL,
    trigger_at INTEGER,
    payload    TEXT,
    priority   INTEGER,
    changed_at INTEGER NOT NULL
);
CREATE INDEX kafka_changes_changed ON kafka_changes (changed_at);
