-- The enqueue path for every language: called inside the producer's own transaction.

-- A time-ordered UUID (version 7), so ids sort roughly by enqueue time.
CREATE FUNCTION outbox.uuid_v7() RETURNS uuid
LANGUAGE sql VOLATILE AS $$
    SELECT encode(
        set_bit(set_bit(
            overlay(uuid_send(gen_random_uuid())
                    PLACING substring(int8send(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3)
                    FROM 1 FOR 6),
            52, 1), 53, 1),
        'hex')::uuid
$$;

-- Inserts one message and reports whether it already existed. An existing message_id is an
-- idempotent success: nothing is written and the caller's transaction is not aborted.
CREATE FUNCTION outbox.enqueue_message(
    topic        text,
    type         text,
    payload      bytea,
    headers      jsonb    DEFAULT '{}',
    message_id   uuid     DEFAULT NULL,
    ordering_key text     DEFAULT NULL,
    delay        interval DEFAULT NULL,
    -- The server passes its own clock here; SQL callers leave it to now().
    at           timestamptz DEFAULT NULL
) RETURNS TABLE (id uuid, message_seq bigint, is_duplicate boolean)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_variable
DECLARE
    v_id  uuid := coalesce(message_id, outbox.uuid_v7());
    v_seq bigint;
BEGIN
    IF topic IS NULL OR length(topic) > 255 OR topic !~ '^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$' THEN
        RAISE EXCEPTION 'outbox.enqueue: invalid topic %: dot-separated segments of [A-Za-z0-9_-], at most 255 characters, required', quote_nullable(topic)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF type IS NULL OR type = '' THEN
        RAISE EXCEPTION 'outbox.enqueue: type must not be empty'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF payload IS NULL THEN
        RAISE EXCEPTION 'outbox.enqueue: payload must not be null'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF headers IS NOT NULL AND jsonb_typeof(headers) <> 'object' THEN
        RAISE EXCEPTION 'outbox.enqueue: headers must be a JSON object of strings'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF delay IS NOT NULL AND delay < interval '0' THEN
        RAISE EXCEPTION 'outbox.enqueue: delay must not be negative'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    INSERT INTO outbox.messages AS m (message_id, topic, type, payload, headers, ordering_key, enqueued_at, available_at)
    VALUES (v_id, topic, type, payload, coalesce(headers, '{}'), nullif(ordering_key, ''),
            coalesce(at, now()), coalesce(at, now()) + coalesce(delay, interval '0'))
    ON CONFLICT ON CONSTRAINT messages_message_id_key DO NOTHING
    RETURNING m.seq INTO v_seq;

    IF v_seq IS NOT NULL THEN
        RETURN QUERY SELECT v_id, v_seq, false;
    ELSE
        RETURN QUERY SELECT m.message_id, m.seq, true FROM outbox.messages m WHERE m.message_id = v_id;
    END IF;
END
$$;

-- The documented SQL entry point for producers in any language:
--   SELECT outbox.enqueue('orders.created', 'OrderCreated', '\x7b7d'::bytea);
CREATE FUNCTION outbox.enqueue(
    topic        text,
    type         text,
    payload      bytea,
    headers      jsonb DEFAULT '{}',
    message_id   uuid  DEFAULT NULL,
    ordering_key text  DEFAULT NULL
) RETURNS uuid
LANGUAGE sql VOLATILE AS $$
    SELECT e.id FROM outbox.enqueue_message($1, $2, $3, $4, $5, $6) e
$$;
