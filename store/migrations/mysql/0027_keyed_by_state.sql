-- `tasks_keyed` with the state before the key: the fair claim walks a job's keys that
-- have pending tasks one index probe at a time (a skip-scan, store/src/fair_claim/walk.rs),
-- and MariaDB, which has no partial indexes, held every task of every key here in key
-- order — a key's finished tasks between one key's pending tasks and the next's, read
-- through at each step. Ordered by state first, the pending keys are one range. The
-- start's count of a key's running attempts and the ordered claim's dead-task check read
-- (type, state, key) ranges as before. The name stays: no statement pins it.
ALTER TABLE tasks
    DROP KEY tasks_keyed,
    ADD KEY tasks_keyed (task_type, state, concurrency_key, claim_rank, id);
