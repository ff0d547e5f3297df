-- Dead letters by last error: PostgreSQL's migration 0021.
CREATE INDEX outbox_deliveries_dead_errors ON outbox_deliveries (consumer, last_error, seq, dead_at)
    WHERE state = 'dead';
-- A consumer's leased deliveries, counted for its stats without reading its history.
CREATE INDEX outbox_deliveries_leased_by_consumer ON outbox_deliveries (consumer, seq) WHERE state = 'leased';
