-- See migrations/sqlite/0008_job_overview.sql: the jobs overview counts a job's due,
-- scheduled and running tasks over this index, at most a cap of entries each.
CREATE INDEX tasks_by_type_state ON tasks (task_type, state, trigger_at)
    WHERE state IN ('pending', 'claimed', 'running');
