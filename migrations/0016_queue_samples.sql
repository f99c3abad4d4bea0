-- The queue over time, for the dashboard's pictures: the leader counts what waits and what
-- runs every 15 seconds, and how many tasks finished since its last count. Kept a day.
CREATE TABLE queue_samples (
    at       TIMESTAMPTZ PRIMARY KEY DEFAULT now(),
    pending  INT NOT NULL,
    running  INT NOT NULL,
    finished INT NOT NULL
);
