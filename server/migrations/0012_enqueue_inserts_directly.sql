-- `outbox.enqueue` inserts the message itself instead of calling `outbox.enqueue_message`
-- (issue "Storage v2", item 4). The nested call was a second PL/pgSQL function run through a
-- query of the first, with its own executor start-up, for every message. Measured with pgbench
-- on this schema (16 clients, three alternating 8-second pairs of each statement): against a
-- plain INSERT into the same table, 0.79 before and 0.91-0.96 after with the simple protocol,
-- 0.63 before and 0.87 after with prepared statements (ADR 0040). The checks and their
-- messages are the same as before, in one place; the table's CHECKs still hold every writer.
-- `outbox.enqueue_message` stays for outboxd's own Enqueue RPC (it takes a delay and a time).
CREATE OR REPLACE FUNCTION outbox.enqueue(
    topic        text,
    type         text,
    payload      bytea,
    headers      jsonb DEFAULT '{}',
    message_id   uuid  DEFAULT NULL,
    ordering_key text  DEFAULT NULL
) RETURNS uuid
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    v_key   text;
    v_value jsonb;
    v_count integer := 0;
    v_bytes integer := 0;
    v_id    uuid;
BEGIN
    IF topic IS NULL OR length(topic) > 255 OR topic !~ '^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$' THEN
        RAISE EXCEPTION 'outbox.enqueue: invalid topic %: dot-separated segments of [A-Za-z0-9_-], at most 255 characters, required', quote_nullable(topic)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF type IS NULL OR type = '' THEN
        RAISE EXCEPTION 'outbox.enqueue: type must not be empty'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF octet_length(type) > 255 THEN
        RAISE EXCEPTION 'outbox.enqueue: type is % bytes; the limit is 255 bytes', octet_length(type)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF octet_length(ordering_key) > 255 THEN
        RAISE EXCEPTION 'outbox.enqueue: ordering_key is % bytes; the limit is 255 bytes', octet_length(ordering_key)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF payload IS NULL THEN
        RAISE EXCEPTION 'outbox.enqueue: payload must not be null'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF headers IS NOT NULL AND headers <> '{}' THEN
        IF jsonb_typeof(headers) <> 'object' THEN
            RAISE EXCEPTION 'outbox.enqueue: headers must be a JSON object of strings'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        FOR v_key, v_value IN SELECT h.key, h.value FROM jsonb_each(headers) AS h LOOP
            v_count := v_count + 1;
            IF v_key = '' OR octet_length(v_key) > 256 THEN
                RAISE EXCEPTION 'outbox.enqueue: header key % is % bytes; keys are 1 to 256 bytes',
                        quote_literal(left(v_key, 32)), octet_length(v_key)
                    USING ERRCODE = 'invalid_parameter_value';
            END IF;
            IF jsonb_typeof(v_value) <> 'string' THEN
                RAISE EXCEPTION 'outbox.enqueue: header % is a JSON %; header values are strings',
                        quote_literal(left(v_key, 32)), jsonb_typeof(v_value)
                    USING ERRCODE = 'invalid_parameter_value';
            END IF;
            v_bytes := v_bytes + octet_length(v_key) + octet_length(v_value #>> '{}');
        END LOOP;
        IF v_count > 64 THEN
            RAISE EXCEPTION 'outbox.enqueue: % headers; the limit is 64 entries', v_count
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF v_bytes > 16384 THEN
            RAISE EXCEPTION 'outbox.enqueue: headers are % bytes (keys and values); the limit is 16384 bytes', v_bytes
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END IF;
    -- An existing message_id is an idempotent success: nothing is written, the caller's
    -- transaction goes on, and the id is the answer (only a given id can conflict).
    INSERT INTO outbox.messages AS m (message_id, topic, type, payload, headers, ordering_key)
    VALUES (coalesce(message_id, outbox.uuid_v7()), topic, type, payload, coalesce(headers, '{}'),
            nullif(ordering_key, ''))
    ON CONFLICT ON CONSTRAINT messages_message_id_key DO NOTHING
    RETURNING m.message_id INTO v_id;
    RETURN coalesce(v_id, message_id);
END
$$;
