-- pgbench script of the ceiling phase: one row per autocommit transaction into a plain table,
-- the same shape as outbox-bench's ceiling (bigserial key, uuid, text, bytea, timestamptz).
-- run.mjs sets :payload (pgbench -D) to the jobs' payload.
INSERT INTO bench_ceiling (id, topic, type, payload) VALUES (gen_random_uuid(), 'bench', 'bench.event', convert_to(:payload, 'UTF8'));
