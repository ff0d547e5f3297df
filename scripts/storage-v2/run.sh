#!/usr/bin/env bash
# Storage v2 measurements (ADR 0026): what each relay/ack design costs next to the producers'
# own commit ceiling, on a throw-away database of the local PostgreSQL.
#
#   bash scripts/storage-v2/run.sh [seconds per run, default 15]
#
# For each design (A: today, relayed_at update + a delivery row per message and consumer;
# B: a cursor instead of relayed_at; C: a cursor and per-consumer acked ranges) and for 1 and
# 16 consumers, 8 producer clients insert single-message transactions while one relay client
# claims, fans out and acks in batches of 100. It prints the producers' rate, the messages the
# relay finished, and the WAL written per message.
set -euo pipefail
cd "$(dirname "$0")"
secs="${1:-15}"
base="${OUTBOX_TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
db=outboxd_v2bench
psql "$base" -qc "SET client_min_messages = warning" -qc "DROP DATABASE IF EXISTS $db" -qc "CREATE DATABASE $db"
url="${base%/*}/$db"
trap 'psql "$base" -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)"' EXIT

load() { # design
  psql "$url" -q -v ON_ERROR_STOP=1 -f schema.sql >/dev/null
  if [ "$1" = a ]; then
    psql "$url" -qc "CREATE INDEX m_unrelayed ON v2.m (seq) WHERE relayed_at IS NULL" \
      -qc "CREATE INDEX m_unrelayed_ordering ON v2.m (ordering_key, seq) WHERE relayed_at IS NULL AND ordering_key IS NOT NULL"
  fi
  psql "$url" -qc "VACUUM ANALYZE" -qc "CHECKPOINT"
}
tps() { sed -n 's/^tps = \([0-9.]*\) .*/\1/p' "$1" | head -n 1; }
lsn() { psql "$url" -Atc "SELECT pg_current_wal_lsn()"; }
wal_since() { psql "$url" -Atc "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '$1')"; }

echo "# ceiling: producers alone (8 clients, ${secs}s)"
for design in a c; do
  load "$design"
  pgbench -n -c 8 -j 2 -T "$secs" -f produce.sql "$url" >/tmp/v2-ceiling.out 2>&1
  echo "schema $design (indexes of $([ $design = a ] && echo today || echo v2)): $(tps /tmp/v2-ceiling.out) tps"
done

echo "# enqueue paths on the v2 schema (8 clients, ${secs}s)"
for f in produce produce_plpgsql produce_sql; do
  load c
  pgbench -n -c 8 -j 2 -T "$secs" -f "$f.sql" "$url" >/tmp/v2-enq.out 2>&1
  echo "$f: $(tps /tmp/v2-enq.out) tps"
done

echo "# design consumers producers_tps finished_per_s backlog_at_end wal_bytes_per_message"
for k in 1 16; do
  for design in a b c; do
    load "$design"
    start=$(lsn)
    pgbench -n -c 1 -T "$secs" -D consumers="$k" -f "relay_$design.sql" "$url" >/tmp/v2-relay.out 2>&1 &
    relay=$!
    pgbench -n -c 8 -j 2 -T "$secs" -f produce.sql "$url" >/tmp/v2-prod.out 2>&1
    wait "$relay"
    produced=$(psql "$url" -Atc "SELECT count(*) FROM v2.m")
    if [ "$design" = a ]; then
      finished=$(psql "$url" -Atc "SELECT count(*) FROM v2.m WHERE relayed_at IS NOT NULL")
    else
      finished=$(psql "$url" -Atc "SELECT position FROM v2.cursor")
    fi
    wal=$(wal_since "$start")
    echo "$design $k $(tps /tmp/v2-prod.out) $((finished / secs)) $((produced - finished)) $((wal / (produced > 0 ? produced : 1)))"
  done
done
