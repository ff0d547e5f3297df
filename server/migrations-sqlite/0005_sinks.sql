-- Sinks (ADR 0029): the target's configuration as JSON; NULL for a consumer served to streams.
ALTER TABLE outbox_consumers ADD COLUMN sink TEXT;
