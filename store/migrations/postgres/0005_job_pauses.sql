-- See migrations/sqlite/0005_job_pauses.sql.
CREATE TABLE job_pauses (
    task_type TEXT COLLATE "C" PRIMARY KEY,
    paused_at BIGINT NOT NULL
);
