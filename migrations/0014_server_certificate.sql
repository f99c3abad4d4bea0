-- The TLS certificate every API replica presents (made by the first `gpulayer up` unless
-- given with --tls-cert/--tls-key), so one pinned fingerprint fits every replica. Whoever
-- can read this table can impersonate the server; whoever can, can also read everything
-- the server holds.
CREATE TABLE server_certificate (
    only_one boolean PRIMARY KEY DEFAULT true CHECK (only_one),
    certificate_pem text NOT NULL,
    private_key_pem text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
