-- See migrations/sqlite/0010_concurrency_key.sql.
ALTER TABLE tasks ADD COLUMN concurrency_key TEXT COLLATE "C";

CREATE INDEX tasks_keyed ON tasks (task_type, concurrency_key, claim_rank, id)
    WHERE state IN ('pending', 'claimed', 'running');
