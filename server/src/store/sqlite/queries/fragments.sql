-- Pieces of SQL that several statements share, included as {{name}}.

-- fragment: relayed_at
-- When message m was relayed: the relay log's pass that read it (ADR 0066), or the time an older
-- release wrote into the row; NULL while it waits for the relay.
coalesce(m.relayed_at, (SELECT l.at FROM outbox_relay_log l WHERE l.hi >= m.seq AND l.lo <= m.seq
                         ORDER BY l.hi LIMIT 1)) AS relayed_at

-- fragment: message_columns
-- A message as `message_from_row` reads it.
m.message_id, m.seq, m.topic, m.type, m.payload, m.headers, m.ordering_key,
m.enqueued_at, coalesce(m.available_at, m.enqueued_at) AS available_at, {{relayed_at}}

-- fragment: message_columns_without_bodies
-- A message as `message_from_row` reads it, with an empty payload and no headers.
m.message_id, m.seq, m.topic, m.type, x'' AS payload, '{}' AS headers, m.ordering_key,
m.enqueued_at, coalesce(m.available_at, m.enqueued_at) AS available_at, {{relayed_at}}

-- fragment: search_window
-- The `?3` newest seqs below `?1` and from `?2`, by primary key.
SELECT m.seq FROM outbox_messages m WHERE m.seq < ?1 AND m.seq >= ?2 ORDER BY m.seq DESC LIMIT ?3

-- fragment: key_head
-- The lowest pending or leased seq of consumer ?1's keys in a key range, and whether it is due
-- at ?4; each statement that includes it bounds the range with ?2 (exclusive) or ?3 (inclusive),
-- one bound shape each, so that each is one index range (an `OR` is not).
SELECT d.ordering_key, d.seq, d.message_id, d.state = 'pending' AND d.available_at <= ?4 AS due
  FROM outbox_deliveries d INDEXED BY outbox_deliveries_ordering
 WHERE d.consumer = ?1 AND d.ordering_key IS NOT NULL AND d.state IN ('pending', 'leased')

-- fragment: replay_filters
-- A replay's filters: messages in the JSON array ?3, enqueued from ?4 and before ?5, types in
-- the JSON array ?6, last error ?7; each any when NULL.
AND (?3 IS NULL OR m.message_id IN (SELECT value FROM json_each(?3)))
AND (?4 IS NULL OR m.enqueued_at >= ?4)
AND (?5 IS NULL OR m.enqueued_at < ?5)
AND (?6 IS NULL OR m.type IN (SELECT value FROM json_each(?6)))
AND (?7 IS NULL OR d.last_error = ?7)

-- fragment: ack_foldable
-- Whether delivery d of consumer ?1, acked by a stream, goes from its row to an acked range
-- (ADR 0070): a first delivery (leased, delivered once, unkeyed, no error) of a message the
-- relay has read (one above the cursor, backfilled or replayed, stays a row: the relay's pass
-- writes no delivery where a row is), whose seq no acked range of the consumer holds (a
-- replayed delivery acked again stays a row, with this ack's time).
d.state = 'leased' AND d.delivery_count = 1 AND d.ordering_key IS NULL AND d.last_error IS NULL
AND d.seq <= (SELECT cur.position FROM outbox_relay_cursor cur WHERE cur.id = 1)
AND NOT EXISTS (SELECT 1 FROM outbox_acked_ranges r WHERE {{acked_range_of consumer=?1 seq=d.seq}})

-- fragment: acked_range_of
-- The acked range `r` of consumer `{consumer}` that holds seq `{seq}`, if any: the consumer's
-- range with the highest `lo` at or below it, one probe of the primary key (ranges of a
-- consumer never overlap).
r.consumer = {consumer} AND r.hi > {seq}
AND r.lo = (SELECT max(x.lo) FROM outbox_acked_ranges x WHERE x.consumer = {consumer} AND x.lo <= {seq})

-- fragment: pruned_and_ranged
-- The prune's messages, `b(m, s)`, from the JSON array ?1 (objects `m`, message id, and `s`,
-- seq), read once; and the consumers that have any acked range, `k(name)`, one probe each.
b(m, s) AS MATERIALIZED (SELECT json_extract(value, '$.m'), json_extract(value, '$.s') FROM json_each(?1)),
k(name) AS MATERIALIZED (SELECT c.name FROM outbox_consumers c
                          WHERE EXISTS (SELECT 1 FROM outbox_acked_ranges x WHERE x.consumer = c.name))
