-- The jobs overview (GET /v1/jobs): per job, how many tasks are due, scheduled and
-- running, and the oldest due one. Each count walks one range of this index (the job's
-- type and one state) and stops at its cap. Partial: finished tasks, the bulk of the
-- table, are not in it, and a task leaves it when its attempt ends. A query uses it only
-- when its WHERE repeats this exact `state IN (…)` term (SQLite does not prove that
-- `state = 'running'` implies it), so the overview's statement carries it.
CREATE INDEX tasks_by_type_state ON tasks (task_type, state, trigger_at)
    WHERE state IN ('pending', 'claimed', 'running');
