-- A claim of one task type (a dispatcher serving one job, as the operator runs them,
-- or a job claimed on its own because its room is small) walks that type's pending
-- tasks in claim order, instead of `tasks_ranked` past the due tasks of every other type:
-- a backlog of one job no longer slows the claims of the others. Partial: only pending
-- rows, the ones a claim reads.
CREATE INDEX tasks_ranked_by_type ON tasks (task_type, claim_rank, id) WHERE state = 'pending';
