-- See migrations/sqlite/0008_job_overview.sql: the jobs overview counts a job's due,
-- scheduled and running tasks over this index, at most a cap of entries each. MySQL has
-- no partial indexes, so it holds every task; its finished counts use tasks_finished.
CREATE INDEX tasks_by_type_state ON tasks (task_type, state, trigger_at);
