-- name: delivery_insert_many
INSERT INTO outbox_deliveries (message_id, consumer, seq, ordering_key, state, delivery_count, available_at,
                               lease_expires_at, leased_by, created_at, updated_at)
SELECT json_extract(value, '$.m'), json_extract(value, '$.c'), json_extract(value, '$.s'),
       json_extract(value, '$.k'),
       CASE WHEN json_extract(value, '$.l') IS NULL THEN 'pending' ELSE 'leased' END,
       CASE WHEN json_extract(value, '$.l') IS NULL THEN 0 ELSE 1 END,
       json_extract(value, '$.a'), json_extract(value, '$.u'), json_extract(value, '$.l'), ?2, ?2
  FROM json_each(?1) WHERE true
ON CONFLICT (message_id, consumer) DO NOTHING
RETURNING message_id, consumer, leased_by, lease_expires_at;

-- name: delivery_insert_pending
INSERT INTO outbox_deliveries (message_id, consumer, seq, ordering_key, state, available_at, created_at, updated_at)
SELECT json_extract(value, '$.m'), ?1, json_extract(value, '$.s'),
       json_extract(value, '$.k'), 'pending', json_extract(value, '$.a'), ?3, ?3
  FROM json_each(?2) WHERE true
ON CONFLICT (message_id, consumer) DO NOTHING;

-- name: delivery_lease_rows
UPDATE outbox_deliveries
   SET state = 'leased', delivery_count = delivery_count + 1,
       lease_expires_at = ?4, leased_by = ?5, updated_at = ?2
 WHERE consumer = ?1 AND message_id IN (
   SELECT c.message_id FROM (
       SELECT u.message_id, u.seq FROM (
           SELECT d.message_id, d.seq FROM outbox_deliveries d INDEXED BY outbox_deliveries_due_unkeyed
            WHERE d.consumer = ?1 AND d.state = 'pending' AND d.ordering_key IS NULL
              AND d.available_at <= ?2
            ORDER BY d.available_at, d.seq LIMIT ?3) u
       UNION ALL
       SELECT d.message_id, d.seq FROM outbox_deliveries d
        WHERE d.consumer = ?1 AND d.message_id IN (SELECT value FROM json_each(?6))) c
    WHERE EXISTS (SELECT 1 FROM outbox_consumers p WHERE p.name = ?1 AND p.paused = 0)
    ORDER BY c.seq LIMIT ?3)
RETURNING message_id, delivery_count;

-- name: delivery_ack_many
-- A stream's ack of consumer ?1's deliveries of the JSON array ?2 of ids at ?3: one write
-- transaction, sent at once (ADR 0070; the caller rolls back what an error left open). First
-- the deliveries that stay rows are marked acked: every one but those `ack_foldable` says go
-- to a range (one it cannot tell, NULL, stays a row). The leased ones left of the ack are then
-- exactly those: they become acked ranges, one per run of consecutive seqs (a seq minus its
-- rank is the same along a run), and their rows go. Returns a row for each delivery acked. Each delivery is found by its primary
-- key from the ids (`CROSS JOIN` keeps that order, where the planner may pick the consumer's
-- leased index and read every lease of the consumer).
BEGIN IMMEDIATE;
UPDATE outbox_deliveries AS d
   SET state = 'acked', acked_at = ?3, updated_at = ?3, lease_expires_at = NULL, leased_by = NULL
 WHERE d.consumer = ?1 AND d.message_id IN (SELECT value FROM json_each(?2)) AND d.state IN ('leased', 'pending')
   AND NOT coalesce(({{ack_foldable}}), 0)
RETURNING 1;
INSERT INTO outbox_acked_ranges (consumer, lo, hi, at)
SELECT ?1, min(f.seq), max(f.seq) + 1, ?3 FROM (
    SELECT d.seq, d.seq - row_number() OVER (ORDER BY d.seq) AS run
      FROM (SELECT DISTINCT value FROM json_each(?2)) j
      CROSS JOIN outbox_deliveries d ON d.message_id = j.value AND d.consumer = ?1
     WHERE d.state = 'leased') f
 GROUP BY f.run;
DELETE FROM outbox_deliveries
 WHERE consumer = ?1 AND message_id IN (SELECT value FROM json_each(?2)) AND state = 'leased'
RETURNING 1;
COMMIT;

-- name: delivery_release_rows
UPDATE outbox_deliveries
   SET state = r.state, available_at = r.available_at,
       last_error = coalesce(r.last_error, outbox_deliveries.last_error),
       -- A withdrawn lease was no attempt: the one its lease counted goes back (ADR 0074).
       delivery_count = CASE WHEN r.withdrawn THEN max(outbox_deliveries.delivery_count - 1, 0)
                             ELSE outbox_deliveries.delivery_count END,
       lease_expires_at = NULL, leased_by = NULL, updated_at = ?2,
       dead_at = CASE WHEN r.state = 'dead' THEN ?2 END
  FROM (SELECT json_extract(value, '$.c') AS consumer, json_extract(value, '$.m') AS message_id,
               json_extract(value, '$.s') AS state, json_extract(value, '$.a') AS available_at,
               json_extract(value, '$.e') AS last_error, json_extract(value, '$.w') AS withdrawn
          FROM json_each(?1)) AS r
 WHERE outbox_deliveries.consumer = r.consumer AND outbox_deliveries.message_id = r.message_id
   AND outbox_deliveries.state = 'leased'
   AND (?3 IS NULL OR outbox_deliveries.leased_by = ?3)
   AND (?4 IS NULL OR outbox_deliveries.lease_expires_at <= ?4)
RETURNING consumer, message_id, seq, ordering_key, state;

-- name: delivery_expired_rows
SELECT d.consumer, d.message_id, d.delivery_count, c.max_deliveries, c.backoff_base_ms, c.backoff_max_ms
 FROM outbox_deliveries d JOIN outbox_consumers c ON c.name = d.consumer
WHERE d.state = 'leased' AND d.lease_expires_at <= ?1
ORDER BY d.lease_expires_at LIMIT ?2;

-- name: delivery_next_expiry
SELECT min(lease_expires_at) FROM outbox_deliveries WHERE state = 'leased';

-- name: delivery_extend_rows
UPDATE outbox_deliveries SET lease_expires_at = ?4, updated_at = ?5
WHERE consumer = ?1 AND message_id IN (SELECT value FROM json_each(?2))
  AND state = 'leased' AND leased_by = ?3;

-- name: delivery_next_due
SELECT EXISTS (SELECT 1 FROM outbox_consumers WHERE name = ?1) AS present,
(SELECT min(available_at) FROM outbox_deliveries WHERE consumer = ?1 AND state = 'pending') AS due;

-- name: delivery_list_of_message
-- Through `outbox_inbox`, the one definition of where a delivery is held.
SELECT * FROM outbox_inbox WHERE message_id = ?1 ORDER BY consumer;

-- name: delivery_replay
INSERT INTO outbox_deliveries (message_id, consumer, seq, ordering_key, state, available_at, created_at, updated_at)
SELECT m.message_id, ?1, m.seq, m.ordering_key, 'pending', ?3, ?3, ?3
  FROM outbox_messages m WHERE m.message_id IN (SELECT value FROM json_each(?2))
ON CONFLICT (message_id, consumer) DO UPDATE
   SET state = 'pending', delivery_count = 0, available_at = ?3, last_error = NULL,
       acked_at = NULL, dead_at = NULL, updated_at = ?3
 WHERE outbox_deliveries.state <> 'leased';

-- name: dead_letter_groups
WITH g AS (
   SELECT d.last_error, count(*) AS n, min(d.dead_at) AS first, max(d.dead_at) AS last
     FROM outbox_deliveries d
    WHERE d.consumer = ?1 AND d.state = 'dead'
    GROUP BY d.last_error
    ORDER BY n DESC, d.last_error IS NULL, d.last_error
    LIMIT ?2)
SELECT g.*,
       (SELECT json_group_array(DISTINCT m.topic) FROM
           (SELECT d.message_id FROM outbox_deliveries d
             WHERE d.consumer = ?1 AND d.state = 'dead' AND d.last_error = g.last_error
             ORDER BY d.seq LIMIT ?3) x JOIN outbox_messages m ON m.message_id = x.message_id) AS topics,
       (SELECT json_group_array(DISTINCT m.type) FROM
           (SELECT d.message_id FROM outbox_deliveries d
             WHERE d.consumer = ?1 AND d.state = 'dead' AND d.last_error = g.last_error
             ORDER BY d.seq LIMIT ?3) x JOIN outbox_messages m ON m.message_id = x.message_id) AS types
  FROM g
 ORDER BY g.n DESC, g.last_error IS NULL, g.last_error;

-- name: key_held_or_blocked
SELECT EXISTS (SELECT 1 FROM outbox_deliveries l INDEXED BY outbox_deliveries_keyed_leased
            WHERE l.consumer = ?1 AND l.state = 'leased' AND l.ordering_key IS NOT NULL
              AND l.ordering_key = ?2)
-- An earlier message of the key that the relay has not read yet (a backfill's row can come
-- before the relay).
OR EXISTS (SELECT 1 FROM outbox_messages u INDEXED BY outbox_messages_keyed
            WHERE u.ordering_key IS NOT NULL AND u.ordering_key = ?2 AND u.seq < ?3
              AND u.seq > (SELECT c.position FROM outbox_relay_cursor c WHERE c.id = 1))
-- Held after a dead letter (ADR 0057): one primary-key probe.
OR EXISTS (SELECT 1 FROM outbox_held_keys h WHERE h.consumer = ?1 AND h.ordering_key = ?2);

-- name: dead_letter_page
-- A page of consumer ?1's dead letters in seq order after ?2, at most ?3, with last error ?4
-- (any when NULL).
SELECT {{message_columns}}, d.consumer, d.delivery_count, d.last_error, d.dead_at
  FROM outbox_deliveries d JOIN outbox_messages m ON m.message_id = d.message_id
 WHERE d.consumer = ?1 AND d.state = 'dead' AND d.seq > ?2
   AND (?4 IS NULL OR d.last_error = ?4)
 ORDER BY d.seq LIMIT ?3;

-- name: dead_letter_page_without_bodies
-- As `dead_letter_page`, without payloads and headers.
SELECT {{message_columns_without_bodies}}, d.consumer, d.delivery_count, d.last_error, d.dead_at
  FROM outbox_deliveries d JOIN outbox_messages m ON m.message_id = d.message_id
 WHERE d.consumer = ?1 AND d.state = 'dead' AND d.seq > ?2
   AND (?4 IS NULL OR d.last_error = ?4)
 ORDER BY d.seq LIMIT ?3;

-- name: key_head_after
-- The first key head after ?2.
{{key_head}}
   AND d.ordering_key > ?2
 ORDER BY d.ordering_key, d.seq LIMIT 1;

-- name: key_head_up_to
-- The first key head up to ?3.
{{key_head}}
   AND d.ordering_key <= ?3
 ORDER BY d.ordering_key, d.seq LIMIT 1;

-- name: key_head_between
-- The first key head after ?2 and up to ?3.
{{key_head}}
   AND d.ordering_key > ?2 AND d.ordering_key <= ?3
 ORDER BY d.ordering_key, d.seq LIMIT 1;

-- name: replay_candidates_dead
-- Consumer ?1's dead letters after seq ?2 that pass the filters (`replay_filters`), at most ?8.
SELECT m.message_id, m.seq, m.topic, m.enqueued_at
  FROM outbox_deliveries d JOIN outbox_messages m ON m.message_id = d.message_id
 WHERE d.state = 'dead' AND d.consumer = ?1 AND d.seq > ?2
   {{replay_filters}}
 ORDER BY d.seq LIMIT ?8;

-- name: replay_candidates_any
-- Consumer ?1's messages after seq ?2 that pass the filters (`replay_filters`) and are not
-- leased, at most ?8.
SELECT m.message_id, m.seq, m.topic, m.enqueued_at
  FROM outbox_messages m LEFT JOIN outbox_deliveries d ON d.message_id = m.message_id AND d.consumer = ?1
 WHERE (d.state IS NULL OR d.state <> 'leased')
   AND m.seq > ?2
   {{replay_filters}}
 ORDER BY m.seq LIMIT ?8;

-- name: delivery_pending_page
-- A page of consumer ?1's pending deliveries after seq ?2, at most ?3, in seq order
-- (`outbox_deliveries_pending`).
SELECT NULL AS reached, m.message_id, m.seq, m.topic, m.type, m.ordering_key, m.enqueued_at, d.state,
       d.delivery_count, d.available_at, d.lease_expires_at, d.last_error
  FROM outbox_deliveries d JOIN outbox_messages m ON m.message_id = d.message_id
 WHERE d.consumer = ?1 AND d.state = 'pending' AND d.seq > ?2
 ORDER BY d.seq LIMIT ?3;

-- name: delivery_leased_page
-- A page of consumer ?1's leased deliveries after seq ?2, at most ?3, in seq order
-- (`outbox_deliveries_leased_by_consumer`).
SELECT NULL AS reached, m.message_id, m.seq, m.topic, m.type, m.ordering_key, m.enqueued_at, d.state,
       d.delivery_count, d.available_at, d.lease_expires_at, d.last_error
  FROM outbox_deliveries d JOIN outbox_messages m ON m.message_id = d.message_id
 WHERE d.consumer = ?1 AND d.state = 'leased' AND d.seq > ?2
 ORDER BY d.seq LIMIT ?3;

-- name: delivery_retrying_page
-- A page of consumer ?1's retries (pending with a delivery count) after seq ?2, at most ?3, in
-- seq order, among at most ?4 of its pending deliveries read by `outbox_deliveries_pending`;
-- `reached`, the last seq read when it read ?4, is where the next page starts if this one is
-- short. A row with a NULL message_id only carries `reached`.
WITH w AS (
    SELECT d.message_id, d.seq, d.state, d.delivery_count, d.available_at, d.lease_expires_at, d.last_error
      FROM outbox_deliveries d
     WHERE d.consumer = ?1 AND d.state = 'pending' AND d.seq > ?2
     ORDER BY d.seq LIMIT ?4
),
reach AS (
    SELECT CASE WHEN count(*) >= ?4 THEN max(w.seq) END AS reached FROM w
)
SELECT r.reached, x.*
  FROM reach r LEFT JOIN (
      SELECT m.message_id, m.seq, m.topic, m.type, m.ordering_key, m.enqueued_at, w.state,
             w.delivery_count, w.available_at, w.lease_expires_at, w.last_error
        FROM w JOIN outbox_messages m ON m.message_id = w.message_id
       WHERE w.delivery_count > 0
       ORDER BY w.seq LIMIT ?3) x ON 1
 ORDER BY x.seq;
