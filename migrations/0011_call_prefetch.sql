-- Remote function calls that ask for nothing but their accelerator kind and the caller's
-- Python minor version: any worker with that Python takes them, and a worker may queue
-- more of them than it has free slots (its warm runners take them one after another), so a
-- map over many small calls is claimed in batches. NULL for every other task.
ALTER TABLE tasks ADD COLUMN call_python TEXT;
CREATE INDEX tasks_pending_calls ON tasks (call_python, priority DESC, id)
    WHERE state = 'pending' AND call_python IS NOT NULL;
-- The first pending task that is not a queueable call: calls are taken ahead of free slots
-- only while they come before it in the queue, so a flood of calls never keeps a worker
-- from the other jobs only it could run.
CREATE INDEX tasks_pending_others ON tasks (priority DESC, id)
    WHERE state = 'pending' AND call_python IS NULL AND gang_size = 1;
