-- The web console's sign-ins (ADR 0073): the browser's cookie holds a random session id, never
-- a credential. A row is found by the SHA-256 of that id (a copy of this table opens no
-- session); it keeps which principal signed in and the SHA-256 of the token it signed in with,
-- which every request looks up again in the auth file in force (a revoked token or principal
-- ends the session). Signing out deletes the row; `seen_at` (idle) and `expires_at` (absolute)
-- end it otherwise. Every replica on this database reads the same rows.
CREATE TABLE outbox.console_sessions (
    id_hash    bytea       PRIMARY KEY CHECK (length(id_hash) = 32),
    principal  text        NOT NULL,
    token_hash bytea       NOT NULL CHECK (length(token_hash) = 32),
    created_at timestamptz NOT NULL,
    seen_at    timestamptz NOT NULL,
    expires_at timestamptz NOT NULL
);
CREATE INDEX console_sessions_principal ON outbox.console_sessions (principal, created_at);
