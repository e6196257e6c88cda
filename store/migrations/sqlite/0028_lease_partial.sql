-- The rescuer's index only where a lease is held, as on PostgreSQL: a pending, blocked or
-- finished task writes no entry of it, and a new task one index entry fewer (issue 30's
-- index diet). `lapsed_leases` reads it in lease order through `lease_until < ?`, which
-- SQLite takes as implying `lease_until IS NOT NULL`. What found rows by the old index's
-- `state` prefix now names the partial index meant for its state
-- (store/migrations/README.md).
DROP INDEX tasks_lease;
CREATE INDEX tasks_lease ON tasks (lease_until) WHERE lease_until IS NOT NULL;
-- The retention purge's walk over a type's expired tasks, as PostgreSQL's 0018: the old
-- tasks_lease's state prefix found them; written only when a task expires.
CREATE INDEX tasks_expired ON tasks (task_type, updated_at) WHERE state = 'expired';
