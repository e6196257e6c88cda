-- See migrations/sqlite/0012_unique_window.sql. STORED: PostgreSQL has no virtual
-- generated columns before 18; the value changes only when a task with a held key
-- succeeds or is released, so other updates stay HOT.
ALTER TABLE tasks ADD COLUMN unique_for BIGINT NOT NULL DEFAULT 0;
ALTER TABLE tasks ADD COLUMN unique_until BIGINT GENERATED ALWAYS AS
    (CASE WHEN state = 'succeeded' AND unique_active IS NOT NULL THEN updated_at + unique_for END)
    STORED;
CREATE INDEX tasks_unique_until ON tasks (unique_until) WHERE unique_until IS NOT NULL;
