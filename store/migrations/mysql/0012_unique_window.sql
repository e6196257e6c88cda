-- See migrations/sqlite/0012_unique_window.sql. No partial indexes: NULLs (every row not
-- holding a key after success) sort first and a range `unique_until <= ?` skips them.
ALTER TABLE tasks ADD COLUMN unique_for BIGINT NOT NULL DEFAULT 0;
ALTER TABLE tasks
    ADD COLUMN unique_until BIGINT AS
        (CASE WHEN state = 'succeeded' AND unique_active IS NOT NULL THEN updated_at + unique_for END)
        STORED,
    ADD KEY tasks_unique_until (unique_until);
