-- Settings that outboxd's SQL entry points enforce for every caller, written by outboxd at
-- start-up from its flags (ADR 0053): the limits of the Enqueue RPC that a producer calling
-- `outbox.enqueue` must meet too. One row. `outbox.enqueue` reads it with its owner's rights;
-- nobody else needs to.
CREATE TABLE outbox.settings (
    id                boolean PRIMARY KEY DEFAULT true CHECK (id),
    max_payload_bytes integer NOT NULL DEFAULT 1048576 CHECK (max_payload_bytes > 0)
);
INSERT INTO outbox.settings DEFAULT VALUES;
