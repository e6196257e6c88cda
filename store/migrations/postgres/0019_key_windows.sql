-- See migrations/sqlite/0019_key_windows.sql.
CREATE TABLE key_windows (
    task_type  TEXT NOT NULL,
    kind       TEXT NOT NULL,
    window_key TEXT NOT NULL,
    task_id    VARCHAR(36) COLLATE "C",
    opened_at  BIGINT NOT NULL,
    closes_at  BIGINT NOT NULL,
    PRIMARY KEY (task_type, kind, window_key)
);
CREATE INDEX key_windows_closing ON key_windows (closes_at);
