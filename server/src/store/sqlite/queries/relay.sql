-- name: relay_read
-- Up to ?1 messages after the relay cursor, in seq order (ADR 0066).
-- (`relayed_at` is this pass's: the caller sets it.)
SELECT m.message_id, m.seq, m.topic, m.type, m.payload, m.headers, m.ordering_key,
       m.enqueued_at, coalesce(m.available_at, m.enqueued_at) AS available_at, NULL AS relayed_at
  FROM outbox_messages m
 WHERE m.seq > (SELECT c.position FROM outbox_relay_cursor c WHERE c.id = 1)
 ORDER BY m.seq LIMIT ?1;

-- name: relay_advance
-- The cursor moves to ?1, the highest seq the pass read; ?2 its lowest, relayed at ?3.
UPDATE outbox_relay_cursor SET position = ?1 WHERE id = 1;

-- name: relay_log
INSERT INTO outbox_relay_log (hi, lo, at) VALUES (?1, ?2, ?3);
