-- Enqueue in the caller's transaction on PostgreSQL, through the function outboxd's migrations
-- install (any login with the outbox_producer role). Answers the message's id.
-- parameters: topic, type, payload, headers, message_id, ordering_key
SELECT outbox.enqueue($1::text, $2::text, $3::bytea, $4::jsonb, $5::uuid, $6::text) AS message_id
