-- The transactional ack on PostgreSQL, in the transaction of the effect (any login with the
-- outbox_consumer role, bound to the consumer). Answers whether this call acked the delivery.
-- parameters: consumer, message_id
SELECT outbox.ack($1::text, $2::uuid) AS acked
