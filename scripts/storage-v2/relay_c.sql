\set k :consumers
BEGIN;
CREATE TEMP TABLE IF NOT EXISTS batch (seq bigint, message_id uuid) ON COMMIT DELETE ROWS;
INSERT INTO batch SELECT seq, message_id FROM v2.m
 WHERE seq > (SELECT position FROM v2.cursor WHERE id = 1 FOR UPDATE) ORDER BY seq LIMIT 100;
UPDATE v2.cursor SET position = coalesce((SELECT max(seq) FROM batch), position) WHERE id = 1;
UPDATE v2.position p SET acked = p.acked + int8multirange(int8range(r.lo, r.hi, '[]'))
  FROM (SELECT min(seq) lo, max(seq) hi FROM batch HAVING count(*) > 0) r
 WHERE p.consumer IN (SELECT 'c' || i FROM generate_series(1, :k) i);
UPDATE v2.position p SET floor = upper(acked) - 1, acked = '{}'
 WHERE p.consumer IN (SELECT 'c' || i FROM generate_series(1, :k) i) AND acked <> '{}' AND lower(acked) <= floor + 1
   AND int8multirange(int8range(floor + 1, upper(acked))) = acked;
COMMIT;
