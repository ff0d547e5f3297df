-- Settings that every writer of the file is held to, written by outboxd at start-up from its
-- flags (ADR 0053): the payload limit of the Enqueue RPC (--max-payload-bytes) holds for the
-- documented insert too, as on PostgreSQL's `outbox.enqueue`. One row.
CREATE TABLE outbox_settings (
    id                INTEGER PRIMARY KEY CHECK (id = 1),
    max_payload_bytes INTEGER NOT NULL DEFAULT 1048576 CHECK (max_payload_bytes > 0)
);
INSERT INTO outbox_settings (id) VALUES (1);

CREATE TRIGGER outbox_messages_payload_limit BEFORE INSERT ON outbox_messages
BEGIN
    SELECT RAISE(ABORT, 'outbox_messages: payload is longer than the limit of --max-payload-bytes')
     WHERE length(CAST(NEW.payload AS BLOB)) > (SELECT s.max_payload_bytes FROM outbox_settings s WHERE s.id = 1);
END;
