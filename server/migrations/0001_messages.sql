-- The outbox itself: one row per committed message, written in the producer's transaction.
CREATE SCHEMA IF NOT EXISTS outbox;

CREATE TABLE outbox.messages (
    -- The relay's order. Identity values are assigned at insert, not at commit, so the relay
    -- claims unrelayed rows instead of following a cursor (a cursor would skip a row whose
    -- transaction commits after a later one).
    seq           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    message_id    uuid        NOT NULL UNIQUE,
    topic         text        NOT NULL CHECK (topic <> ''),
    type          text        NOT NULL CHECK (type <> ''),
    payload       bytea       NOT NULL,
    headers       jsonb       NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(headers) = 'object'),
    ordering_key  text,
    enqueued_at   timestamptz NOT NULL DEFAULT now(),
    -- Not delivered before this instant (enqueue with a delay).
    available_at  timestamptz NOT NULL DEFAULT now(),
    -- Set by the relay in the transaction that fans the message out to consumers' inboxes.
    relayed_at    timestamptz
);

-- The relay's work list: exactly the unrelayed rows, in claim order.
CREATE INDEX messages_unrelayed ON outbox.messages (seq) WHERE relayed_at IS NULL;
-- Replay by enqueue-time range and pruning by age.
CREATE INDEX messages_enqueued_at ON outbox.messages (enqueued_at);
