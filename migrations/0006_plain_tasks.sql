-- A plain task asks a worker for nothing but its accelerator kind (no devices, frameworks or
-- labels): any online worker offering the kind fits it, so a claim assigns plain tasks in one
-- statement instead of putting each to the scheduler first. Unknown (older rows): not plain.
ALTER TABLE tasks ADD COLUMN plain BOOLEAN NOT NULL DEFAULT false;
