-- See migrations/sqlite/0024_limiters.sql.
CREATE TABLE limiters (
    id VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL PRIMARY KEY,
    tokens BIGINT NOT NULL,
    refilled_at BIGINT NOT NULL,
    waiting VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL DEFAULT '',
    waiting_at BIGINT NOT NULL DEFAULT 0
) ENGINE = InnoDB;
