-- See migrations/sqlite/0025_key_buckets.sql.
CREATE TABLE key_buckets (
    id TEXT COLLATE "C" PRIMARY KEY,
    tokens BIGINT NOT NULL,
    refilled_at BIGINT NOT NULL
);
CREATE INDEX key_buckets_idle ON key_buckets (refilled_at);
