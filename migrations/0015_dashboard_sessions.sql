-- The web dashboard's logins: one-time links (`gpulayer dashboard`) and the sessions they
-- (or the login form) open. Only sha256s of the secrets are stored; a session acts with its
-- token's role, and dies with the token (revoked or expired).
CREATE TABLE dashboard_links (
    code_sha256 BYTEA PRIMARY KEY,
    token_id    BIGINT NOT NULL REFERENCES tokens (id) ON DELETE CASCADE,
    expires_at  TIMESTAMPTZ NOT NULL
);

CREATE TABLE dashboard_sessions (
    secret_sha256 BYTEA PRIMARY KEY,
    token_id      BIGINT NOT NULL REFERENCES tokens (id) ON DELETE CASCADE,
    -- Every form carries it; a request whose form does not is refused.
    csrf          TEXT NOT NULL,
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at    TIMESTAMPTZ NOT NULL
);
CREATE INDEX dashboard_sessions_expiry ON dashboard_sessions (expires_at);

-- The dashboard's job filters, newest first.
CREATE INDEX jobs_by_submitter ON jobs (submitted_by, id DESC);
