-- Enqueue as the schema's owner, by a plain INSERT (a quarter cheaper than outbox.enqueue;
-- outbox-client). On a duplicate message_id the no-op DO UPDATE returns the existing row, even
-- one a concurrent transaction committed after this statement began; xmax tells the two apart,
-- and `differs` says the id names another message.
-- parameters: message_id, topic, type, payload, headers, ordering_key, delay_ms
INSERT INTO outbox.messages (message_id, topic, type, payload, headers, ordering_key, enqueued_at, available_at)
VALUES ($1, $2, $3, $4, $5, nullif($6, ''), now(), now() + coalesce($7, 0) * interval '1 millisecond')
ON CONFLICT (message_id) DO UPDATE SET type = outbox.messages.type
RETURNING seq, xmax <> 0 AS is_duplicate,
          xmax <> 0 AND (topic <> $2 OR type <> $3 OR payload <> $4) AS differs
