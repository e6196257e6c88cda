-- Jobs paused through the API (POST /v1/jobs/{name}/pause), by task type: a claim and
-- the start of an attempt skip the tasks of a type listed here, so they wait, pending,
-- until the row is deleted (resume). `spec.paused` in the job's config is the other way
-- to pause; the dispatchers read that from their routing table.
CREATE TABLE job_pauses (
    task_type TEXT PRIMARY KEY,
    paused_at INTEGER NOT NULL
);
