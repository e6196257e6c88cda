-- Fewer index writes per task (issue 30). No update of a task is HOT (`state` is in
-- index predicates), so each of a task's four row versions (insert, claim, start,
-- finish) gets an entry in every index whose predicate it meets. These held rows no
-- statement looks for:
--
-- * The three keys a task may carry were UNIQUE constraints, whose indexes hold every
--   row version, NULL or not. They are now partial unique indexes over the rows that set
--   them: an insert's `ON CONFLICT DO NOTHING` (no conflict target) still covers them,
--   and the statements that look a key up (`= $1`) imply the predicate.
-- * `tasks_due` (pending tasks by trigger time) has no reader since the claim walks
--   `tasks_ranked` (0006) and `tasks_ranked_by_type` (0013).
-- * `tasks_running`: the start's count of a type's running attempts reads
--   `tasks_by_type_state` (task_type, state), which holds them too.
-- * `tasks_keyed` held every active task, keyed or not; the fair claim, which ranks a
--   keyed job's tasks from before it was keyed too, can read `tasks_by_type_state`, and
--   the count per key names keys. It now holds keyed tasks only, as on SQLite (0015).
--
-- Index builds lock the table against writes while they run (this migration is one
-- transaction); on a large table, plan the upgrade for a quiet moment.
ALTER TABLE tasks DROP CONSTRAINT tasks_idempotency_key_key;
ALTER TABLE tasks DROP CONSTRAINT tasks_unique_active_key;
ALTER TABLE tasks DROP CONSTRAINT tasks_cron_key_key;
CREATE UNIQUE INDEX tasks_idempotency_key ON tasks (idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE UNIQUE INDEX tasks_unique_active ON tasks (unique_active)
    WHERE unique_active IS NOT NULL;
CREATE UNIQUE INDEX tasks_cron_key ON tasks (cron_key) WHERE cron_key IS NOT NULL;

DROP INDEX tasks_due;
DROP INDEX tasks_running;
DROP INDEX tasks_keyed;
CREATE INDEX tasks_keyed ON tasks (task_type, concurrency_key, claim_rank, id)
    WHERE state IN ('pending', 'claimed', 'running') AND concurrency_key IS NOT NULL;
