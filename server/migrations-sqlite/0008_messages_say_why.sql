-- A producer's insert that SQLite refuses says why in a sentence, naming the column, instead of
-- the text of a CHECK constraint (`CHECK constraint failed: topic <> '' AND topic NOT GLOB …`)
-- or a limit message that calls a header value of the wrong type "exceeding its limits". This
-- trigger replaces the insert trigger of 0004 (the same limits, each with its own sentence); it
-- runs before the row's constraints, which stay as they were for every other writer.
DROP TRIGGER outbox_messages_limits_insert;

CREATE TRIGGER outbox_messages_say_why BEFORE INSERT ON outbox_messages
BEGIN
    SELECT RAISE(ABORT, 'outbox_messages: topic must be dot-separated segments of [A-Za-z0-9_-] (orders.created), not empty')
     WHERE NEW.topic IS NULL OR NEW.topic = '' OR NEW.topic GLOB '*[^A-Za-z0-9_.-]*' OR NEW.topic GLOB '.*'
        OR NEW.topic GLOB '*.' OR NEW.topic GLOB '*..*';
    SELECT RAISE(ABORT, 'outbox_messages: type must not be empty')
     WHERE NEW.type IS NULL OR NEW.type = '';
    SELECT RAISE(ABORT, 'outbox_messages: type is longer than 255 bytes')
     WHERE length(CAST(NEW.type AS BLOB)) > 255;
    SELECT RAISE(ABORT, 'outbox_messages: payload is required (x'''' for an empty one)')
     WHERE NEW.payload IS NULL;
    SELECT RAISE(ABORT, 'outbox_messages: message_id must be a UUID written in lowercase with hyphens')
     WHERE NEW.message_id IS NOT NULL AND NEW.message_id NOT GLOB '[0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f]-[0-9a-f][0-9a-f][0-9a-f][0-9a-f]-[0-9a-f][0-9a-f][0-9a-f][0-9a-f]-[0-9a-f][0-9a-f][0-9a-f][0-9a-f]-[0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f]';
    SELECT RAISE(ABORT, 'outbox_messages: ordering_key is longer than 255 bytes')
     WHERE length(CAST(NEW.ordering_key AS BLOB)) > 255;
    SELECT RAISE(ABORT, 'outbox_messages: headers must be a JSON object of strings ({"tenant":"acme"})')
     WHERE NEW.headers IS NOT NULL AND NOT (json_valid(NEW.headers) AND json_type(NEW.headers) = 'object');
    SELECT RAISE(ABORT, 'outbox_messages: header values must be JSON strings')
     WHERE json_valid(NEW.headers) AND json_type(NEW.headers) = 'object' AND NEW.headers <> '{}'
       AND EXISTS (SELECT 1 FROM json_each(NEW.headers) AS h WHERE h.type <> 'text');
    SELECT RAISE(ABORT, 'outbox_messages: headers exceed their limits (at most 64 entries, keys of 1 to 256 bytes, 16384 bytes of keys and values)')
     WHERE json_valid(NEW.headers) AND json_type(NEW.headers) = 'object' AND NEW.headers <> '{}'
       AND (SELECT count(*) > 64
                OR coalesce(max(h.key = '' OR length(CAST(h.key AS BLOB)) > 256), 0)
                OR coalesce(sum(length(CAST(h.key AS BLOB)) + length(CAST(h.value AS BLOB))), 0) > 16384
              FROM json_each(NEW.headers) AS h);
END;
