-- See migrations/sqlite/0006_claim_rank.sql. The claim walks tasks_ranked in
-- (claim_rank, id) order and stops after LIMIT rows; it skips the few rows ranked early
-- but not yet due within the look-ahead (high-priority tasks due in the next 90 s).
ALTER TABLE tasks ADD COLUMN claim_rank BIGINT
    GENERATED ALWAYS AS (trigger_at - priority * 10000) STORED;
CREATE INDEX tasks_ranked ON tasks (claim_rank, id) WHERE state = 'pending';
