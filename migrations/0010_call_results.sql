-- What remote function calls returned or raised, kept for their callers (`@gl.remote`).
-- Written by the statement that finishes the call's task; read (and waited for) by the
-- caller through `POST /v1/calls/results`; deleted with the job by retention.
CREATE TABLE call_results (
    job_id bigint PRIMARY KEY,
    ok boolean NOT NULL,
    -- The pickled value or exception, base64 (as it travels).
    payload text,
    -- What was raised: type, module, message, traceback.
    error jsonb,
    at timestamptz NOT NULL DEFAULT now()
);
