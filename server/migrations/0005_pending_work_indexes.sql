-- Leasing a delivery with an ordering key checks that no earlier message with that key is still
-- waiting for a relay (another replica's pass may commit it late); this finds them directly.
CREATE INDEX messages_unrelayed_ordering ON outbox.messages (ordering_key, seq)
    WHERE relayed_at IS NULL AND ordering_key IS NOT NULL;

-- An idle stream asks when its consumer's next pending delivery falls due (min(available_at));
-- without this it would read every pending entry of the consumer.
CREATE INDEX deliveries_pending_due ON outbox.deliveries (consumer, available_at) WHERE state = 'pending';
