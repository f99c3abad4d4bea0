-- Whether a blob is a source archive the server checked at upload (true), or other data such
-- as a pickled function (false). NULL: stored before the check existed.
ALTER TABLE blobs ADD COLUMN archive BOOLEAN;
