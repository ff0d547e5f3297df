-- What only releases before the previous one call (ADR 0087): a release supports a rolling
-- upgrade from the release before it, and no earlier one.
--  * `outbox.relay_pass`, the one-statement relay pass of the release before ADR 0067, and
--    `outbox.relay_consumers`, the consumers list of the claim before ADR 0078: the previous
--    release claims with `outbox.relay_claim` and `outbox.relay_consumers_since` and fans out
--    in the server;
--  * the views `outbox.pending_batches`, `outbox.lease_batches` and `outbox.ack_log` over
--    `outbox.delivery_ranges` (migration 0022), with the trigger function that inserted through
--    them, kept for the release before migration 0022.
DROP VIEW IF EXISTS outbox.pending_batches;
DROP VIEW IF EXISTS outbox.lease_batches;
DROP VIEW IF EXISTS outbox.ack_log;
DROP FUNCTION IF EXISTS outbox.delivery_ranges_insert_through_view();
DROP FUNCTION IF EXISTS outbox.relay_pass(integer, bigint, timestamptz, bigint, text, text[], text[], integer[],
                                          timestamptz[]);
DROP FUNCTION IF EXISTS outbox.relay_consumers(text[]);
