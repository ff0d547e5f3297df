-- A lease and the next-due read: one index probe per ordering key (ADR 0016).

-- fragment: key_heads
-- The heads of a consumer's ordering keys (the lowest unfinished seq of each key), visited key
-- by key through `deliveries_key_heads`: one index probe per key, never the messages queued
-- behind a head. `after_heads` takes the keys after the session's key cursor, then
-- `before_heads` wraps around to the rest, so that a lease starts where the last one stopped
-- and no key waits behind keys that sort before it.
after_heads(k, seq, message_id, state, available_at) AS (
    (SELECT d.ordering_key COLLATE "C", d.seq, d.message_id, d.state, d.available_at
       FROM outbox.deliveries d
      WHERE d.consumer = $1 AND d.ordering_key IS NOT NULL AND d.state IN ('pending', 'leased')
        AND d.ordering_key COLLATE "C" > {after}
      ORDER BY d.ordering_key COLLATE "C", d.seq LIMIT 1)
    UNION ALL
    SELECT n.* FROM after_heads h CROSS JOIN LATERAL (
        SELECT d.ordering_key COLLATE "C", d.seq, d.message_id, d.state, d.available_at
          FROM outbox.deliveries d
         WHERE d.consumer = $1 AND d.ordering_key IS NOT NULL AND d.state IN ('pending', 'leased')
           AND d.ordering_key COLLATE "C" > h.k
         ORDER BY d.ordering_key COLLATE "C", d.seq LIMIT 1) n
),
before_heads(k, seq, message_id, state, available_at) AS (
    (SELECT d.ordering_key COLLATE "C", d.seq, d.message_id, d.state, d.available_at
       FROM outbox.deliveries d
      WHERE d.consumer = $1 AND d.ordering_key IS NOT NULL AND d.state IN ('pending', 'leased')
        AND d.ordering_key COLLATE "C" <= {after}
      ORDER BY d.ordering_key COLLATE "C", d.seq LIMIT 1)
    UNION ALL
    SELECT n.* FROM before_heads h CROSS JOIN LATERAL (
        SELECT d.ordering_key COLLATE "C", d.seq, d.message_id, d.state, d.available_at
          FROM outbox.deliveries d
         WHERE d.consumer = $1 AND d.ordering_key IS NOT NULL AND d.state IN ('pending', 'leased')
           AND d.ordering_key COLLATE "C" > h.k AND d.ordering_key COLLATE "C" <= {after}
         ORDER BY d.ordering_key COLLATE "C", d.seq LIMIT 1) n
)

-- name: delivery_lease
-- One lease, in one statement whose cost follows what it returns, not the backlog
-- (ADR 0016): unkeyed due deliveries in due order from `deliveries_due_unkeyed`, stopped after
-- `$3`; the heads of ordering keys (see `key_heads`) that are pending, due, have nothing
-- of their key in flight and no earlier message of their key still unrelayed (another
-- replica's relay pass may commit it late), stopped after `$3`; of both, the `$3` lowest seqs,
-- locked (skipping rows other sessions hold) and leased; then, for the room left, the lowest
-- seqs of the consumer's pending ranges that the statement can see
-- (`outbox.lease_pending_visible`, ADR 0042, 0048, 0056), in the same round trip.
WITH RECURSIVE {{key_heads after=$6}},
ready_heads AS (
    SELECT h.message_id FROM (SELECT * FROM after_heads UNION ALL SELECT * FROM before_heads) h
     WHERE h.state = 'pending' AND h.available_at <= $2
       -- Scalar subqueries, not EXISTS: PostgreSQL never turns them into a join that reads
       -- every row of the other side; each is one probe per head.
       AND (SELECT 1 FROM outbox.deliveries l
             WHERE l.consumer = $1 AND l.state = 'leased' AND l.ordering_key IS NOT NULL
               AND l.ordering_key COLLATE "C" = h.k
             LIMIT 1) IS NULL
       -- A key held after a dead letter (dead_key_policy 'hold'): one primary-key probe,
       -- whatever waits behind it.
       AND (SELECT 1 FROM outbox.held_keys q WHERE q.consumer = $1 AND q.ordering_key = h.k) IS NULL
       -- An earlier message of the key that the relay has not read can only sit in an
       -- open gap of the relay cursor (the head itself was read): few, short ranges, read by
       -- primary key.
       AND (SELECT 1 FROM outbox.relay_gaps g, unnest(g.seqs) r,
                   -- LIMIT keeps it a probe per gap range (a range scan of the primary
                   -- key), never a join the planner could answer by scanning messages.
                   LATERAL (SELECT 1 FROM outbox.messages u
                             WHERE u.seq >= lower(r) AND u.seq < least(upper(r), h.seq)
                               AND u.ordering_key = h.k COLLATE "default"
                             LIMIT 1) u
             LIMIT 1) IS NULL
     LIMIT $3
),
unkeyed AS (
    -- Locked as it is read, skipping rows other sessions hold, so that streams leasing at
    -- the same moment take the next rows instead of all reading, then missing, the same.
    SELECT d.message_id FROM outbox.deliveries d
     WHERE d.consumer = $1 AND d.state = 'pending' AND d.ordering_key IS NULL AND d.available_at <= $2
     ORDER BY d.available_at, d.seq
     LIMIT $3
     FOR UPDATE SKIP LOCKED
),
cand AS (
    -- An array of at most 2 x $3 ids, looked up by primary key: never a join or a state
    -- predicate that the planner could answer with a scan of the consumer's pending
    -- deliveries. The state is checked by the UPDATE, on the row version it locked.
    SELECT d.message_id FROM outbox.deliveries d
     WHERE d.consumer = $1
       AND d.message_id = ANY (ARRAY(SELECT message_id FROM unkeyed UNION ALL SELECT message_id FROM ready_heads))
       AND EXISTS (SELECT 1 FROM outbox.consumers p WHERE p.name = $1 AND NOT p.paused)
     ORDER BY d.seq
     LIMIT $3
     FOR UPDATE OF d SKIP LOCKED
),
updated AS (
-- The ids as an array again, and the messages below by an array too: with no join to
-- order, a plan cached while the tables were empty (every estimate one row) cannot drive
-- this from a scan of the consumer's deliveries or of the messages.
UPDATE outbox.deliveries d
   SET state = 'leased', delivery_count = d.delivery_count + 1,
       lease_expires_at = $4, leased_by = $5, updated_at = $2
 WHERE d.consumer = $1 AND d.message_id = ANY (ARRAY(SELECT message_id FROM cand))
   -- "pending", written so that it does not match deliveries_pending's predicate: the
   -- planner must find these rows by primary key, not by scanning every pending one.
   AND d.state NOT IN ('leased', 'acked', 'dead')
RETURNING d.message_id, d.delivery_count
),
leased AS (
SELECT m.message_id, m.seq, m.topic, m.type, m.payload, m.headers, m.ordering_key,
       m.enqueued_at, m.available_at, m.relayed_at, u.delivery_count
  FROM outbox.messages m JOIN updated u ON u.message_id = m.message_id
 WHERE m.message_id = ANY (ARRAY(SELECT message_id FROM updated))
)
SELECT * FROM leased
UNION ALL
-- Range-held deliveries: the function moves seqs from pending ranges into a leased range;
-- their messages are read here, once, by primary key range (ADR 0048). Only from the
-- ranges this statement can see: their messages are visible to it too (ADR 0056).
SELECT m.message_id, m.seq, m.topic, m.type, m.payload, m.headers, m.ordering_key,
       m.enqueued_at, m.available_at, m.relayed_at, 1
  FROM unnest(outbox.lease_pending_visible($1, $2, ($3 - (SELECT count(*) FROM leased))::integer, $4, $5,
              ARRAY(SELECT b.id FROM outbox.delivery_ranges b WHERE b.consumer = $1 AND b.state = 'pending'))) r,
       LATERAL (SELECT * FROM outbox.messages m WHERE m.seq >= lower(r) AND m.seq < upper(r) OFFSET 0) m;

-- name: delivery_next_due
-- When the consumer's next pending delivery falls due: the first unkeyed one in due order, the
-- oldest pending range (due since it was written), or the earliest pending key head (one probe
-- per key). `present` is false once it is deleted.
WITH RECURSIVE {{key_heads after=''}}
SELECT EXISTS (SELECT 1 FROM outbox.consumers WHERE name = $1) AS present,
       LEAST(
           (SELECT d.available_at FROM outbox.deliveries d
             WHERE d.consumer = $1 AND d.state = 'pending' AND d.ordering_key IS NULL
             ORDER BY d.available_at, d.seq LIMIT 1),
           (SELECT b.at FROM outbox.delivery_ranges b WHERE b.consumer = $1 AND b.state = 'pending' ORDER BY b.id LIMIT 1),
           (SELECT min(h.available_at) FROM after_heads h WHERE h.state = 'pending')) AS due;
