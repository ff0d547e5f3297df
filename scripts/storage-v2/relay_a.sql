\set k :consumers
BEGIN;
CREATE TEMP TABLE IF NOT EXISTS batch (seq bigint, message_id uuid) ON COMMIT DELETE ROWS;
WITH c AS (SELECT seq FROM v2.m WHERE relayed_at IS NULL ORDER BY seq LIMIT 100 FOR UPDATE SKIP LOCKED),
     u AS (UPDATE v2.m SET relayed_at = now() FROM c WHERE v2.m.seq = c.seq RETURNING v2.m.seq, v2.m.message_id)
INSERT INTO batch SELECT * FROM u;
INSERT INTO v2.d (consumer, message_id, seq, state, delivery_count, available_at, lease_expires_at)
SELECT 'c' || i, b.message_id, b.seq, 'leased', 1, now(), now() + interval '30 s'
  FROM batch b, generate_series(1, :k) i;
UPDATE v2.d SET state = 'acked', acked_at = now(), lease_expires_at = NULL
 WHERE (consumer, message_id) IN (SELECT 'c' || i, b.message_id FROM batch b, generate_series(1, :k) i);
COMMIT;
