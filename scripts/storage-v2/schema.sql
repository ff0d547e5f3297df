-- Scratch schema for the storage v2 measurements: the shape of outboxd's tables, with each
-- design's indexes. Loaded into a throw-away database by run.sh.
SET client_min_messages = warning;
DROP SCHEMA IF EXISTS v2 CASCADE;
CREATE SCHEMA v2;
SET search_path = v2;

CREATE TABLE m (
    seq          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    message_id   uuid        NOT NULL UNIQUE,
    topic        text        NOT NULL CHECK (topic <> ''),
    type         text        NOT NULL CHECK (type <> ''),
    payload      bytea       NOT NULL,
    headers      jsonb       NOT NULL DEFAULT '{}',
    ordering_key text,
    enqueued_at  timestamptz NOT NULL DEFAULT now(),
    available_at timestamptz NOT NULL DEFAULT now(),
    relayed_at   timestamptz
);
CREATE INDEX m_enqueued_at ON m (enqueued_at);

CREATE TABLE d (
    consumer         text        NOT NULL,
    message_id       uuid        NOT NULL,
    seq              bigint      NOT NULL,
    state            text        NOT NULL,
    delivery_count   int         NOT NULL DEFAULT 0,
    available_at     timestamptz NOT NULL,
    lease_expires_at timestamptz,
    ordering_key     text,
    acked_at         timestamptz,
    PRIMARY KEY (consumer, message_id)
);
CREATE INDEX d_leased ON d (lease_expires_at) WHERE state = 'leased';
CREATE INDEX d_dead ON d (consumer, seq) WHERE state = 'dead';
CREATE INDEX d_due_unkeyed ON d (consumer, available_at, seq) WHERE state = 'pending' AND ordering_key IS NULL;
CREATE INDEX d_key_heads ON d (consumer, ordering_key COLLATE "C", seq)
    WHERE ordering_key IS NOT NULL AND state IN ('pending', 'leased');

-- v2: the relay's cursor and each consumer's position (ack floor + acked ranges above it).
CREATE TABLE cursor (id int PRIMARY KEY, position bigint NOT NULL);
INSERT INTO cursor VALUES (1, 0);
CREATE TABLE position (consumer text PRIMARY KEY, floor bigint NOT NULL, acked int8multirange NOT NULL);
INSERT INTO position SELECT 'c' || i, 0, '{}' FROM generate_series(1, 16) i;

-- Today's outbox.enqueue (PL/pgSQL, checks repeated) and a SQL-language one.
CREATE FUNCTION enqueue_plpgsql(p_topic text, p_type text, p_payload bytea, p_headers jsonb DEFAULT '{}')
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE s bigint;
BEGIN
    IF p_topic IS NULL OR p_topic = '' THEN RAISE EXCEPTION 'topic: required'; END IF;
    IF p_type IS NULL OR p_type = '' THEN RAISE EXCEPTION 'type: required'; END IF;
    IF jsonb_typeof(p_headers) <> 'object' THEN RAISE EXCEPTION 'headers: an object'; END IF;
    INSERT INTO v2.m (message_id, topic, type, payload, headers)
    VALUES (gen_random_uuid(), p_topic, p_type, p_payload, p_headers)
    ON CONFLICT (message_id) DO NOTHING RETURNING seq INTO s;
    RETURN s;
END $$;
CREATE FUNCTION enqueue_sql(p_topic text, p_type text, p_payload bytea, p_headers jsonb DEFAULT '{}')
RETURNS bigint LANGUAGE sql AS $$
    INSERT INTO v2.m (message_id, topic, type, payload, headers)
    VALUES (gen_random_uuid(), p_topic, p_type, p_payload, p_headers)
    ON CONFLICT (message_id) DO NOTHING RETURNING seq
$$;
