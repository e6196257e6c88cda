-- See migrations/sqlite/0006_claim_rank.sql. STORED (PERSISTENT on MariaDB) so the
-- index holds the value and the claim reads no row it does not take.
ALTER TABLE tasks
    ADD COLUMN claim_rank BIGINT AS (trigger_at - priority * 10000) STORED,
    ADD KEY tasks_ranked (state, claim_rank, id);
