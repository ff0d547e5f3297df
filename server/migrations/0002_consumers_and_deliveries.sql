-- Durable consumers and their inbox: one delivery row per (message_id, consumer).
CREATE TABLE outbox.consumers (
    name             text PRIMARY KEY,
    topics           text[]      NOT NULL,
    max_deliveries   integer     NOT NULL CHECK (max_deliveries > 0),
    backoff_base_ms  bigint      NOT NULL CHECK (backoff_base_ms >= 0),
    backoff_max_ms   bigint      NOT NULL CHECK (backoff_max_ms >= backoff_base_ms),
    ack_deadline_ms  bigint      NOT NULL CHECK (ack_deadline_ms > 0),
    paused           boolean     NOT NULL DEFAULT false,
    start_from       text        NOT NULL CHECK (start_from IN ('new', 'earliest')),
    -- The relay fans out to this consumer only messages with seq > start_seq.
    start_seq        bigint      NOT NULL DEFAULT 0,
    created_at       timestamptz NOT NULL DEFAULT now()
);

-- The delivery state machine (mirrored by `DeliveryState` in the server):
--   pending -> leased   a delivery session leases it and sends it to a stream
--   leased  -> acked    the consumer acks (over the stream, or in its own transaction)
--   pending -> acked    a transactional ack (or a late stream ack) after the lease was released
--   leased  -> pending  nack, expired ack deadline, or closed stream, while retries remain
--   leased  -> dead     the same, once delivery_count has reached max_deliveries
--   acked | dead -> pending   only an admin replay
CREATE TABLE outbox.deliveries (
    message_id        uuid        NOT NULL REFERENCES outbox.messages (message_id) ON DELETE CASCADE,
    consumer          text        NOT NULL REFERENCES outbox.consumers (name) ON DELETE CASCADE,
    seq               bigint      NOT NULL,
    ordering_key      text,
    state             text        NOT NULL DEFAULT 'pending'
                                  CHECK (state IN ('pending', 'leased', 'acked', 'dead')),
    delivery_count    integer     NOT NULL DEFAULT 0,
    available_at      timestamptz NOT NULL,
    lease_expires_at  timestamptz,
    leased_by         text,
    last_error        text,
    created_at        timestamptz NOT NULL,
    updated_at        timestamptz NOT NULL,
    acked_at          timestamptz,
    dead_at           timestamptz,
    -- The inbox dedup: one row per message and consumer, whatever the relay does twice.
    PRIMARY KEY (message_id, consumer),
    CHECK ((state = 'leased') = (lease_expires_at IS NOT NULL))
);

-- Delivery sessions lease from here, in seq order.
CREATE INDEX deliveries_pending ON outbox.deliveries (consumer, seq) WHERE state = 'pending';
-- The lease sweeper finds expired leases here.
CREATE INDEX deliveries_leased ON outbox.deliveries (lease_expires_at) WHERE state = 'leased';
-- Dead letters, listed per consumer.
CREATE INDEX deliveries_dead ON outbox.deliveries (consumer, seq) WHERE state = 'dead';
-- Ordering keys: is an earlier message with the same key still unfinished?
CREATE INDEX deliveries_ordering ON outbox.deliveries (consumer, ordering_key, seq)
    WHERE ordering_key IS NOT NULL AND state IN ('pending', 'leased');
