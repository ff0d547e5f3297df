-- Which consumers a database login may ack for with `outbox.ack` (ADR 0053). A member of
-- `outbox_consumer` acks only for the consumers bound to its login here: `consumer` is a name
-- or a pattern with `*` (any run of characters), as `consume:` permissions are written. The
-- schema's owner (outboxd's own login) and superusers need no binding. Managed by whoever
-- manages the roles:
--   INSERT INTO outbox.consumer_logins (login, consumer) VALUES ('billing_app', 'billing');
CREATE TABLE outbox.consumer_logins (
    login    name NOT NULL,
    consumer text NOT NULL CHECK (consumer ~ '^[A-Za-z0-9_.*-]+$'),
    PRIMARY KEY (login, consumer)
);
