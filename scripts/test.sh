#!/usr/bin/env bash
# Runs the whole test suite: unit, store, end-to-end (real outboxd processes), the Python
# client package's checks and tests (clients/python/test.sh), the TypeScript client's tests
# (clients/typescript/test.sh, which needs Node.js 20 or later and npm), and the checkout demo
# end to end (examples/checkout/test.sh). Needs a PostgreSQL that accepts `postgres` without a
# password on 127.0.0.1:5432, or OUTBOX_TEST_DATABASE_URL pointing at one (each test creates and
# drops its own database). A local cluster that is installed but stopped is started. The sink
# tests also need RabbitMQ on 127.0.0.1:5672 (guest/guest) and NATS with JetStream on
# 127.0.0.1:4222 (or OUTBOX_TEST_AMQP_URL / OUTBOX_TEST_NATS_URL); scripts/brokers.sh starts
# local ones.
set -euo pipefail
cd "$(dirname "$0")/.."

url="${OUTBOX_TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
if ! pg_isready -d "$url" -q 2>/dev/null; then
  if command -v pg_ctlcluster >/dev/null 2>&1 && [ -d /etc/postgresql ]; then
    version=$(ls /etc/postgresql | sort -V | tail -n 1)
    echo "starting PostgreSQL $version" >&2
    pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
  fi
  for _ in $(seq 1 30); do
    pg_isready -d "$url" -q 2>/dev/null && break
    sleep 1
  done
fi
if ! pg_isready -d "$url" -q 2>/dev/null; then
  echo "PostgreSQL is not reachable at $url; start one or set OUTBOX_TEST_DATABASE_URL" >&2
  exit 1
fi

bash scripts/brokers.sh

log=$(mktemp)
trap 'rm -f "$log"' EXIT
set +e
cargo test --workspace "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
# The Python client (clients/python): generated code, mypy --strict, pytest against real outboxd.
bash clients/python/test.sh 2>&1 | tee -a "$log"
py_status=${PIPESTATUS[0]}
# The TypeScript client, against the debug outboxd the cargo tests built.
OUTBOXD_BIN="${OUTBOXD_BIN:-$PWD/target/debug/outboxd}" bash clients/typescript/test.sh 2>&1 | tee -a "$log"
ts_status=${PIPESTATUS[0]}
# The checkout demo end to end (examples/checkout): outboxd and its three services as real
# processes, both saga styles, each service SIGKILLed mid-step.
bash examples/checkout/test.sh 2>&1 | tee -a "$log"
checkout_status=${PIPESTATUS[0]}
set -e
# One closing line for the cargo and pytest tests (cargo prints one per test binary, pytest one
# per run).
awk '/^test result:/ || /^=* *[0-9]+ (passed|failed|error).* in [0-9.]+s/ {
       for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^(failed|error)/) f += $i } }
     END { printf "outboxd suite: %d passed, %d failed\n", p, f }' "$log"
for s in "$status" "$py_status" "$ts_status" "$checkout_status"; do
  if [ "$s" -ne 0 ]; then exit "$s"; fi
done
