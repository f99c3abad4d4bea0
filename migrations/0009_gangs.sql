-- Multi-node jobs (gangs): a job of N nodes has N tasks, task_index = the node's rank.
ALTER TABLE tasks ADD COLUMN gang_size INT NOT NULL DEFAULT 1 CHECK (gang_size >= 1);
-- Pending gang tasks, for the claims that look for a gang to start (few rows, unlike
-- tasks_claimable).
CREATE INDEX tasks_pending_gangs ON tasks (priority DESC, id) WHERE state = 'pending' AND gang_size > 1;
-- A gang's tasks are assigned by whichever worker's claim starts it: the other workers are
-- told to look (`pushed`) and hand them out with their next claim. A gang that must wait
-- keeps the workers it chose (`reserved_for`): they take no other work meanwhile.
ALTER TABLE worker_heartbeats ADD COLUMN pushed BOOLEAN NOT NULL DEFAULT false;
ALTER TABLE worker_heartbeats ADD COLUMN reserved_for BIGINT;
-- Where a gang's (or a multi-process job's) processes meet: node 0's address and a port free
-- there, per attempt.
CREATE TABLE rendezvous (
    job_id  BIGINT NOT NULL,
    attempt INT NOT NULL,
    addr    TEXT NOT NULL,
    port    INT NOT NULL CHECK (port > 0 AND port < 65536),
    PRIMARY KEY (job_id, attempt)
);
-- The global rank of the process that printed a line (multi-process jobs; NULL otherwise).
ALTER TABLE logs ADD COLUMN rank INT;
