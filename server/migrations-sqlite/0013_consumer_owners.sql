-- Who created each consumer (ADR 0072): the same column as PostgreSQL's migration 0024.
ALTER TABLE outbox_consumers ADD COLUMN created_by TEXT;
