-- tasks_finished (0007) is no index of finished tasks here: MariaDB and MySQL have no
-- partial indexes, so it holds every task, by (state, task_type, updated_at). Besides
-- the jobs overview's finished counts and the retention purge it serves the count of a
-- type's running attempts that every start of attempts takes under the job's lock (the
-- store's `running` statement, which names it in FORCE INDEX). Renamed for what it
-- holds; the rename changes only the name (MariaDB >= 10.5.2, MySQL >= 5.7). A
-- dispatcher of an earlier version names the old index in that count: from this
-- migration until it is replaced, its starts fail (error 1176) and its claims lapse.
ALTER TABLE tasks RENAME INDEX tasks_finished TO tasks_by_state_type;
