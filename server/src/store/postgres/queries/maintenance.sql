-- name: vacuum_horizon
WITH holders AS (
   SELECT 'transaction' AS kind, pid, coalesce(application_name, '') AS application_name,
          coalesce(state, '') AS state, '' AS name,
          greatest(age(backend_xmin), age(backend_xid))::bigint AS xmin_age,
          coalesce(xact_start, query_start, backend_start) AS since
     FROM pg_stat_activity
    WHERE (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL) AND pid <> pg_backend_pid()
      AND (datname = current_database() OR backend_type = 'walsender')
   UNION ALL
   SELECT 'replication_slot', coalesce(active_pid, 0), '',
          CASE WHEN active THEN 'active' ELSE 'inactive' END, slot_name::text,
          age(xmin)::bigint, NULL::timestamptz
     FROM pg_replication_slots WHERE xmin IS NOT NULL
   UNION ALL
   SELECT 'prepared_transaction', 0, '', 'prepared', gid, age(transaction)::bigint, prepared
     FROM pg_prepared_xacts WHERE database = current_database()
)
SELECT kind, pid, application_name, state, name, xmin_age, since,
       (SELECT min(since) FROM holders) AS longest
  FROM holders ORDER BY xmin_age DESC, since ASC NULLS LAST LIMIT 1;

-- name: table_health
-- Tables with storage: a partitioned table (`delivery_ranges`) has none; its partitions are
-- listed, and vacuumed, each on its own.
SELECT s.relname AS table_name, s.n_live_tup AS live, s.n_dead_tup AS dead,
     pg_total_relation_size(s.relid) AS bytes,
     greatest(s.last_vacuum, s.last_autovacuum) AS last_vacuum
FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
WHERE s.schemaname = 'outbox' AND c.relkind <> 'p' ORDER BY s.relname;

-- name: vacuum_lock_try
SELECT pg_try_advisory_lock($1);

-- name: vacuum_unlock
SELECT pg_advisory_unlock($1);

-- name: prune_lock_try
SELECT pg_try_advisory_xact_lock($1);

-- name: prune_fold_acked_rows
WITH folded AS (
   SELECT p.id, range_agg(int8range(d.seq, d.seq + 1)) AS seqs
     FROM outbox.delivery_ranges p
     JOIN outbox.deliveries d
       ON d.consumer = p.consumer AND d.state = 'acked' AND d.delivery_count = 0
      AND d.seq >= lower(p.seqs) AND d.seq < upper(p.seqs) AND d.seq <@ p.seqs
    WHERE p.state = 'pending'
    GROUP BY p.id)
UPDATE outbox.delivery_ranges p SET seqs = p.seqs - f.seqs FROM folded f WHERE p.id = f.id AND p.state = 'pending';

-- name: prune_empty_ranges
-- The pending ranges the fold emptied (every other writer deletes what it empties).
DELETE FROM outbox.delivery_ranges WHERE state = 'pending' AND isempty(seqs);

-- name: prune_messages
WITH doomed AS (
   SELECT m.message_id, m.seq FROM outbox.messages m
    WHERE m.enqueued_at < $1
      AND outbox.seq_relayed(m.seq)
      AND NOT EXISTS (SELECT 1 FROM outbox.deliveries d
                       WHERE d.message_id = m.message_id AND d.state <> 'acked')
      -- Below every seq a leased range holds (they are short-lived), and in no
      -- pending range (a detached consumer's backlog holds back its own messages
      -- only); each computed once.
      AND m.seq < coalesce((SELECT min(lower(b.seqs)) FROM outbox.delivery_ranges b WHERE b.state = 'leased'),
                           9223372036854775807)
      AND NOT m.seq <@ (SELECT coalesce(range_agg(r), '{}'::int8multirange)
                          FROM outbox.delivery_ranges p, unnest(p.seqs) r WHERE p.state = 'pending')
    ORDER BY m.enqueued_at LIMIT $2
    FOR UPDATE SKIP LOCKED),
del AS (DELETE FROM outbox.deliveries d USING doomed
         WHERE d.message_id = doomed.message_id RETURNING 1),
msg AS (DELETE FROM outbox.messages m USING doomed
         WHERE m.message_id = doomed.message_id RETURNING 1),
-- Deliveries acked out of a range have no row: the acked ranges say who acked them.
logged AS (SELECT count(DISTINCT (a.consumer, doomed.seq)) AS n
             FROM doomed JOIN outbox.delivery_ranges a
               ON a.state = 'acked' AND a.seqs @> doomed.seq),
-- An acked range holds the deliveries of messages still kept (ADR 0083): the seqs of the
-- messages pruned leave it, and a range left with none goes, so that the stats count `acked`
-- by a range's seqs. `logged` reads the ranges as they were.
gone AS (SELECT range_agg(int8range(doomed.seq, doomed.seq + 1)) AS seqs FROM doomed),
emptied AS (DELETE FROM outbox.delivery_ranges a USING gone
             WHERE a.state = 'acked' AND a.seqs <@ gone.seqs RETURNING 1),
trimmed AS (UPDATE outbox.delivery_ranges a SET seqs = a.seqs - gone.seqs FROM gone
             WHERE a.state = 'acked' AND a.seqs && gone.seqs AND NOT a.seqs <@ gone.seqs RETURNING 1)
SELECT (SELECT count(*) FROM msg) AS messages,
       (SELECT count(*) FROM del) + (SELECT n FROM logged) AS deliveries;

-- name: prune_relay_log
DELETE FROM outbox.relay_log l
WHERE upper(l.seqs) <= coalesce((SELECT min(m.seq) FROM outbox.messages m),
                                (SELECT c.position + 1 FROM outbox.relay_cursor c));

-- name: prune_acked_ranges
-- The prune trims acked ranges as it goes (`prune_messages`); this deletes the ones that name no
-- message though, which releases before ADR 0083 left behind.
DELETE FROM outbox.delivery_ranges a
WHERE a.state = 'acked' AND a.at < $1
  AND NOT EXISTS (SELECT 1 FROM unnest(a.seqs) r,
                  LATERAL (SELECT 1 FROM outbox.messages m
                            WHERE m.seq >= lower(r) AND m.seq < upper(r) LIMIT 1) x);
