#!/usr/bin/env bash
# The checkout demo's end-to-end test: prepares what run.sh runs (build.sh, with pytest in the
# virtualenv: the same prebuilt binaries, OUTBOXD_BIN, OUTBOXCTL_BIN, ORDERS_BIN or
# ${CARGO_TARGET_DIR:-target}/{release,debug}, built only when missing or out of date; see
# build.sh), then runs tests/ with pytest against real processes: outboxd and the three
# services, on a fresh database per saga style in the PostgreSQL at OUTBOX_TEST_DATABASE_URL
# (default postgres://postgres@127.0.0.1:5432/postgres). Arguments go to pytest;
# `test.sh --measure [N]` instead measures N orders per style (tests/measure.py).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
export CHECKOUT_TEST=1
# shellcheck source=build.sh
source "$here/build.sh"
export OUTBOXD_BIN="$outboxd_bin" OUTBOXCTL_BIN="$outboxctl_bin" ORDERS_BIN="$orders_bin" PAYMENTS_JS="$payments_js"
# Inventory type-checked like the client it uses (Payments is, by its build: tsc --strict).
if [ "${1:-}" != --measure ]; then
  "$venv_python" -m mypy --strict --no-error-summary --cache-dir "$repo/target/checkout-mypy" "$here/inventory/inventory.py"
fi
cd "$here/tests"
if [ "${1:-}" = --measure ]; then
  shift
  exec "$venv_python" measure.py "$@"
fi
exec "$venv_python" -m pytest -p no:cacheprovider --timeout 120 -q "$@"
