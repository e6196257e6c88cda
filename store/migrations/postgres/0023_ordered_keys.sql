-- Ordered keys (`spec.ordering: {mode: fifo, onDead: block}`): a key whose dead task was
-- submitted before its earliest unfinished one waits until that task is redriven or
-- purged. The fair claim looks for such a task by job and key; this index holds the
-- dead tasks that have a key, in submission order. MariaDB reads its full `tasks_keyed`
-- (type, key, state, …) instead, so it has no 0023.
CREATE INDEX tasks_dead_keyed ON tasks (task_type, concurrency_key, created_at, id)
    WHERE state = 'dead' AND concurrency_key IS NOT NULL;
