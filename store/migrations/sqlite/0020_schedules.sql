-- Schedules (store/src/schedules.rs): the API's `/v1/schedules` and the AsyncJobConfig
-- cron entries (`source = 'config'`, kept in step by the scheduler), one row each,
-- fired by any number of schedulers. `spec` is the schedule as the API takes it (JSON).
-- `next_at` is the next firing not yet created (NULL: not planned yet, plan from
-- `updated_at`); `wake_at` when a scheduler must next look at the row (NULL: paused or
-- ended), the only indexed time, so a pass reads the rows due and nothing else.
-- `buffered_at` is a firing held back by `overlap: BufferOne`. Times in UTC
-- milliseconds; `version` counts writes, for the API's read-modify-write.
-- `schedules_config` finds a job's config schedules among its million API ones.
CREATE TABLE schedules (
    task_type     TEXT NOT NULL,
    name          TEXT NOT NULL,
    source        TEXT NOT NULL,
    spec          TEXT NOT NULL,
    paused        INTEGER NOT NULL,
    next_at       INTEGER,
    wake_at       INTEGER,
    buffered_at   INTEGER,
    last_task_id  TEXT,
    last_fired_at INTEGER,
    fired         INTEGER NOT NULL DEFAULT 0,
    version       INTEGER NOT NULL,
    created_at    INTEGER NOT NULL,
    updated_at    INTEGER NOT NULL,
    PRIMARY KEY (task_type, name)
);
CREATE INDEX schedules_waking ON schedules (wake_at) WHERE wake_at IS NOT NULL;
CREATE INDEX schedules_config ON schedules (task_type, source) WHERE source = 'config';
