-- Poison-key quarantine (ADR 0057): the same model as PostgreSQL's migration 0020.
ALTER TABLE outbox_consumers
    ADD COLUMN dead_key_policy TEXT NOT NULL DEFAULT 'skip' CHECK (dead_key_policy IN ('skip', 'hold'));

CREATE TABLE outbox_held_keys (
    consumer     TEXT    NOT NULL REFERENCES outbox_consumers (name) ON DELETE CASCADE,
    ordering_key TEXT    NOT NULL,
    message_id   TEXT    NOT NULL,
    seq          INTEGER NOT NULL,
    held_at      INTEGER NOT NULL,
    PRIMARY KEY (consumer, ordering_key)
);
CREATE INDEX outbox_held_keys_message ON outbox_held_keys (consumer, message_id);
