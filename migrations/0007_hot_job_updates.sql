-- A job's state changes three times on its way through the queue. With no index over `state`
-- those updates are HOT (heap-only: no index entries to add, the page prunes itself), which
-- room left on each page (fillfactor) makes possible. `jobs_newest` duplicated the primary
-- key (a b-tree is read backwards as cheaply); listing by state reads the newest jobs first
-- and filters, which stays cheap for the states people list (finished ones, or few running).
DROP INDEX jobs_newest;
DROP INDEX jobs_state_newest;
ALTER TABLE jobs SET (fillfactor = 70);
