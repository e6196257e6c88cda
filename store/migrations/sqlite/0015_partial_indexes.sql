-- Fewer index writes per task (issue 30). `tasks_due` and `tasks_ranked` held every
-- task under a leading `state`, so each change of state (claim, start, finish) deleted
-- and re-inserted an entry in both. Each now holds only the rows its statement reads:
-- the claim's pending tasks in claim order, and the dead letters in listing order. A
-- task that succeeds enters `tasks_pending_ranked` once and leaves it at its claim, and
-- never enters `tasks_dead_due`. Without statistics SQLite would rather walk
-- `tasks_lease`'s `state` prefix than a partial index, so the claim and the listing
-- name these with `INDEXED BY` (store/src/sqlite.rs). MariaDB has no partial indexes
-- and PostgreSQL's were partial from the start: this migration is SQLite's alone.
--
-- `tasks_keyed` serves the fair claim of a job with a `concurrencyKey`, yet held every
-- active task, keyed or not, and moved with each of its changes of state. It now holds
-- only keyed ones. A statement that does not imply `concurrency_key IS NOT NULL` (the
-- fair claim, which also ranks the tasks a job had before it was keyed) reads
-- `tasks_by_type_state` instead.
DROP INDEX tasks_due;
DROP INDEX tasks_ranked;
CREATE INDEX tasks_pending_ranked ON tasks (claim_rank, id) WHERE state = 'pending';
CREATE INDEX tasks_dead_due ON tasks (trigger_at, id) WHERE state = 'dead';
DROP INDEX tasks_keyed;
CREATE INDEX tasks_keyed ON tasks (task_type, concurrency_key, claim_rank, id)
    WHERE state IN ('pending', 'claimed', 'running') AND concurrency_key IS NOT NULL;
