-- See migrations/sqlite/0008_job_limits.sql.
CREATE TABLE job_limits (
    task_type TEXT COLLATE "C" PRIMARY KEY,
    tokens BIGINT NOT NULL,
    refilled_at BIGINT NOT NULL
);

CREATE INDEX tasks_running ON tasks (task_type) WHERE state = 'running';
