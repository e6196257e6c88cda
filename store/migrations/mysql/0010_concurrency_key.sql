-- See migrations/sqlite/0010_concurrency_key.sql. VARBINARY like the other keys, so
-- keys compare byte for byte. MariaDB has no partial indexes: this one holds every
-- task, and the state in it lets the start count a key's running attempts.
ALTER TABLE tasks
    ADD COLUMN concurrency_key VARBINARY(1024) NULL,
    ADD KEY tasks_keyed (task_type, concurrency_key, state, claim_rank, id);
