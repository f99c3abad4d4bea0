-- events is an append-only log. Its foreign keys made every insert (four per job) look up and
-- share-lock the job's and the worker's rows, a tenth of the queue's database time on short
-- jobs; a job's events are deleted with it (retention), and workers are never deleted.
ALTER TABLE events DROP CONSTRAINT events_job_id_fkey;
ALTER TABLE events DROP CONSTRAINT events_worker_id_fkey;
