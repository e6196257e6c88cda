-- Each dispatcher's adaptive share of the jobs it runs (`crate::adaptive`), as JSON
-- `{"<task type>": <share>}`, written with its heartbeat: the jobs overview sums the
-- live dispatchers' shares into a job's effective concurrency in total. NULL for a
-- dispatcher of a version that does not publish them.
ALTER TABLE dispatchers ADD COLUMN shares TEXT;
