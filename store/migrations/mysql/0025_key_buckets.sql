-- See migrations/sqlite/0025_key_buckets.sql. The id holds a task type (at most 128
-- characters) and a concurrency key (at most 255 bytes): VARBINARY, as the keys are.
CREATE TABLE key_buckets (
    id VARBINARY(1024) NOT NULL PRIMARY KEY,
    tokens BIGINT NOT NULL,
    refilled_at BIGINT NOT NULL,
    INDEX key_buckets_idle (refilled_at)
) ENGINE = InnoDB;
