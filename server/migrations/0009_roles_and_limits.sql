-- Least privilege for applications (ADR 0022) and the message limits for every writer (ADR 0023).

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
-- pinned so that a caller's objects cannot stand in for the ones it uses.
ALTER FUNCTION outbox.enqueue(text, text, bytea, jsonb, uuid, text)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
-- The transactional ack, the same way: a consumer acks in the transaction of its effect.
ALTER FUNCTION outbox.ack(text, uuid)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;

GRANT USAGE ON SCHEMA outbox TO outbox_producer, outbox_consumer;
GRANT EXECUTE ON FUNCTION outbox.enqueue(text, text, bytea, jsonb, uuid, text) TO outbox_producer;
GRANT EXECUTE ON FUNCTION outbox.ack(text, uuid) TO outbox_consumer;

-- The limits of the Enqueue RPC, held by the table for every writer (outbox.enqueue, the Rust
-- client's plain INSERT, any INSERT): `type` and `ordering_key` at most 255 bytes; headers at
-- most 64 entries of string values, keys non-empty and at most 256 bytes, keys and values at most
-- 16 KiB together.
CREATE FUNCTION outbox.headers_within_limits(headers jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
    SELECT count(*) <= 64
       AND coalesce(bool_and(h.key <> '' AND octet_length(h.key) <= 256 AND jsonb_typeof(h.value) = 'string'), true)
       AND coalesce(sum(octet_length(h.key) + octet_length(h.value #>> '{}')), 0) <= 16384
      FROM jsonb_each(headers) AS h
$$;
-- Every writer evaluates it in the CHECK below, whatever its own privileges.
GRANT EXECUTE ON FUNCTION outbox.headers_within_limits(jsonb) TO PUBLIC;

-- NOT VALID, as migration 0007: rows written before are not rescanned; every new row is checked.
ALTER TABLE outbox.messages
    ADD CONSTRAINT messages_type_length CHECK (octet_length(type) <= 255) NOT VALID,
    ADD CONSTRAINT messages_ordering_key_length CHECK (octet_length(ordering_key) <= 255) NOT VALID,
    ADD CONSTRAINT messages_headers_limits
        CHECK (headers = '{}'::jsonb OR outbox.headers_within_limits(headers)) NOT VALID;
