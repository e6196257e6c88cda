-- See migrations/sqlite/0018_expiry.sql. `tasks_expired` is the retention purge's walk
-- over a type's expired tasks, which `tasks_finished` (0007) does not hold; written only
-- when a task expires.
ALTER TABLE tasks ADD COLUMN expires_at BIGINT;
CREATE INDEX tasks_expiring ON tasks (expires_at)
    WHERE expires_at IS NOT NULL AND state IN ('blocked', 'pending', 'claimed');
CREATE INDEX tasks_expired ON tasks (task_type, updated_at) WHERE state = 'expired';
