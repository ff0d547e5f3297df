-- The SQL functions that only releases before the last one called (functions revision 7 and
-- earlier): `outbox.lease_pending_seqs`, `outbox.lease_pending` and the five-argument
-- `outbox.ack_batch`. The release before this one (revision 8) calls none of them, so its
-- replicas keep working through a rolling upgrade; server/sql/functions.sql defines them no more.
DROP FUNCTION IF EXISTS outbox.lease_pending(text, timestamptz, integer, timestamptz, text);
DROP FUNCTION IF EXISTS outbox.lease_pending_seqs(text, timestamptz, integer, timestamptz, text);
DROP FUNCTION IF EXISTS outbox.ack_batch(text, uuid[], bigint[], bigint[], timestamptz);
