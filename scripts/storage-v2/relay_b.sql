\set k :consumers
BEGIN;
CREATE TEMP TABLE IF NOT EXISTS batch (seq bigint, message_id uuid) ON COMMIT DELETE ROWS;
INSERT INTO batch SELECT seq, message_id FROM v2.m
 WHERE seq > (SELECT position FROM v2.cursor WHERE id = 1 FOR UPDATE) ORDER BY seq LIMIT 100;
UPDATE v2.cursor SET position = coalesce((SELECT max(seq) FROM batch), position) WHERE id = 1;
INSERT INTO v2.d (consumer, message_id, seq, state, delivery_count, available_at, lease_expires_at)
SELECT 'c' || i, b.message_id, b.seq, 'leased', 1, now(), now() + interval '30 s'
  FROM batch b, generate_series(1, :k) i;
UPDATE v2.d SET state = 'acked', acked_at = now(), lease_expires_at = NULL
 WHERE (consumer, message_id) IN (SELECT 'c' || i, b.message_id FROM batch b, generate_series(1, :k) i);
COMMIT;
