-- Poison-key quarantine (ADR 0057). A consumer with dead_key_policy 'hold' holds an ordering
-- key when a message of it dead-letters: the key's later messages wait, not leased and not
-- counted as attempts, until the dead message is replayed (and acked) or the key is released.
-- One exception row per held key: the lease's key-head walk probes it once per key, so a held
-- key costs a lease one index probe however deep its backlog.
ALTER TABLE outbox.consumers
    ADD COLUMN dead_key_policy text NOT NULL DEFAULT 'skip' CHECK (dead_key_policy IN ('skip', 'hold'));

CREATE TABLE outbox.held_keys (
    consumer     text        NOT NULL REFERENCES outbox.consumers (name) ON DELETE CASCADE,
    -- Byte order, as the lease's key cursor and deliveries_key_heads compare keys.
    ordering_key text        COLLATE "C" NOT NULL,
    -- The dead delivery that holds the key.
    message_id   uuid        NOT NULL,
    seq          bigint      NOT NULL,
    held_at      timestamptz NOT NULL,
    PRIMARY KEY (consumer, ordering_key)
);
-- Replay finds the holds of the messages it makes due again.
CREATE INDEX held_keys_message ON outbox.held_keys (consumer, message_id);
