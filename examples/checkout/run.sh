#!/usr/bin/env bash
# The checkout saga demo in one command: prepares what is needed (build.sh: prebuilt binaries
# when there are some, building only what is missing), starts outboxd and the three services
# against DATABASE_URL, creates the consumers, and stops everything on Ctrl-C.
#
#   examples/checkout/run.sh [--style orchestration|choreography] [--limit AMOUNT]
#                            [--grpc-port N] [--orders-port N] [--inventory-port N] [--payments-port N]
#
#   Orders     http://127.0.0.1:8090   (Rust)        POST /orders, GET /orders/{id}
#   Inventory  http://127.0.0.1:8091   (Python)      GET /stock/{sku}
#   Payments   http://127.0.0.1:8092   (TypeScript)  GET /payments/{order_id}
#   outboxd    127.0.0.1:50061         (gRPC)
#
# Ports: --grpc-port (OUTBOXD_PORT, default 50061), --orders-port (ORDERS_PORT, 8090),
# --inventory-port (INVENTORY_PORT, 8091), --payments-port (PAYMENTS_PORT, 8092); flags win.
# They are not the README's outboxd's (50051, its console 8080), so both run side by side; a
# port already in use stops run.sh before it builds, starts or changes anything.
# DATABASE_URL defaults to the local PostgreSQL, database `checkout` (outboxd creates it).
# Binaries: OUTBOXD_BIN, OUTBOXCTL_BIN, ORDERS_BIN, or the newest build under
# ${CARGO_TARGET_DIR:-target}/{release,debug}; cargo builds them only when missing or out of
# date (CHECKOUT_BUILD=auto|never|always, CHECKOUT_PROFILE=debug|release; see build.sh).
# Needs Python 3.11+ and Node 20+, the package registries on the first run, and Rust unless
# the binaries are prebuilt.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
style=orchestration
limit=1000
grpc_port="${OUTBOXD_PORT:-50061}"
orders_port="${ORDERS_PORT:-8090}"
inventory_port="${INVENTORY_PORT:-8091}"
payments_port="${PAYMENTS_PORT:-8092}"
usage() { sed -n '6,7p' "$0" | sed 's/^#  *//' >&2; exit 2; }
# `--flag VALUE` and `--flag=VALUE`: sets `value`, and how many arguments it took.
flag_value() {
  case "$1" in
    *=*) value="${1#*=}"; took=1 ;;
    *) [ $# -ge 2 ] || { echo "run.sh: $1 needs a value" >&2; usage; }; value="$2"; took=2 ;;
  esac
}
while [ $# -gt 0 ]; do
  case "$1" in
    --style|--style=*) flag_value "$@"; style="$value"; shift "$took" ;;
    --limit|--limit=*) flag_value "$@"; limit="$value"; shift "$took" ;;
    --grpc-port|--grpc-port=*) flag_value "$@"; grpc_port="$value"; shift "$took" ;;
    --orders-port|--orders-port=*) flag_value "$@"; orders_port="$value"; shift "$took" ;;
    --inventory-port|--inventory-port=*) flag_value "$@"; inventory_port="$value"; shift "$took" ;;
    --payments-port|--payments-port=*) flag_value "$@"; payments_port="$value"; shift "$took" ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run.sh: unknown argument $1" >&2; usage ;;
  esac
done
case "$style" in orchestration|choreography) ;; *) echo "run.sh: --style is orchestration or choreography, got '$style'" >&2; exit 2 ;; esac
[[ "$limit" =~ ^[0-9]+$ ]] || { echo "run.sh: --limit is a non-negative integer, got '$limit'" >&2; exit 2; }
for p in "grpc-port:$grpc_port" "orders-port:$orders_port" "inventory-port:$inventory_port" "payments-port:$payments_port"; do
  n="${p#*:}"
  if ! [[ "$n" =~ ^[0-9]+$ ]] || [ "$n" -lt 1 ] || [ "$n" -gt 65535 ]; then
    echo "run.sh: --${p%%:*} is a port from 1 to 65535, got '$n'" >&2
    exit 2
  fi
done
if [ "$(printf '%s\n' "$grpc_port" "$orders_port" "$inventory_port" "$payments_port" | sort -u | wc -l)" -ne 4 ]; then
  echo "run.sh: the four ports must differ (grpc $grpc_port, orders $orders_port, inventory $inventory_port, payments $payments_port)" >&2
  exit 2
fi

# Before anything is built, started or changed: the demo runs its own outboxd and services, and
# must not create its consumers on an outboxd that happens to answer on its port.
for p in "grpc-port:$grpc_port" "orders-port:$orders_port" "inventory-port:$inventory_port" "payments-port:$payments_port"; do
  n="${p#*:}"
  if (exec 3<>"/dev/tcp/127.0.0.1/$n") 2>/dev/null; then
    echo "run.sh: 127.0.0.1:$n (--${p%%:*}) is in use: is the README's outboxd, or an earlier demo, still running there? Stop it, or pass --${p%%:*} with a free port. Nothing was started or changed." >&2
    exit 2
  fi
done

export DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/checkout}"
export OUTBOXD_SERVER="http://127.0.0.1:$grpc_port"
# shellcheck source=build.sh
source "$here/build.sh"

pids=()
names=()
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
  names+=("$name")
}

# The pid `start` gave process `name`.
pid_of() {
  local i
  for i in "${!names[@]}"; do
    [ "${names[$i]}" = "$1" ] && { printf '%s' "${pids[$i]}"; return; }
  done
}

# Polls until `check` succeeds, for at most `bound` seconds; fails at once if the process
# `what` has exited meanwhile (its log, above, says why).
wait_for() {
  local what=$1 bound=$2
  shift 2
  local deadline=$((SECONDS + bound)) pid
  pid="$(pid_of "$what")"
  until "$@" >/dev/null 2>&1; do
    if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; then
      local status=0
      wait "$pid" 2>/dev/null || status=$?
      echo "checkout: $what exited (status $status) before it was up; its log is above" >&2
      exit 1
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "checkout: $what is not up after ${bound}s" >&2
      exit 1
    fi
    sleep 0.2
  done
}
http_ok() { "$venv_python" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' "$1"; }

start outboxd "$outboxd_bin" serve --database-url "$DATABASE_URL" --listen "127.0.0.1:$grpc_port"
wait_for outboxd 60 "$outboxd_bin" healthcheck --addr "127.0.0.1:$grpc_port"
# The outboxd that answered is ours only if ours is still running (another process may have
# taken the port since the check above, and ours then exited): only then create consumers.
if ! kill -0 "$(pid_of outboxd)" 2>/dev/null; then
  echo "checkout: outboxd exited while another process answered on 127.0.0.1:$grpc_port; nothing was changed" >&2
  exit 1
fi
OUTBOXCTL="$outboxctl_bin" bash "$here/consumers.sh"

start orders "$orders_bin" --style "$style" --listen "127.0.0.1:$orders_port"
start inventory "$venv_python" "$here/inventory/inventory.py" --listen "127.0.0.1:$inventory_port"
start payments node "$payments_js" --listen "127.0.0.1:$payments_port" --limit "$limit"
wait_for orders 30 http_ok "http://127.0.0.1:$orders_port/health"
wait_for inventory 30 http_ok "http://127.0.0.1:$inventory_port/health"
wait_for payments 30 http_ok "http://127.0.0.1:$payments_port/health"

cat >&2 <<EOT
checkout: running, style $style, payment limit $limit (started in ${SECONDS}s). Try:
  curl -s -X POST http://127.0.0.1:$orders_port/orders -H 'content-type: application/json' \\
       -H 'Idempotency-Key: demo-1' -d '{"sku": "SKU-1", "quantity": 2, "amount": 100}'
Ctrl-C stops everything.
EOT
# Until Ctrl-C, or until one of them exits (then the rest are stopped too).
wait -n "${pids[@]}" || true
echo "checkout: a process exited; stopping the others" >&2
exit 1
