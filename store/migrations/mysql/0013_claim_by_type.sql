-- See migrations/sqlite/0013_claim_by_type.sql. No partial indexes here: `state` leads,
-- as in tasks_ranked, so a claim's range covers the pending rows of its type only.
ALTER TABLE tasks ADD KEY tasks_ranked_by_type (state, task_type, claim_rank, id);
