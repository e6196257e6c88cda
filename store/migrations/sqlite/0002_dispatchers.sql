-- Live dispatchers, by heartbeat: the membership task-type ownership is hashed over.
CREATE TABLE dispatchers (
    id           TEXT PRIMARY KEY,
    heartbeat_at INTEGER NOT NULL
);
