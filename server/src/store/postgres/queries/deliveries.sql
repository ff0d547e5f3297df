-- name: delivery_insert_pending
INSERT INTO outbox.deliveries (message_id, consumer, seq, ordering_key, state, available_at, created_at, updated_at)
SELECT r.message_id, $1, r.seq, r.ordering_key, 'pending', r.available_at, $6, $6
  FROM unnest($2::uuid[], $3::bigint[], $4::text[], $5::timestamptz[])
       AS r(message_id, seq, ordering_key, available_at)
ON CONFLICT (message_id, consumer) DO NOTHING;

-- name: delivery_ack_batch
SELECT outbox.ack_batch($1, $2, $3);

-- name: delivery_ack_seqs
SELECT outbox.ack_seqs($1, $2, $3, $4);

-- name: delivery_ranges_to_rows
SELECT outbox.unbatch($1, $2, $3, $4);

-- name: delivery_release_rows
WITH r AS (
   SELECT * FROM unnest($1::text[], $2::uuid[], $3::text[], $4::timestamptz[], $5::text[], $9::bool[])
       AS r(consumer, message_id, state, available_at, last_error, withdrawn)),
-- Rows another transaction holds (a consumer's transactional ack in progress) are
-- skipped, never waited for: one slow consumer must not stall the sweeper.
locked AS (
   SELECT d.consumer, d.message_id FROM outbox.deliveries d JOIN r USING (consumer, message_id)
    WHERE d.state = 'leased'
      AND ($7::text IS NULL OR d.leased_by = $7)
      AND ($8::timestamptz IS NULL OR d.lease_expires_at <= $8)
    FOR UPDATE OF d SKIP LOCKED),
released AS (
UPDATE outbox.deliveries d
   SET state = r.state, available_at = r.available_at,
       last_error = coalesce(r.last_error, d.last_error),
       -- A withdrawn lease was no attempt: the one its lease counted goes back (ADR 0074).
       delivery_count = CASE WHEN r.withdrawn THEN greatest(d.delivery_count - 1, 0) ELSE d.delivery_count END,
       lease_expires_at = NULL, leased_by = NULL, updated_at = $6::timestamptz,
       dead_at = CASE WHEN r.state = 'dead' THEN $6::timestamptz END
  FROM r JOIN locked USING (consumer, message_id)
 WHERE d.consumer = r.consumer AND d.message_id = r.message_id
RETURNING d.consumer, d.message_id, d.seq, d.ordering_key, d.state),
-- A keyed delivery that dies holds its key if its consumer says so (ADR 0057), in
-- the same statement: no lease can see the dead row without the hold.
held AS (
INSERT INTO outbox.held_keys (consumer, ordering_key, message_id, seq, held_at)
SELECT x.consumer, x.ordering_key, x.message_id, x.seq, $6::timestamptz
  FROM released x JOIN outbox.consumers c ON c.name = x.consumer
 WHERE x.state = 'dead' AND x.ordering_key IS NOT NULL AND c.dead_key_policy = 'hold'
ON CONFLICT (consumer, ordering_key) DO NOTHING)
SELECT count(*) FROM released;

-- name: delivery_ranges_to_rows_expired
SELECT outbox.unbatch(NULL, NULL, NULL, $1);

-- name: delivery_expired_rows
SELECT d.consumer, d.message_id, d.delivery_count, c.max_deliveries, c.backoff_base_ms, c.backoff_max_ms
 FROM outbox.deliveries d JOIN outbox.consumers c ON c.name = d.consumer
WHERE d.state = 'leased' AND d.lease_expires_at <= $1
ORDER BY d.lease_expires_at LIMIT $2;

-- name: delivery_next_expiry
SELECT least((SELECT min(lease_expires_at) FROM outbox.deliveries WHERE state = 'leased'),
(SELECT min(lease_expires_at) FROM outbox.delivery_ranges WHERE state = 'leased'));

-- name: delivery_ranges_to_rows_to_extend
SELECT outbox.unbatch($1, $2, $3, NULL);

-- name: delivery_extend_rows
UPDATE outbox.deliveries SET lease_expires_at = $4, updated_at = $5
WHERE consumer = $1 AND message_id = ANY($2) AND state = 'leased' AND leased_by = $3;

-- name: dead_letter_groups
WITH g AS (
   SELECT d.last_error, count(*) AS n, min(d.dead_at) AS first, max(d.dead_at) AS last
     FROM outbox.deliveries d
    WHERE d.consumer = $1 AND d.state = 'dead'
    GROUP BY d.last_error
    ORDER BY n DESC, d.last_error NULLS LAST
    LIMIT $2)
SELECT g.*, s.topics, s.types
  FROM g CROSS JOIN LATERAL (
   SELECT coalesce((array_agg(DISTINCT m.topic ORDER BY m.topic))[1:$3], '{}') AS topics,
          coalesce((array_agg(DISTINCT m.type ORDER BY m.type))[1:$3], '{}') AS types
     FROM (SELECT d.message_id FROM outbox.deliveries d
            WHERE d.consumer = $1 AND d.state = 'dead' AND d.last_error = g.last_error
            ORDER BY d.seq LIMIT $4) x
     JOIN outbox.messages m ON m.message_id = x.message_id) s
 ORDER BY g.n DESC, g.last_error NULLS LAST;

-- name: delivery_list_of_message
-- Every consumer's delivery of message $1, wherever it is held: through `outbox.inbox`, the one
-- definition of "a row decides over a range" (migration 0022).
SELECT i.consumer, i.state, i.delivery_count, i.available_at, i.lease_expires_at, i.last_error,
       i.created_at, i.updated_at, i.acked_at, i.dead_at
  FROM outbox.inbox i WHERE i.message_id = $1
 ORDER BY i.consumer;

-- name: delivery_replay
WITH unheld AS (
   -- A key held by a dead message flows again once that message is due again: it
   -- is the key's head, so the key resumes with it, in order.
   DELETE FROM outbox.held_keys h WHERE h.consumer = $1 AND h.message_id = ANY($2)),
seen AS (
   -- A row for a message the relay has not read yet: the relay must find it there
   -- instead of pushing the message in a leased range (see migration 0013).
   UPDATE outbox.consumers c
      SET backfill_seq = greatest(c.backfill_seq, (SELECT max(m.seq) FROM outbox.messages m
                                                    WHERE m.message_id = ANY($2)))
    WHERE c.name = $1),
replayed AS (
INSERT INTO outbox.deliveries AS d (message_id, consumer, seq, ordering_key, state, available_at, created_at, updated_at)
SELECT m.message_id, $1, m.seq, m.ordering_key, 'pending', $3, $3, $3
  FROM outbox.messages m WHERE m.message_id = ANY($2)
   -- Held in a leased range with no row of its own: leased, left alone as leased
   -- rows are. With a row (acked in the consumer's transaction), the row decides.
   AND (NOT EXISTS (SELECT 1 FROM outbox.delivery_ranges b
                     WHERE b.consumer = $1 AND b.state = 'leased' AND b.seqs @> m.seq)
        OR EXISTS (SELECT 1 FROM outbox.deliveries x WHERE x.consumer = $1 AND x.message_id = m.message_id))
ON CONFLICT (message_id, consumer) DO UPDATE
   SET state = 'pending', delivery_count = 0, available_at = $3, last_error = NULL,
       acked_at = NULL, dead_at = NULL, updated_at = $3
 WHERE d.state <> 'leased'
RETURNING d.seq),
gone AS (SELECT coalesce(range_agg(int8range(r.seq, r.seq + 1)), '{}'::int8multirange) AS seqs FROM replayed r),
-- The replayed seqs leave every range: ranges they emptied go, the others lose them
-- (two sibling statements on disjoint rows).
ranges_gone AS (
   DELETE FROM outbox.delivery_ranges r USING gone g
    WHERE r.consumer = $1 AND r.span && range_merge(g.seqs) AND r.seqs && g.seqs AND r.seqs <@ g.seqs),
ranges_cut AS (
   UPDATE outbox.delivery_ranges r SET seqs = r.seqs - g.seqs FROM gone g
    WHERE r.consumer = $1 AND r.span && range_merge(g.seqs) AND r.seqs && g.seqs AND NOT r.seqs <@ g.seqs)
SELECT count(*) FROM replayed;

-- name: dead_letter_page
-- A page of consumer $1's dead letters in seq order after $2, at most $3, with last error $4
-- (any when NULL).
SELECT {{message_columns}}, d.consumer, d.delivery_count, d.last_error, d.dead_at
  FROM outbox.deliveries d JOIN outbox.messages m ON m.message_id = d.message_id
 WHERE d.consumer = $1 AND d.state = 'dead' AND d.seq > $2
   AND ($4::text IS NULL OR d.last_error = $4)
 ORDER BY d.seq LIMIT $3;

-- name: dead_letter_page_without_bodies
-- As `dead_letter_page`, without payloads and headers.
SELECT {{message_columns_without_bodies}}, d.consumer, d.delivery_count, d.last_error, d.dead_at
  FROM outbox.deliveries d JOIN outbox.messages m ON m.message_id = d.message_id
 WHERE d.consumer = $1 AND d.state = 'dead' AND d.seq > $2
   AND ($4::text IS NULL OR d.last_error = $4)
 ORDER BY d.seq LIMIT $3;

-- name: delivery_ranges_lock_holding
-- Locks consumer $1's ranges of state $4 that hold any seq of the runs [$2[i], $3[i]), in id
-- order. Run for pending, then leased ranges (the order of `outbox.ack_seqs`), each in a
-- snapshot of its own: a leased range that a lease wrote while the first waited is seen.
SELECT r.id FROM outbox.delivery_ranges r
 WHERE r.consumer = $1 AND r.state = $4
   AND r.seqs && (SELECT range_agg(int8range(x.lo, x.hi)) FROM unnest($2::int8[], $3::int8[]) x(lo, hi))
 ORDER BY r.id FOR UPDATE;

-- name: replay_candidates_dead
-- Consumer $1's dead letters after seq $2 that pass the filters (`replay_filters`), at most $8,
-- driven by the dead-letter index. Run unprepared, so that each is planned with its filters.
SELECT m.message_id, m.seq, m.topic, m.enqueued_at
  FROM outbox.deliveries d JOIN outbox.messages m ON m.message_id = d.message_id
 WHERE d.state = 'dead' AND d.consumer = $1 AND d.seq > $2
   {{replay_filters}}
 ORDER BY d.seq LIMIT $8;

-- name: replay_candidates_any
-- Consumer $1's messages after seq $2 that pass the filters (`replay_filters`) and are not
-- leased, at most $8: read through `outbox.inbox`, so that a seq held in a leased range without
-- a row is leased (not a candidate, as a leased row is not), a row decides for itself, and a seq
-- in a pending range is pending (a candidate, as a pending row is on SQLite; `delivery_replay`
-- takes it out of the range).
SELECT m.message_id, m.seq, m.topic, m.enqueued_at
  -- The row, for the filter on its last error.
  FROM outbox.messages m LEFT JOIN outbox.deliveries d ON d.message_id = m.message_id AND d.consumer = $1
 WHERE NOT EXISTS (SELECT 1 FROM outbox.inbox i
                    WHERE i.consumer = $1 AND i.message_id = m.message_id AND i.state = 'leased')
   AND m.seq > $2
   {{replay_filters}}
 ORDER BY m.seq LIMIT $8;

-- name: delivery_pending_page
-- A page of consumer $1's pending deliveries after seq $2, at most $3, in seq order: its
-- pending rows (`deliveries_pending`) and the seqs of its pending ranges that no row of its own
-- decides over. The ranges are cut at the cursor and taken in the order of their lowest seq,
-- at most $3 + 1 of them, and each of the first $3 sliced to its $3 lowest seqs: every range
-- left out starts at or above the lowest seq of the first one left out, and every seq a slice
-- left out lies above its range's slice, so the page looks no further than `upto`, the lower
-- of the two, below which every seq has been seen (rows may have taken some, which would
-- leave a page short); `upto` is where the next page starts when this one is short. It reads
-- the page and the consumer's pending ranges (by `delivery_ranges_pending_consumer`), at most
-- $3 of them sliced, each seq of the slices probed for a row (`deliveries_consumer_seq`) and
-- each seq of the page's messages by primary key (`OFFSET 0` keeps both probes per row, where
-- the planner, misled by the estimate of `generate_series`, would otherwise read every row of
-- the consumer, or every message, in one join), never the backlog's length. A row with a NULL
-- message_id only carries `reached` (an empty page).
WITH cut AS (
    SELECT g.seqs * int8multirange(int8range($2::int8 + 1, NULL)) AS seqs
      FROM outbox.delivery_ranges g
     WHERE g.consumer = $1 AND g.state = 'pending' AND upper(g.span) > $2::int8 + 1
),
firsts AS (
    SELECT c.seqs, lower(c.seqs) AS lowest FROM cut c WHERE NOT isempty(c.seqs)
     ORDER BY lower(c.seqs) LIMIT $3::int8 + 1
),
sliced AS (
    SELECT x.slice, CASE WHEN upper(x.slice) < upper(x.seqs) THEN upper(x.slice) - 1 END AS last
      FROM (SELECT f.seqs, outbox.multirange_slice(f.seqs, 0, $3::int8) AS slice
              FROM firsts f ORDER BY f.lowest LIMIT $3::int8) x
),
bound AS (
    SELECT least((SELECT min(s.last) FROM sliced s),
                 (SELECT CASE WHEN count(*) > $3::int8 THEN max(f.lowest) - 1 END FROM firsts f)) AS upto
),
ranged AS (
    SELECT q.seq
      FROM sliced s, LATERAL unnest(s.slice) r, LATERAL generate_series(lower(r), upper(r) - 1) q(seq)
     WHERE q.seq <= coalesce((SELECT b.upto FROM bound b), 9223372036854775807)
       AND NOT EXISTS (SELECT 1 FROM outbox.deliveries x
                        WHERE x.consumer = $1 AND x.seq = q.seq AND x.seq > 0 OFFSET 0)
),
page AS MATERIALIZED (
    SELECT p.* FROM (
        (SELECT d.seq, d.delivery_count, d.available_at, d.last_error
           FROM outbox.deliveries d
          WHERE d.consumer = $1 AND d.state = 'pending' AND d.seq > $2::int8
            AND d.seq <= coalesce((SELECT b.upto FROM bound b), 9223372036854775807)
          ORDER BY d.seq LIMIT $3::int8)
        UNION ALL
        SELECT r.seq, 0, NULL, NULL FROM ranged r) p
     ORDER BY p.seq LIMIT $3::int8
)
SELECT b.upto AS reached, x.*
  FROM bound b LEFT JOIN LATERAL (
      SELECT m.message_id, m.seq, m.topic, m.type, m.ordering_key, m.enqueued_at, 'pending' AS state,
             p.delivery_count, coalesce(p.available_at, m.available_at) AS available_at,
             NULL::timestamptz AS lease_expires_at, p.last_error
        FROM page p, LATERAL (SELECT * FROM outbox.messages o WHERE o.seq = p.seq OFFSET 0) m) x ON true
 ORDER BY x.seq;

-- name: delivery_leased_page
-- A page of consumer $1's leased deliveries after seq $2, at most $3, in seq order: its leased
-- rows and the seqs of its leased ranges that no row of its own decides over. Both are what
-- streams and sinks hold (the leased rows of every consumer by `deliveries_leased`, the
-- consumer's leased ranges by `delivery_ranges_leased_consumer`), never the history; each seq
-- of a range is probed for a row, and each of the page's messages read, by index, one by one
-- (`OFFSET 0`: see `delivery_pending_page`).
WITH held AS MATERIALIZED (
    SELECT d.seq, d.delivery_count, d.available_at, d.lease_expires_at, d.last_error
      FROM outbox.deliveries d
     WHERE d.consumer = $1 AND d.state = 'leased' AND d.seq > $2::int8
),
ranged AS (
    SELECT q.seq, g.lease_expires_at
      FROM outbox.delivery_ranges g,
           LATERAL unnest(g.seqs * int8multirange(int8range($2::int8 + 1, NULL))) r,
           LATERAL generate_series(lower(r), upper(r) - 1) q(seq)
     WHERE g.consumer = $1 AND g.state = 'leased' AND upper(g.span) > $2::int8 + 1
       AND NOT EXISTS (SELECT 1 FROM outbox.deliveries x
                        WHERE x.consumer = $1 AND x.seq = q.seq AND x.seq > 0 OFFSET 0)
),
page AS MATERIALIZED (
    SELECT p.* FROM (
        SELECT h.seq, h.delivery_count, h.available_at, h.lease_expires_at, h.last_error FROM held h
        UNION ALL
        SELECT r.seq, 1, NULL, r.lease_expires_at, NULL FROM ranged r) p
     ORDER BY p.seq LIMIT $3::int8
)
SELECT NULL::int8 AS reached, m.message_id, m.seq, m.topic, m.type, m.ordering_key, m.enqueued_at,
       'leased' AS state, p.delivery_count, coalesce(p.available_at, m.available_at) AS available_at,
       p.lease_expires_at, p.last_error
  FROM page p, LATERAL (SELECT * FROM outbox.messages o WHERE o.seq = p.seq OFFSET 0) m
 ORDER BY p.seq;

-- name: delivery_retrying_page
-- A page of consumer $1's retries (pending rows with a delivery count: a retry always has a
-- row) after seq $2, at most $3, in seq order, among at most $4 of its pending rows read by
-- `deliveries_pending`; `reached`, the last seq read when it read $4, is where the next page
-- starts if this one is short. Each of the page's messages is read by primary key
-- (`OFFSET 0`: see `delivery_pending_page`). A row with a NULL message_id only carries
-- `reached`.
WITH w AS MATERIALIZED (
    SELECT d.seq, d.delivery_count, d.available_at, d.last_error
      FROM outbox.deliveries d
     WHERE d.consumer = $1 AND d.state = 'pending' AND d.seq > $2::int8
     ORDER BY d.seq LIMIT $4::int8
),
reach AS (
    SELECT CASE WHEN count(*) >= $4::int8 THEN max(w.seq) END AS reached FROM w
),
page AS MATERIALIZED (
    SELECT w.* FROM w WHERE w.delivery_count > 0 ORDER BY w.seq LIMIT $3::int8
)
SELECT r.reached, x.*
  FROM reach r LEFT JOIN LATERAL (
      SELECT m.message_id, m.seq, m.topic, m.type, m.ordering_key, m.enqueued_at, 'pending' AS state,
             p.delivery_count, p.available_at, NULL::timestamptz AS lease_expires_at, p.last_error
        FROM page p, LATERAL (SELECT * FROM outbox.messages o WHERE o.seq = p.seq OFFSET 0) m) x ON true
 ORDER BY x.seq;
