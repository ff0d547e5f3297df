-- Enqueue in the caller's transaction on outboxd's SQLite file: the documented statement
-- (docs/sql-api.md), which any SQLite from 3.31 runs. The message_id is the caller's (a
-- duplicate writes nothing).
-- parameters: topic, type, payload, headers, message_id, ordering_key
INSERT INTO outbox_messages (topic, type, payload, headers, message_id, ordering_key)
VALUES (?1, ?2, ?3, ?4, ?5, ?6)
ON CONFLICT (message_id) DO NOTHING
