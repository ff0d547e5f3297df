-- The web console's sign-ins (ADR 0073): the same model as PostgreSQL's migration 0025; times
-- in microseconds since the epoch, as every time of this schema.
CREATE TABLE outbox_console_sessions (
    id_hash    BLOB    PRIMARY KEY CHECK (length(id_hash) = 32),
    principal  TEXT    NOT NULL,
    token_hash BLOB    NOT NULL CHECK (length(token_hash) = 32),
    created_at INTEGER NOT NULL,
    seen_at    INTEGER NOT NULL,
    expires_at INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX outbox_console_sessions_principal ON outbox_console_sessions (principal, created_at);
