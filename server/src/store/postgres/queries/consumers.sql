-- name: consumers_lock
SELECT pg_advisory_xact_lock($1);

-- name: consumer_find
SELECT * FROM outbox.consumers WHERE name = $1;

-- name: consumer_list
SELECT * FROM outbox.consumers ORDER BY name;

-- name: consumer_insert
INSERT INTO outbox.consumers (name, topics, max_deliveries, backoff_base_ms, backoff_max_ms,
                              ack_deadline_ms, start_from, start_seq, created_at, sink, backfill_seq,
                              dead_key_policy, created_by)
VALUES ($1, $2, $3, $4, $5, $6, $7,
        CASE WHEN $7 = 'new' THEN (SELECT coalesce(max(seq), 0) FROM outbox.messages) ELSE 0 END,
        $8, $9,
        -- The EARLIEST backfill (same transaction) writes rows up to here.
        CASE WHEN $7 = 'new' THEN 0 ELSE (SELECT coalesce(max(seq), 0) FROM outbox.messages) END,
        $10, $11)
RETURNING *;

-- name: consumer_count
-- Under the consumer-change lock: `--max-consumers` is checked where no other create can
-- slip in between the count and the insert.
SELECT count(*) AS n FROM outbox.consumers;

-- name: consumer_delete
WITH r AS (DELETE FROM outbox.delivery_ranges WHERE consumer = $1)
DELETE FROM outbox.consumers WHERE name = $1;

-- name: consumer_set_paused
UPDATE outbox.consumers SET paused = $2 WHERE name = $1 RETURNING *;

-- name: held_key_list
SELECT h.ordering_key, h.message_id, h.held_at, d.last_error,
      -- Through deliveries_key_heads, stopped at the cap.
      (SELECT count(*) FROM (SELECT 1 FROM outbox.deliveries w
                              WHERE w.consumer = h.consumer AND w.ordering_key IS NOT NULL
                                AND w.ordering_key COLLATE "C" = h.ordering_key
                                AND w.state IN ('pending', 'leased')
                              LIMIT $4) w) AS waiting
 FROM outbox.held_keys h
 LEFT JOIN outbox.deliveries d ON d.message_id = h.message_id AND d.consumer = h.consumer
WHERE h.consumer = $1 AND ($2::text IS NULL OR h.ordering_key = $2)
ORDER BY h.held_at, h.ordering_key
LIMIT $3;

-- name: held_key_delete
DELETE FROM outbox.held_keys WHERE consumer = $1 AND ordering_key = $2 RETURNING message_id;

-- name: consumer_stats
-- Each figure comes from the partial index for its state, so the cost follows the
-- pending work, not the history. Only `acked` reads history, and only when asked.
SELECT c.name, c.paused,
       (SELECT count(*) FROM outbox.deliveries d WHERE d.consumer = c.name AND d.state = 'pending')
       + r.pending AS backlog,
       (SELECT count(*) FROM outbox.deliveries d WHERE d.consumer = c.name AND d.state = 'leased')
       + r.leased AS in_flight,
       (SELECT count(*) FROM outbox.deliveries d
         WHERE d.consumer = c.name AND d.state = 'pending' AND d.delivery_count > 0) AS retrying,
       (SELECT count(*) FROM outbox.deliveries d WHERE d.consumer = c.name AND d.state = 'dead') AS dead,
       (SELECT count(*) FROM outbox.held_keys h WHERE h.consumer = c.name) AS held_keys,
       CASE WHEN $2 THEN (SELECT count(*) FROM outbox.deliveries d
                           WHERE d.consumer = c.name AND d.state = 'acked') + r.acked
            ELSE 0 END AS acked,
       (SELECT m.enqueued_at FROM outbox.messages m WHERE m.seq = least(
           (SELECT min(d.seq) FROM outbox.deliveries d WHERE d.consumer = c.name AND d.state = 'pending'),
           (SELECT min(d.seq) FROM outbox.deliveries d WHERE d.consumer = c.name AND d.state = 'leased'),
           r.lowest)
       ) AS oldest
  FROM outbox.consumers c,
       -- The consumer's ranges, each counted as what it holds once rows have
       -- decided: its seqs less those with a row of the consumer's own (a row
       -- decides over a range; one range scan of (consumer, seq) per range).
       LATERAL (SELECT coalesce(sum(x.n) FILTER (WHERE x.state = 'pending'), 0)::bigint AS pending,
                       coalesce(sum(x.n) FILTER (WHERE x.state = 'leased'), 0)::bigint AS leased,
                       coalesce(sum(x.n) FILTER (WHERE x.state = 'acked'), 0)::bigint AS acked,
                       min(x.lowest) FILTER (WHERE x.state <> 'acked') AS lowest
                  FROM (SELECT g.state, lower(g.seqs) AS lowest,
                               (SELECT sum(upper(s) - lower(s)) FROM unnest(g.seqs) s)
                               - (SELECT count(*) FROM outbox.deliveries d
                                   WHERE d.consumer = g.consumer AND d.seq > 0
                                     AND d.seq >= lower(g.seqs) AND d.seq < upper(g.seqs)
                                     AND d.seq <@ g.seqs) AS n
                          FROM (SELECT * FROM outbox.delivery_ranges g
                                 WHERE g.consumer = c.name AND g.state IN ('pending', 'leased')
                                UNION ALL
                                -- Acked ranges are history: read only when asked.
                                SELECT * FROM outbox.delivery_ranges g
                                 WHERE $2 AND g.consumer = c.name AND g.state = 'acked') g) x) r
 WHERE $1::text IS NULL OR c.name = $1
 ORDER BY c.name;
