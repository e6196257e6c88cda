-- Unique keys held after success (spec.retention.uniqueKeys; dispatcher/src/retention.rs).
-- `unique_for` is the window, in milliseconds, the task's job gave its unique key when
-- it was submitted (0: the key is free once the task finished, as before). A success
-- keeps `unique_active` when it is above 0, so a late submit with the key is refused
-- as while the task was pending; `unique_until` is when that ends, NULL for every row
-- not holding a key that way. Past it the key is ignored by an insert that hits it and
-- freed by the purger, which walks this index.
ALTER TABLE tasks ADD COLUMN unique_for INTEGER NOT NULL DEFAULT 0;
ALTER TABLE tasks ADD COLUMN unique_until INTEGER GENERATED ALWAYS AS
    (CASE WHEN state = 'succeeded' AND unique_active IS NOT NULL THEN updated_at + unique_for END)
    VIRTUAL;
CREATE INDEX tasks_unique_until ON tasks (unique_until) WHERE unique_until IS NOT NULL;
