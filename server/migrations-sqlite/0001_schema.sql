-- The embedded store: the same three tables as PostgreSQL's schema `outbox`, named with an
-- `outbox_` prefix. Times are integer microseconds since the Unix epoch (UTC).

-- One row per committed message. Producers in any language insert here directly:
--   INSERT INTO outbox_messages (topic, type, payload) VALUES ('orders.created', 'OrderCreated', x'7b7d');
-- optionally with message_id (a UUID as lowercase hyphenated text), headers (a JSON object of strings),
-- ordering_key and available_at; an existing message_id is skipped with
--   ... ON CONFLICT (message_id) DO NOTHING
CREATE TABLE outbox_messages (
    seq           INTEGER PRIMARY KEY AUTOINCREMENT,
    message_id    TEXT    NOT NULL UNIQUE DEFAULT (lower(
                      hex(randomblob(4)) || '-' || hex(randomblob(2)) || '-4' ||
                      substr(hex(randomblob(2)), 2) || '-' ||
                      substr('89ab', 1 + (abs(random()) % 4), 1) || substr(hex(randomblob(2)), 2) || '-' ||
                      hex(randomblob(6))))
                  -- Lowercase, hyphenated: acks and replays match ids as text.
                  CHECK (message_id GLOB '[0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f]-[0-9a-f][0-9a-f][0-9a-f][0-9a-f]-[0-9a-f][0-9a-f][0-9a-f][0-9a-f]-[0-9a-f][0-9a-f][0-9a-f][0-9a-f]-[0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f]'),
    topic         TEXT    NOT NULL CHECK (topic <> '' AND topic NOT GLOB '*[^A-Za-z0-9_.-]*'
                                          AND topic NOT GLOB '.*' AND topic NOT GLOB '*.'
                                          AND topic NOT GLOB '*..*'),
    type          TEXT    NOT NULL CHECK (type <> ''),
    payload       BLOB    NOT NULL,
    headers       TEXT    NOT NULL DEFAULT '{}' CHECK (json_valid(headers) AND json_type(headers) = 'object'),
    ordering_key  TEXT,
    enqueued_at   INTEGER NOT NULL DEFAULT (CAST(unixepoch('subsec') * 1000000 AS INTEGER)),
    -- Not delivered before this instant; NULL means enqueued_at.
    available_at  INTEGER,
    relayed_at    INTEGER
);
CREATE INDEX outbox_messages_unrelayed ON outbox_messages (seq) WHERE relayed_at IS NULL;
CREATE INDEX outbox_messages_enqueued_at ON outbox_messages (enqueued_at);
CREATE INDEX outbox_messages_unrelayed_ordering ON outbox_messages (ordering_key, seq)
    WHERE relayed_at IS NULL AND ordering_key IS NOT NULL;

CREATE TABLE outbox_consumers (
    name             TEXT    PRIMARY KEY,
    -- A JSON array of topic patterns.
    topics           TEXT    NOT NULL,
    max_deliveries   INTEGER NOT NULL CHECK (max_deliveries > 0),
    backoff_base_ms  INTEGER NOT NULL CHECK (backoff_base_ms >= 0),
    backoff_max_ms   INTEGER NOT NULL CHECK (backoff_max_ms >= backoff_base_ms),
    ack_deadline_ms  INTEGER NOT NULL CHECK (ack_deadline_ms > 0),
    paused           INTEGER NOT NULL DEFAULT 0,
    start_from       TEXT    NOT NULL CHECK (start_from IN ('new', 'earliest')),
    start_seq        INTEGER NOT NULL DEFAULT 0,
    created_at       INTEGER NOT NULL
);

-- The inbox; the state machine is the same as PostgreSQL's (see its migration 0002).
CREATE TABLE outbox_deliveries (
    message_id        TEXT    NOT NULL REFERENCES outbox_messages (message_id) ON DELETE CASCADE,
    consumer          TEXT    NOT NULL REFERENCES outbox_consumers (name) ON DELETE CASCADE,
    seq               INTEGER NOT NULL,
    ordering_key      TEXT,
    state             TEXT    NOT NULL DEFAULT 'pending'
                              CHECK (state IN ('pending', 'leased', 'acked', 'dead')),
    delivery_count    INTEGER NOT NULL DEFAULT 0,
    available_at      INTEGER NOT NULL,
    lease_expires_at  INTEGER,
    leased_by         TEXT,
    last_error        TEXT,
    created_at        INTEGER NOT NULL,
    updated_at        INTEGER NOT NULL,
    acked_at          INTEGER,
    dead_at           INTEGER,
    PRIMARY KEY (message_id, consumer),
    CHECK ((state = 'leased') = (lease_expires_at IS NOT NULL))
) WITHOUT ROWID;

CREATE INDEX outbox_deliveries_pending ON outbox_deliveries (consumer, seq) WHERE state = 'pending';
CREATE INDEX outbox_deliveries_pending_due ON outbox_deliveries (consumer, available_at) WHERE state = 'pending';
CREATE INDEX outbox_deliveries_leased ON outbox_deliveries (lease_expires_at) WHERE state = 'leased';
CREATE INDEX outbox_deliveries_dead ON outbox_deliveries (consumer, seq) WHERE state = 'dead';
CREATE INDEX outbox_deliveries_ordering ON outbox_deliveries (consumer, ordering_key, seq)
    WHERE ordering_key IS NOT NULL AND state IN ('pending', 'leased');
