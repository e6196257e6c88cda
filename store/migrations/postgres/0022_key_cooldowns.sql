-- See migrations/sqlite/0022_key_cooldowns.sql. Keys compare byte for byte, as the
-- tasks' `concurrency_key` does.
CREATE TABLE key_cooldowns (
    task_type       TEXT COLLATE "C" NOT NULL,
    concurrency_key TEXT COLLATE "C" NOT NULL,
    ends_at         BIGINT NOT NULL,
    PRIMARY KEY (task_type, concurrency_key)
);
CREATE INDEX key_cooldowns_ending ON key_cooldowns (ends_at);
