-- Least privilege for applications (ADR 0022) and the message limits outside gRPC (ADR 0023).

-- The roles. Roles belong to the cluster, not to this database: another database on the same
-- cluster may have created them already, or be creating them at this moment (its migration runs
-- under its own database's lock, not this one). `CREATE ROLE` has no IF NOT EXISTS. A role that
-- exists is left as it is (a DBA may have created it, and outboxd's login then needs no
-- CREATEROLE); otherwise it is created in a sub-transaction that treats losing a race as
-- success: duplicate_object when the other creation has committed, unique_violation when both
-- inserted into pg_authid at once.
DO $$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['outbox_producer', 'outbox_consumer'] LOOP
        CONTINUE WHEN EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = r);
        BEGIN
            EXECUTE format('CREATE ROLE %I NOLOGIN', r);
        EXCEPTION
            WHEN duplicate_object OR unique_violation THEN
                NULL;
            WHEN insufficient_privilege THEN
                RAISE EXCEPTION 'outboxd migration 0009: role % does not exist and % may not create it', r, current_user
                    USING ERRCODE = 'insufficient_privilege',
                          HINT = 'Create the NOLOGIN roles outbox_producer and outbox_consumer once as a role with CREATEROLE, or grant CREATEROLE to outboxd''s login, then migrate again.';
        END;
    END LOOP;
END
$$;

-- Nothing in schema outbox is callable by everyone any more; each role gets what it needs.
-- (The owner, outboxd's own login, keeps every privilege.)
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA outbox FROM PUBLIC;
ALTER DEFAULT PRIVILEGES IN SCHEMA outbox REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC;

-- Enqueue runs with the owner's rights, so a producer needs no privilege on the tables: it can
-- add messages, inside its own transaction, and read or change nothing. The search_path is
-- pinned so that a caller's objects cannot stand in for the ones it uses. It now checks the
-- limits of the Enqueue RPC (ADR 0023), naming the limit and the value; as PL/pgSQL its
-- statement is planned once per session, which makes it cheaper than the SQL wrapper it
-- replaces (planned at every call), checks included.
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
    IF octet_length(type) > 255 THEN
        RAISE EXCEPTION 'outbox.enqueue: type is % bytes; the limit is 255 bytes', octet_length(type)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF octet_length(ordering_key) > 255 THEN
        RAISE EXCEPTION 'outbox.enqueue: ordering_key is % bytes; the limit is 255 bytes', octet_length(ordering_key)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF headers IS NOT NULL AND headers <> '{}' AND jsonb_typeof(headers) = 'object' THEN
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
    SELECT e.id INTO v_id FROM outbox.enqueue_message(topic, type, payload, headers, message_id, ordering_key) AS e;
    RETURN v_id;
END
$$;
-- The transactional ack, the same way: a consumer acks in the transaction of its effect.
ALTER FUNCTION outbox.ack(text, uuid)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;

GRANT USAGE ON SCHEMA outbox TO outbox_producer, outbox_consumer;
GRANT EXECUTE ON FUNCTION outbox.enqueue(text, text, bytea, jsonb, uuid, text) TO outbox_producer;
GRANT EXECUTE ON FUNCTION outbox.ack(text, uuid) TO outbox_consumer;

-- `type` and `ordering_key` at most 255 bytes, held by the table for every writer (two cheap
-- length checks). The header limits are not a table CHECK: walking the headers of every row
-- costs a quarter or more of a plain INSERT's CPU (ADR 0023), and only the owner's login can
-- INSERT directly (ADR 0022) — outbox-client, which checks them in Rust. NOT VALID, as
-- migration 0007: rows written before are not rescanned; every new row is checked.
ALTER TABLE outbox.messages
    ADD CONSTRAINT messages_type_length CHECK (octet_length(type) <= 255) NOT VALID,
    ADD CONSTRAINT messages_ordering_key_length CHECK (octet_length(ordering_key) <= 255) NOT VALID;
