-- The sequence number of the worker's newest poll. A claim runs only for a poll at least this
-- new, so a poll the worker has given up on (and replaced) assigns nothing after its successor
-- has started; tasks it did assign are delivered again by the successor.
ALTER TABLE worker_heartbeats ADD COLUMN poll_seq BIGINT NOT NULL DEFAULT 0;
