-- Live dispatchers, by heartbeat: the membership task-type ownership is hashed over.
CREATE TABLE dispatchers (
    id           VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL PRIMARY KEY,
    heartbeat_at BIGINT NOT NULL
) ENGINE = InnoDB;
