-- Who created each consumer (ADR 0072): the principal of the auth file in force when it was
-- created, NULL when it was created without an auth file or before this migration. Deleting,
-- pausing or resuming a consumer is its creator's, or that of a principal that may consume it
-- (`consume:NAME`, `*`): one principal cannot redirect another's stream.
ALTER TABLE outbox.consumers ADD COLUMN created_by text;
