-- Keys live inside their job (issue 31). An idempotency key and a unique key were
-- unique across all tasks, so one team's key blocked another's (a `409` naming the
-- other team's task) or matched it (a `duplicate` answer for a task the caller never
-- stored). They are now unique per task type.
--
-- The key comes first in each index: a lookup by key alone, as a dispatcher of the
-- release before makes during a rolling upgrade, still reads the index. Every row that
-- met the old indexes meets the new ones, so building them cannot fail.
DROP INDEX tasks_idempotency_key;
DROP INDEX tasks_unique_active;
CREATE UNIQUE INDEX tasks_idempotency_key ON tasks (idempotency_key, task_type)
    WHERE idempotency_key IS NOT NULL;
CREATE UNIQUE INDEX tasks_unique_active ON tasks (unique_active, task_type)
    WHERE unique_active IS NOT NULL;
