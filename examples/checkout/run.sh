#!/usr/bin/env bash
# The checkout saga demo in one command: builds what is needed (build.sh), starts outboxd and
# the three services against DATABASE_URL, creates the consumers, and stops everything on
# Ctrl-C.
#
#   examples/checkout/run.sh [--style orchestration|choreography] [--limit AMOUNT]
#
#   Orders     http://127.0.0.1:8080   (Rust)        POST /orders, GET /orders/{id}
#   Inventory  http://127.0.0.1:8081   (Python)      GET /stock/{sku}
#   Payments   http://127.0.0.1:8082   (TypeScript)  GET /payments/{order_id}
#   outboxd    127.0.0.1:50051         (gRPC)
#
# DATABASE_URL defaults to the local PostgreSQL, database `checkout` (outboxd creates it).
# Needs Rust, Python 3.11+, Node 20+ and the package registries (crates.io, PyPI, npm).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
style=orchestration
limit=1000
usage() { sed -n '6p' "$0" | sed 's/^#  *//' >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --style) style="${2:-}"; shift 2 || usage ;;
    --style=*) style="${1#*=}"; shift ;;
    --limit) limit="${2:-}"; shift 2 || usage ;;
    --limit=*) limit="${1#*=}"; shift ;;
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run.sh: unknown argument $1" >&2; usage ;;
  esac
done
case "$style" in orchestration|choreography) ;; *) echo "run.sh: --style is orchestration or choreography, got '$style'" >&2; exit 2 ;; esac
[[ "$limit" =~ ^[0-9]+$ ]] || { echo "run.sh: --limit is a non-negative integer, got '$limit'" >&2; exit 2; }

export DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/checkout}"
export OUTBOXD_SERVER="http://127.0.0.1:50051"
# shellcheck source=build.sh
source "$here/build.sh"

pids=()
stop_all() {
  trap - EXIT INT TERM
  echo "checkout: stopping" >&2
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap stop_all EXIT
trap 'exit 130' INT TERM

# Each process's log lines, prefixed with its name.
start() {
  local name=$1
  shift
  "$@" > >(sed -u "s/^/[$name] /") 2>&1 &
  pids+=("$!")
}

# Polls until `check` succeeds, for at most `bound` seconds.
wait_for() {
  local what=$1 bound=$2
  shift 2
  local deadline=$((SECONDS + bound))
  until "$@" >/dev/null 2>&1; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "checkout: $what is not up after ${bound}s" >&2
      exit 1
    fi
    sleep 0.2
  done
}
http_ok() { "$venv_python" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' "$1"; }

start outboxd "$outboxd_bin" serve --database-url "$DATABASE_URL" --listen 127.0.0.1:50051
wait_for outboxd 60 "$outboxd_bin" healthcheck --addr 127.0.0.1:50051
OUTBOXCTL="$outboxctl_bin" bash "$here/consumers.sh"

start orders "$orders_bin" --style "$style" --listen 127.0.0.1:8080
start inventory "$venv_python" "$here/inventory/inventory.py" --listen 127.0.0.1:8081
start payments node "$payments_js" --listen 127.0.0.1:8082 --limit "$limit"
wait_for orders 30 http_ok http://127.0.0.1:8080/health
wait_for inventory 30 http_ok http://127.0.0.1:8081/health
wait_for payments 30 http_ok http://127.0.0.1:8082/health

cat >&2 <<EOT
checkout: running, style $style, payment limit $limit. Try:
  curl -s -X POST http://127.0.0.1:8080/orders -H 'content-type: application/json' \\
       -H 'Idempotency-Key: demo-1' -d '{"sku": "SKU-1", "quantity": 2, "amount": 100}'
Ctrl-C stops everything.
EOT
# Until Ctrl-C, or until one of them exits (then the rest are stopped too).
wait -n "${pids[@]}" || true
echo "checkout: a process exited; stopping the others" >&2
exit 1
