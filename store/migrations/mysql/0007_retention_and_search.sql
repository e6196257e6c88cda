-- Retention (dispatcher/src/retention.rs): the purger deletes, per job and per finished
-- state, the tasks that finished before a cutoff, oldest first, a small batch at a time.
-- MySQL has no partial indexes: this one holds every task, led by the state like the
-- claim's, so the purge walks only the finished tasks of one job, oldest first.
CREATE INDEX tasks_finished ON tasks (state, task_type, updated_at);

-- Task search (GET /v1/tasks): one job's tasks, newest first, page by page.
CREATE INDEX tasks_created ON tasks (task_type, created_at, id);
