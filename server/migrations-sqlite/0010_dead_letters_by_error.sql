-- Dead letters by last error: PostgreSQL's migration 0021.
CREATE INDEX outbox_deliveries_dead_errors ON outbox_deliveries (consumer, last_error, seq, dead_at)
    WHERE state = 'dead';
