-- A version of the consumers' definitions, so that a relay pass carries them only when they
-- changed (ADR 0078). The relay kept no list between passes and read every wildcard consumer's
-- patterns in each one: with 1,000 consumers of long patterns, megabytes a pass. A statement
-- trigger on outbox.consumers (server/sql/functions.sql) moves the version on every insert,
-- update, delete or truncate, in the writer's transaction, so it is visible exactly when the
-- change is.
CREATE TABLE outbox.consumers_version (
    id      boolean PRIMARY KEY DEFAULT true CHECK (id),
    version bigint  NOT NULL DEFAULT 1
);
INSERT INTO outbox.consumers_version DEFAULT VALUES;
