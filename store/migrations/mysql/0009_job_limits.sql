-- See migrations/sqlite/0008_job_limits.sql. The count of a type's running attempts
-- is served by tasks_finished (state, task_type, updated_at), which MySQL, without
-- partial indexes, keeps for every state.
CREATE TABLE job_limits (
    task_type VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL PRIMARY KEY,
    tokens BIGINT NOT NULL,
    refilled_at BIGINT NOT NULL
) ENGINE = InnoDB;
