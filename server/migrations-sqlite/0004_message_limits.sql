-- The limits of the Enqueue RPC, held by the table for every writer, as PostgreSQL's migration
-- 0009 does with CHECK constraints (ADR 0023): `type` and `ordering_key` at most 255 bytes;
-- headers at most 64 entries of string values, keys non-empty and at most 256 bytes, keys and
-- values at most 16 KiB together. SQLite cannot add a CHECK to an existing table without
-- rebuilding it, and a CHECK may not hold a subquery (json_each), so triggers refuse the row;
-- the message names the limit. Lengths are in bytes (CAST AS BLOB), as on PostgreSQL.

CREATE TRIGGER outbox_messages_limits_insert BEFORE INSERT ON outbox_messages
BEGIN
    SELECT RAISE(ABORT, 'outbox_messages: type is longer than 255 bytes')
     WHERE length(CAST(NEW.type AS BLOB)) > 255;
    SELECT RAISE(ABORT, 'outbox_messages: ordering_key is longer than 255 bytes')
     WHERE length(CAST(NEW.ordering_key AS BLOB)) > 255;
    SELECT RAISE(ABORT, 'outbox_messages: headers exceed their limits (at most 64 entries of string values, keys of 1 to 256 bytes, 16384 bytes of keys and values)')
     WHERE json_valid(NEW.headers) AND json_type(NEW.headers) = 'object' AND NEW.headers <> '{}'
       AND (SELECT count(*) > 64
                OR coalesce(max(h.key = '' OR length(CAST(h.key AS BLOB)) > 256 OR h.type <> 'text'), 0)
                OR coalesce(sum(length(CAST(h.key AS BLOB)) + length(CAST(h.value AS BLOB))), 0) > 16384
              FROM json_each(NEW.headers) AS h);
END;

CREATE TRIGGER outbox_messages_limits_update BEFORE UPDATE OF type, ordering_key, headers ON outbox_messages
BEGIN
    SELECT RAISE(ABORT, 'outbox_messages: type is longer than 255 bytes')
     WHERE length(CAST(NEW.type AS BLOB)) > 255;
    SELECT RAISE(ABORT, 'outbox_messages: ordering_key is longer than 255 bytes')
     WHERE length(CAST(NEW.ordering_key AS BLOB)) > 255;
    SELECT RAISE(ABORT, 'outbox_messages: headers exceed their limits (at most 64 entries of string values, keys of 1 to 256 bytes, 16384 bytes of keys and values)')
     WHERE json_valid(NEW.headers) AND json_type(NEW.headers) = 'object' AND NEW.headers <> '{}'
       AND (SELECT count(*) > 64
                OR coalesce(max(h.key = '' OR length(CAST(h.key AS BLOB)) > 256 OR h.type <> 'text'), 0)
                OR coalesce(sum(length(CAST(h.key AS BLOB)) + length(CAST(h.value AS BLOB))), 0) > 16384
              FROM json_each(NEW.headers) AS h);
END;
