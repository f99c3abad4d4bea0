-- The device indices (of the job's accelerator kind) a task holds on its worker, chosen by
-- the scheduler at claim time; a worker's busy devices are those of its assigned and running
-- tasks.
ALTER TABLE tasks ADD COLUMN devices INT[] NOT NULL DEFAULT '{}';
