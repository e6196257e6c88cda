-- Every type's pending tasks in claim order: only the claim of several types read it,
-- and every new task wrote it. That claim now walks each type's tasks on
-- tasks_ranked_by_type and merges them (store/src/postgres.rs, CLAIM_SEVERAL_TYPES), so
-- a new task writes one index entry fewer (issue 30's index diet).
DROP INDEX tasks_ranked;
