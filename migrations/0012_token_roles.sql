-- Tokens as `gpulayer token` manages them: the roles named as the docs name them ('worker'
-- was 'join', 'read-only' was 'read_only'), an optional expiry, and the token that made each
-- one (NULL for those `gpulayer up` makes).
ALTER TABLE tokens DROP CONSTRAINT tokens_role_check;
UPDATE tokens SET role = 'worker' WHERE role = 'join';
UPDATE tokens SET role = 'read-only' WHERE role = 'read_only';
ALTER TABLE tokens ADD CONSTRAINT tokens_role_check
    CHECK (role IN ('admin', 'submitter', 'read-only', 'worker'));
ALTER TABLE tokens ADD COLUMN expires_at TIMESTAMPTZ;
ALTER TABLE tokens ADD COLUMN created_by BIGINT REFERENCES tokens (id);
