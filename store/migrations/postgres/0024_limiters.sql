-- See migrations/sqlite/0024_limiters.sql.
CREATE TABLE limiters (
    id TEXT COLLATE "C" PRIMARY KEY,
    tokens BIGINT NOT NULL,
    refilled_at BIGINT NOT NULL,
    waiting TEXT COLLATE "C" NOT NULL DEFAULT '',
    waiting_at BIGINT NOT NULL DEFAULT 0
);
