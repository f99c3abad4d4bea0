-- Retries: a task may run up to max_attempts times. Attempts past the first are spent when its
-- worker is lost or leaves, and, when retry_failed is set, when the job itself fails.
ALTER TABLE tasks ADD COLUMN max_attempts INT NOT NULL DEFAULT 4 CHECK (max_attempts >= 1);
ALTER TABLE tasks ADD COLUMN retry_failed BOOLEAN NOT NULL DEFAULT false;
