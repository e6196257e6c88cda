-- See migrations/sqlite/0018_expiry.sql. No partial indexes: `expiring` is `expires_at`
-- while the task has not begun, NULL otherwise, so a task without an expiry keeps NULL
-- through every change of state (its index entry is never rewritten), and the
-- expirer's range `expiring <= ?` skips the NULLs, which sort first. The retention
-- purge finds expired tasks through `tasks_finished`, which holds every state here.
ALTER TABLE tasks
    ADD COLUMN expires_at BIGINT NULL,
    ADD COLUMN expiring BIGINT AS
        (CASE WHEN state IN ('blocked', 'pending', 'claimed') THEN expires_at END)
        STORED,
    ADD KEY tasks_expiring (expiring);
