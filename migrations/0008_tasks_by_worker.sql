-- A worker's tasks by state, for the queries that look them up by worker (busy devices,
-- undelivered or forgotten tasks, listings). Not partial on state: a partial index whose
-- predicate a statement's own state test implies is one the planner may read whole, and
-- with a queue's stale statistics it did, for the statements that record starts and ends
-- (they find tasks by id: see store::reports).
DROP INDEX tasks_by_worker;
CREATE INDEX tasks_by_worker ON tasks (worker_id, state) WHERE worker_id IS NOT NULL;
