-- See migrations/sqlite/0024_limiters.sql.
CREATE TABLE limiters (
    id VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL PRIMARY KEY,
    tokens BIGINT NOT NULL,
    refilled_at BIGINT NOT NULL
) ENGINE = InnoDB;
