-- See migrations/sqlite/0024_limiters.sql.
CREATE TABLE limiters (
    id TEXT COLLATE "C" PRIMARY KEY,
    tokens BIGINT NOT NULL,
    refilled_at BIGINT NOT NULL
);
