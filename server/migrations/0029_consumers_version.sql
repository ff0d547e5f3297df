-- A version of the consumers as a relay pass matches them, so that a pass carries them only
-- when they changed (ADR 0078). The relay kept no list between passes and read every wildcard
-- consumer's patterns in each one: with 1,000 consumers of long patterns, megabytes a pass.
-- Triggers on outbox.consumers (server/sql/functions.sql) set a new random version whenever a
-- consumer is created or deleted or its name, topics, paused state or start changes, in the
-- writer's transaction, so it is visible exactly when the change is. Random, not a count: a
-- count could come back to a number a replica holds, with other consumers behind it (a lost
-- commit after a failover, a restore).
CREATE TABLE outbox.consumers_version (
    id      boolean PRIMARY KEY DEFAULT true CHECK (id),
    version uuid    NOT NULL DEFAULT gen_random_uuid()
);
INSERT INTO outbox.consumers_version DEFAULT VALUES;
