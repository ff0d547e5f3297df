-- The topic rule, enforced by the table for every writer: the Rust client inserts directly
-- (outbox.enqueue checks the same in PL/pgSQL). NOT VALID: rows written before were checked by
-- outbox.enqueue already, and validating would scan the whole table.
ALTER TABLE outbox.messages
    ADD CONSTRAINT messages_topic_format
    CHECK (length(topic) <= 255 AND topic ~ '^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$') NOT VALID;
