-- See migrations/sqlite/0013_claim_by_type.sql.
CREATE INDEX tasks_ranked_by_type ON tasks (task_type, claim_rank, id) WHERE state = 'pending';
