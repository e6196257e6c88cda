-- Priority that holds under backlog (docs/design.md, "Priority"): claims take due work
-- by `claim_rank`, the trigger time moved earlier by 10 s per priority level, so a task
-- of priority p due at t ranks with the tasks of priority 0 due at t - 10 s * p. A later
-- high-priority task thus overtakes the low-priority backlog that became due up to 90 s
-- before it, and a task due for (9 - p) * 10 s is overtaken by nothing that comes after
-- (the ageing bound). The step is `heap::PRIORITY_STEP` too; change both together.
-- A generated column: every statement that moves trigger_at keeps it right by itself.
ALTER TABLE tasks ADD COLUMN claim_rank INTEGER
    GENERATED ALWAYS AS (trigger_at - priority * 10000) VIRTUAL;
CREATE INDEX tasks_ranked ON tasks (state, claim_rank, id);
