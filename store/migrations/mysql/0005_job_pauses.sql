-- See migrations/sqlite/0005_job_pauses.sql. The key is compared byte-wise, as
-- tasks.task_type is.
CREATE TABLE job_pauses (
    task_type VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL PRIMARY KEY,
    paused_at BIGINT NOT NULL
) ENGINE = InnoDB;
