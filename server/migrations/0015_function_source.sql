-- The SQL functions now live in one file, `server/sql/functions.sql`, applied after the
-- migrations when it changed (ADR 0043). This row records which version this database holds:
-- the file's revision, which only grows from release to release, and its digest. A start-up
-- with the same file writes nothing, and an older release never puts its functions back over
-- a newer one's.
CREATE TABLE outbox.function_source (
    id         boolean     PRIMARY KEY DEFAULT true CHECK (id),
    revision   integer     NOT NULL,
    digest     text        NOT NULL,
    applied_at timestamptz NOT NULL
);
