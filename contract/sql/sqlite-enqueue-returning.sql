-- The enqueue of sqlite-enqueue.sql in one statement that also answers the message's seq and
-- whether it was a duplicate (SQLite 3.35 and later; outbox-client, whose SQLite is bundled). On
-- a duplicate message_id the no-op DO UPDATE makes RETURNING give the existing row, whose
-- enqueued_at is not this call's: that is how a duplicate is told apart.
-- parameters: message_id, topic, type, payload, headers, ordering_key, enqueued_at, available_at
INSERT INTO outbox_messages (message_id, topic, type, payload, headers, ordering_key, enqueued_at, available_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
ON CONFLICT (message_id) DO UPDATE SET message_id = excluded.message_id
RETURNING seq, enqueued_at
