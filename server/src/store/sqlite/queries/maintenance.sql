-- name: table_health
SELECT (SELECT page_count FROM pragma_page_count()) AS pages,
(SELECT freelist_count FROM pragma_freelist_count()) AS free,
(SELECT page_size FROM pragma_page_size()) AS page_size;

-- name: prune_candidates
SELECT m.message_id, m.seq FROM outbox_messages m
WHERE m.enqueued_at < ?1 AND m.seq <= (SELECT c.position FROM outbox_relay_cursor c WHERE c.id = 1)
  AND NOT EXISTS (SELECT 1 FROM outbox_deliveries d
                   WHERE d.message_id = m.message_id AND d.state <> 'acked')
ORDER BY m.enqueued_at LIMIT ?2;

-- name: prune_range_deliveries
-- How many deliveries of the messages in the JSON array ?1 (objects `m`, message id, and `s`,
-- seq) acked ranges hold for consumers that have no row of them (a row decides over a range):
-- per message and consumer that has any range, one probe for its range.
WITH {{pruned_and_ranged}}
SELECT count(*) FROM b CROSS JOIN k CROSS JOIN outbox_acked_ranges r
 WHERE {{acked_range_of consumer=k.name seq=b.s}}
   AND NOT EXISTS (SELECT 1 FROM outbox_deliveries d WHERE d.message_id = b.m AND d.consumer = k.name);

-- name: prune_acked_ranges
-- Once the messages of the JSON array ?1 (as above) are gone: the acked ranges that held one of
-- them and hold no message any more.
DELETE FROM outbox_acked_ranges
 WHERE (consumer, lo) IN (
       WITH {{pruned_and_ranged}}
       SELECT r.consumer, r.lo FROM b CROSS JOIN k CROSS JOIN outbox_acked_ranges r
        WHERE {{acked_range_of consumer=k.name seq=b.s}})
   AND NOT EXISTS (SELECT 1 FROM outbox_messages m WHERE m.seq >= outbox_acked_ranges.lo
                                                     AND m.seq < outbox_acked_ranges.hi);

-- name: prune_deliveries
DELETE FROM outbox_deliveries WHERE message_id IN (SELECT value FROM json_each(?1));

-- name: prune_messages
DELETE FROM outbox_messages WHERE message_id IN (SELECT value FROM json_each(?1));

-- name: prune_relay_log
-- The relay log's rows that name only pruned messages.
DELETE FROM outbox_relay_log
 WHERE hi < coalesce((SELECT min(seq) FROM outbox_messages),
                     (SELECT c.position + 1 FROM outbox_relay_cursor c WHERE c.id = 1));
