-- name: consumer_list
SELECT * FROM outbox_consumers ORDER BY name;

-- name: consumer_find
SELECT * FROM outbox_consumers WHERE name = ?1;

-- name: consumer_insert
INSERT INTO outbox_consumers (name, topics, max_deliveries, backoff_base_ms, backoff_max_ms,
                              ack_deadline_ms, start_from, start_seq, created_at, sink, dead_key_policy,
                              created_by)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7,
        CASE WHEN ?7 = 'new' THEN (SELECT coalesce(max(seq), 0) FROM outbox_messages) ELSE 0 END, ?8, ?9,
        ?10, ?11)
RETURNING *;

-- name: consumer_count
-- Inside the write transaction: `--max-consumers` is checked where no other create can slip
-- in between the count and the insert.
SELECT count(*) AS n FROM outbox_consumers;

-- name: consumer_delete
DELETE FROM outbox_consumers WHERE name = ?1;

-- name: consumer_set_paused
UPDATE outbox_consumers SET paused = ?2 WHERE name = ?1 RETURNING *;

-- name: held_key_insert
INSERT OR IGNORE INTO outbox_held_keys (consumer, ordering_key, message_id, seq, held_at)
SELECT json_extract(value, '$.c'), json_extract(value, '$.k'), json_extract(value, '$.m'),
       json_extract(value, '$.s'), ?2
  FROM json_each(?1)
 WHERE (SELECT c.dead_key_policy FROM outbox_consumers c WHERE c.name = json_extract(value, '$.c')) = 'hold';

-- name: consumer_stats
SELECT c.name, c.paused,
      (SELECT count(*) FROM outbox_deliveries d WHERE d.consumer = c.name AND d.state = 'pending') AS backlog,
      (SELECT count(*) FROM outbox_deliveries d WHERE d.consumer = c.name AND d.state = 'leased') AS in_flight,
      (SELECT count(*) FROM outbox_deliveries d
        WHERE d.consumer = c.name AND d.state = 'pending' AND d.delivery_count > 0) AS retrying,
      (SELECT count(*) FROM outbox_deliveries d WHERE d.consumer = c.name AND d.state = 'dead') AS dead,
      -- The acked deliveries, when asked (ADR 0070): every message its acked ranges hold, read by
      -- seq, plus its acked rows, less its rows of any state whose seq a range holds (a row
      -- decides over a range, and only rows at or above its lowest range are probed).
      CASE WHEN ?2 THEN
          (SELECT count(*) FROM outbox_acked_ranges r CROSS JOIN outbox_messages m
            WHERE r.consumer = c.name AND m.seq >= r.lo AND m.seq < r.hi)
        + (SELECT count(*) FILTER (WHERE d.state = 'acked')
                - count(*) FILTER (WHERE d.seq >= (SELECT min(x.lo) FROM outbox_acked_ranges x WHERE x.consumer = c.name)
                                     AND EXISTS (SELECT 1 FROM outbox_acked_ranges r
                                                  WHERE {{acked_range_of consumer=c.name seq=d.seq}}))
             FROM outbox_deliveries d WHERE d.consumer = c.name)
      ELSE 0 END AS acked,
      (SELECT min(d.seq) FROM outbox_deliveries d WHERE d.consumer = c.name AND d.state = 'pending') AS oldest_pending,
      (SELECT min(d.seq) FROM outbox_deliveries d WHERE d.consumer = c.name AND d.state = 'leased') AS oldest_leased,
      (SELECT count(*) FROM outbox_held_keys h WHERE h.consumer = c.name) AS held_keys
 FROM outbox_consumers c
WHERE ?1 IS NULL OR c.name = ?1
ORDER BY c.name;

-- name: held_key_delete_of_messages
DELETE FROM outbox_held_keys WHERE consumer = ?1 AND message_id IN (SELECT value FROM json_each(?2));

-- name: held_key_list
SELECT h.ordering_key, h.message_id, h.held_at, d.last_error,
      (SELECT count(*) FROM (SELECT 1 FROM outbox_deliveries w INDEXED BY outbox_deliveries_ordering
                              WHERE w.consumer = h.consumer AND w.ordering_key IS NOT NULL
                                AND w.ordering_key = h.ordering_key AND w.state IN ('pending', 'leased')
                              LIMIT ?4)) AS waiting
 FROM outbox_held_keys h
 LEFT JOIN outbox_deliveries d ON d.message_id = h.message_id AND d.consumer = h.consumer
WHERE h.consumer = ?1 AND (?2 IS NULL OR h.ordering_key = ?2)
ORDER BY h.held_at, h.ordering_key
LIMIT ?3;

-- name: held_key_delete
DELETE FROM outbox_held_keys WHERE consumer = ?1 AND ordering_key = ?2 RETURNING message_id;
