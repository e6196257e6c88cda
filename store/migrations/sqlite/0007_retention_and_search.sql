-- Retention (dispatcher/src/retention.rs): the purger deletes, per job and per finished
-- state, the tasks that finished before a cutoff, oldest first, a small batch at a time.
-- This index serves exactly that walk and holds only finished tasks.
CREATE INDEX tasks_finished ON tasks (task_type, state, updated_at)
    WHERE state IN ('succeeded', 'cancelled', 'dead');

-- Task search (GET /v1/tasks): one job's tasks, newest first, page by page.
CREATE INDEX tasks_created ON tasks (task_type, created_at, id);
