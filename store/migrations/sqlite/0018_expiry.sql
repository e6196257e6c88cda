-- Tasks that expire: `expires_at` (milliseconds, NULL: never) is the time by which an
-- attempt must have begun. The starts of every dialect leave a task past it unstarted,
-- and the expirer (`Store::expire`) ends it `expired`, walking this index in expiry
-- order. It holds only tasks that may expire and have not begun, so a task without an
-- expiry, or one running or finished, is never written to it.
ALTER TABLE tasks ADD COLUMN expires_at INTEGER;
CREATE INDEX tasks_expiring ON tasks (expires_at)
    WHERE expires_at IS NOT NULL AND state IN ('blocked', 'pending', 'claimed');
