-- Leases that cost what they return, whatever the backlog behind them (ADR 0016): unkeyed due
-- work in (available_at, seq) order from its own index, and for ordering keys only the head of
-- each key, found through outbox_deliveries_ordering one key at a time.
CREATE INDEX outbox_deliveries_due_unkeyed ON outbox_deliveries (consumer, available_at, seq)
    WHERE state = 'pending' AND ordering_key IS NULL;
-- Is any delivery of this key in flight? Holds only the leased keyed rows.
CREATE INDEX outbox_deliveries_keyed_leased ON outbox_deliveries (consumer, ordering_key)
    WHERE state = 'leased' AND ordering_key IS NOT NULL;
