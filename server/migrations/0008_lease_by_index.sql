-- Leases that cost what they return, whatever the backlog behind them (ADR 0016).
--
-- A lease takes unkeyed deliveries in due order from their own index, and for ordering keys
-- visits only the head of each key (the lowest unfinished seq), skipping from key to key through
-- the index instead of reading every message blocked behind a head.

-- Unkeyed due work, read in (available_at, seq) order and stopped after the batch.
CREATE INDEX deliveries_due_unkeyed ON outbox.deliveries (consumer, available_at, seq)
    WHERE state = 'pending' AND ordering_key IS NULL;
-- Replaced by the one above (it held the keyed rows too, which a lease must not read one by one).
DROP INDEX outbox.deliveries_pending_due;

-- Key heads: the first entry of each (consumer, ordering_key) is that key's head. Byte order
-- ("C"), so that the server's key cursor (which key a lease starts from, for fairness between
-- keys) compares keys exactly as the index does.
CREATE INDEX deliveries_key_heads ON outbox.deliveries (consumer, ordering_key COLLATE "C", seq)
    WHERE ordering_key IS NOT NULL AND state IN ('pending', 'leased');
DROP INDEX outbox.deliveries_ordering;

-- Is any delivery of this key in flight? (A replayed earlier message can be pending while a later
-- one is leased.) Holds only the leased keyed rows, so it stays small.
CREATE INDEX deliveries_keyed_leased ON outbox.deliveries (consumer, ordering_key COLLATE "C")
    WHERE state = 'leased' AND ordering_key IS NOT NULL;
