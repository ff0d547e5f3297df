-- The statements of one relay pass, in one transaction on the relay's pool (ADR 0067): the
-- claim with the consumers, what rows are there already, then the writes of the plan that
-- `domain::fanout` made.

-- name: relay_claim
-- The messages the pass claims (`outbox.relay_claim`), in seq order; the payload (only pushed
-- deliveries carry it) for the first $4, the room the streams offered (`with_payload`). The
-- first row also carries the consumers' version, the consumers when it is not $5 (the version
-- the relay holds them at), and the backfills that reach the pass's first seq
-- (`outbox.relay_consumers_since`, read under the locks the claim took, ADR 0078), for the
-- pass to match in Rust (`domain::topic_matches`, as on SQLite);
-- matching in SQL called a PL/pgSQL function per consumer and topic (5 ms a pass with 1,000
-- consumers, ADR 0071).
WITH c AS MATERIALIZED (
    SELECT x.*, row_number() OVER (ORDER BY x.seq) AS n FROM outbox.relay_claim($1, $2, $3) x
)
SELECT c.message_id, c.seq, c.topic, c.type, CASE WHEN c.n <= $4 THEN c.payload ELSE ''::bytea END AS payload,
       c.n <= $4 AS with_payload, c.headers, c.ordering_key, c.enqueued_at, c.available_at,
       $2::timestamptz AS relayed_at,
       CASE WHEN c.n = 1 THEN outbox.relay_consumers_since($5::uuid, (SELECT min(c2.seq) FROM c c2)) END AS consumers
  FROM c
 ORDER BY c.seq;

-- name: relay_payloads
-- The payloads of the pushed messages that the claim did not bring.
SELECT m.seq, m.payload FROM outbox.messages m WHERE m.seq = ANY ($1::int8[]);

-- name: relay_turn_take
-- The relays' turn (`outbox.relay_claim` takes it too), until the transaction ends: a replay
-- waits for a pass that may have claimed its messages to commit.
SELECT pg_advisory_xact_lock(1869903970, 1);

-- name: relay_rows_of
-- Of the (consumer, message) pairs given, those with a row already (written by an EARLIEST
-- consumer's backfill): the row decides, the pass writes nothing for them.
SELECT p.consumer, p.message_id
  FROM unnest($1::text[], $2::uuid[]) AS p(consumer, message_id)
 WHERE EXISTS (SELECT 1 FROM outbox.deliveries d WHERE d.message_id = p.message_id AND d.consumer = p.consumer);

-- name: relay_insert_ranges
-- One range per element: leased to `session` until `until` when it has a session, else pending.
-- `seqs` is an int8multirange in its text form.
INSERT INTO outbox.delivery_ranges (consumer, state, seqs, span, leased_by, lease_expires_at, at)
SELECT r.consumer, CASE WHEN r.session IS NULL THEN 'pending' ELSE 'leased' END,
       r.seqs::int8multirange, range_merge(r.seqs::int8multirange), r.session, r.until, $5
  FROM unnest($1::text[], $2::text[], $3::timestamptz[], $4::text[]) AS r(consumer, session, until, seqs);

-- name: relay_insert_rows
-- A pending row (count 0) per (consumer, seq); a row already there stays as it is. Returns the
-- consumer of each row written.
INSERT INTO outbox.deliveries AS d (message_id, consumer, seq, ordering_key, state, delivery_count,
                                    available_at, created_at, updated_at)
SELECT m.message_id, r.consumer, m.seq, m.ordering_key, 'pending', 0, m.available_at, $3, $3
  FROM unnest($1::text[], $2::int8[]) AS r(consumer, seq)
  JOIN outbox.messages m ON m.seq = r.seq
ON CONFLICT ON CONSTRAINT deliveries_pkey DO NOTHING
RETURNING d.consumer;

-- name: relay_notify
-- Wakes the streams of other replicas: the consumers that got waiting deliveries ($1, comma
-- separated; empty for every consumer), on the work channel of this database's key.
-- Not into a queue that a stuck listener has half filled (see `outbox.wake_relay`): when it is
-- full, the pass's commit would fail; the streams' fallback polls find the work instead.
SELECT pg_notify('outbox_work_' || s.channel_key, $1) FROM outbox.settings s
 WHERE pg_notification_queue_usage() < 0.5;

