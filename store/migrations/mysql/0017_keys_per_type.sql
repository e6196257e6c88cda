-- Keys live inside their job (issue 31). An idempotency key and a unique key were
-- unique across all tasks, so one team's key blocked another's (a `409` naming the
-- other team's task) or matched it (a `duplicate` answer for a task the caller never
-- stored). They are now unique per task type.
--
-- The key comes first in each index: a lookup by key alone, as a dispatcher of the
-- release before makes during a rolling upgrade, still reads the index. Every row that
-- met the old indexes meets the new ones, so the rebuild cannot fail; names stay, and
-- no statement pins these two by name. Key length: 1 024 + 1 020 bytes (VARBINARY and
-- VARCHAR(255) in utf8mb4), within InnoDB's 3 072.
ALTER TABLE tasks
    DROP INDEX tasks_idempotency_key,
    ADD UNIQUE KEY tasks_idempotency_key (idempotency_key, task_type),
    DROP INDEX tasks_unique_active,
    ADD UNIQUE KEY tasks_unique_active (unique_active, task_type);
