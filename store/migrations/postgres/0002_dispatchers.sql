-- Live dispatchers, by heartbeat: the membership task-type ownership is hashed over.
CREATE TABLE dispatchers (
    id           TEXT COLLATE "C" PRIMARY KEY,
    heartbeat_at BIGINT NOT NULL
);
