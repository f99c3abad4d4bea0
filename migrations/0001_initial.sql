-- The whole of GPUlayer's state. Applied by the store crate at start-up; sqlx's migrator takes
-- an advisory lock, so several replicas starting at once apply it exactly once.

CREATE TABLE tokens (
    id            BIGSERIAL PRIMARY KEY,
    name          TEXT NOT NULL,
    role          TEXT NOT NULL CHECK (role IN ('admin', 'submitter', 'read_only', 'join')),
    -- sha256 of the secret; the secret itself is shown once and never stored.
    secret_sha256 BYTEA NOT NULL UNIQUE,
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    revoked_at    TIMESTAMPTZ
);

CREATE TABLE workers (
    id            BIGSERIAL PRIMARY KEY,
    name          TEXT NOT NULL,
    labels        JSONB NOT NULL DEFAULT '{}',
    inventory     JSONB NOT NULL,
    slots         INT NOT NULL CHECK (slots > 0),
    state         TEXT NOT NULL CHECK (state IN ('online', 'lost', 'stopped')),
    version       TEXT NOT NULL,
    registered_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    lost_at       TIMESTAMPTZ,
    lost_reason   TEXT
);

-- Heartbeats are the hottest writes; a narrow table keeps them off the wide workers rows.
CREATE TABLE worker_heartbeats (
    worker_id BIGINT PRIMARY KEY REFERENCES workers (id),
    last_seen TIMESTAMPTZ NOT NULL
);

CREATE TABLE jobs (
    id              BIGSERIAL PRIMARY KEY,
    name            TEXT,
    spec            JSONB NOT NULL,
    accelerator     TEXT NOT NULL,
    state           TEXT NOT NULL CHECK (state IN ('pending', 'assigned', 'running', 'succeeded', 'failed', 'cancelled')),
    priority        INT NOT NULL DEFAULT 0,
    submitted_by    BIGINT REFERENCES tokens (id),
    idempotency_key TEXT UNIQUE,
    exit_code       INT,
    reason          TEXT,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    finished_at     TIMESTAMPTZ
);
CREATE INDEX jobs_newest ON jobs (id DESC);
CREATE INDEX jobs_state_newest ON jobs (state, id DESC);

CREATE TABLE tasks (
    id            BIGSERIAL PRIMARY KEY,
    job_id        BIGINT NOT NULL REFERENCES jobs (id),
    task_index    INT NOT NULL DEFAULT 0,
    state         TEXT NOT NULL CHECK (state IN ('pending', 'assigned', 'running', 'succeeded', 'failed', 'cancelled')),
    -- Copied from the job so the claim can filter without a join.
    accelerator   TEXT NOT NULL,
    priority      INT NOT NULL DEFAULT 0,
    attempt       INT NOT NULL DEFAULT 0,
    worker_id     BIGINT REFERENCES workers (id),
    assigned_at   TIMESTAMPTZ,
    started_at    TIMESTAMPTZ,
    finished_at   TIMESTAMPTZ,
    exit_code     INT,
    reason        TEXT,
    outputs_key   TEXT,
    outputs_bytes BIGINT,
    UNIQUE (job_id, task_index)
);
-- The claim reads runnable tasks in priority then id order: a partial index over just those
-- rows keeps the claimable set small however many finished tasks pile up.
CREATE INDEX tasks_claimable ON tasks (priority DESC, id) WHERE state = 'pending';
CREATE INDEX tasks_by_worker ON tasks (worker_id) WHERE state IN ('assigned', 'running');

CREATE TABLE logs (
    task_id BIGINT NOT NULL REFERENCES tasks (id),
    attempt INT NOT NULL,
    seq     BIGINT NOT NULL,
    job_id  BIGINT NOT NULL REFERENCES jobs (id),
    stream  SMALLINT NOT NULL,
    text    TEXT NOT NULL,
    at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (task_id, attempt, seq)
);
CREATE INDEX logs_by_job ON logs (job_id, task_id, attempt, seq);

CREATE TABLE events (
    id        BIGSERIAL PRIMARY KEY,
    job_id    BIGINT REFERENCES jobs (id),
    worker_id BIGINT REFERENCES workers (id),
    kind      TEXT NOT NULL,
    detail    TEXT,
    at        TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX events_by_job ON events (job_id, id);

CREATE TABLE blobs (
    digest     TEXT PRIMARY KEY,
    bytes      BIGINT NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
