-- Dead letters by last error (the console's groups, ADR 0059; a replay of one group): counted,
-- dated and paged in seq order from this index alone, whatever the consumer's history. Partial:
-- only dead rows, so it costs nothing on the delivery path.
CREATE INDEX deliveries_dead_errors ON outbox.deliveries (consumer, last_error, seq) INCLUDE (dead_at)
    WHERE state = 'dead';
