-- Sinks (ADR 0029): a consumer that outboxd delivers itself, to a broker or a webhook. The
-- target's configuration, secrets included (outboxd needs them to connect), as JSON; NULL for a
-- consumer served to Subscribe streams. Only outboxd reads this table: the producer and consumer
-- roles (migration 0009) reach it through no function.
ALTER TABLE outbox.consumers ADD COLUMN sink jsonb;
