-- Key windows: debounce and throttle on a key (store/src/window.rs). One row per job
-- (task type), rule and key, locked by the insert of every submit that names the key,
-- so concurrent submits of a key take turns. `task_id` is the task the window last
-- stored (or folded submits into), `opened_at` when its burst began, `closes_at` when
-- the window ends (a trailing debounce: its cap; a leading debounce: the end of the
-- quiet period; a throttle: the end of its period). Times in UTC milliseconds. The
-- retention pass deletes windows closed a day ago whose task no longer waits.
CREATE TABLE key_windows (
    task_type  TEXT NOT NULL,
    kind       TEXT NOT NULL,
    window_key TEXT NOT NULL,
    task_id    TEXT,
    opened_at  INTEGER NOT NULL,
    closes_at  INTEGER NOT NULL,
    PRIMARY KEY (task_type, kind, window_key)
);
CREATE INDEX key_windows_closing ON key_windows (closes_at);
