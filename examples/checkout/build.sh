#!/usr/bin/env bash
# Builds what the checkout demo runs, from the repository alone and the package registries:
#   - outboxd, outboxctl and Orders (cargo; CHECKOUT_PROFILE=release for an optimised build),
#   - a virtualenv for Inventory with the Python client (clients/python) and requirements.txt
#     (CHECKOUT_VENV, default target/checkout-venv; pytest too with CHECKOUT_TEST=1),
#   - the TypeScript client (clients/typescript) and Payments (npm ci from their lock files).
# Prints nothing but progress on stderr; sourced by run.sh and test.sh, which then use
# $outboxd_bin, $outboxctl_bin, $orders_bin, $venv_python and $payments_js.
set -euo pipefail
checkout_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$checkout_dir/../.." && pwd)"
profile="${CHECKOUT_PROFILE:-debug}"
cargo_profile=()
[ "$profile" = release ] && cargo_profile=(--release)

step() { echo "checkout: $*" >&2; }

step "building outboxd, outboxctl and orders ($profile)"
# The same invocation as CI's image check, so its build is reused.
(cd "$repo" && cargo build -q "${cargo_profile[@]}" -p outbox-server --bin outboxd)
(cd "$repo" && cargo build -q "${cargo_profile[@]}" -p outbox-client -p checkout-orders --bins)
outboxd_bin="$repo/target/$profile/outboxd"
outboxctl_bin="$repo/target/$profile/outboxctl"
orders_bin="$repo/target/$profile/checkout-orders"

venv="${CHECKOUT_VENV:-$repo/target/checkout-venv}"
step "preparing the Python virtualenv $venv"
if [ ! -x "$venv/bin/python" ]; then
  "${PYTHON:-python3}" -m venv "$venv"
fi
venv_python="$venv/bin/python"
pip=("$venv_python" -m pip install --disable-pip-version-check -q)
requirements=(-r "$checkout_dir/inventory/requirements.txt")
[ "${CHECKOUT_TEST:-0}" = 1 ] && requirements+=(-r "$checkout_dir/tests/requirements.txt")
"${pip[@]}" "${requirements[@]}"
"${pip[@]}" "$repo/clients/python"
# The client as the tree has it now (pip may keep an earlier build of the same version).
"${pip[@]}" --force-reinstall --no-deps "$repo/clients/python"

step "building the TypeScript client and Payments"
# npm does not run the `prepare` of a linked local package here (install scripts need an
# allowScripts entry in npm 11), so the client is built in its own folder first.
(cd "$repo/clients/typescript" && npm ci --no-audit --no-fund --loglevel=error >/dev/null && npm run -s build >/dev/null)
(cd "$checkout_dir/payments" && npm ci --no-audit --no-fund --loglevel=error >/dev/null && npm run -s build >/dev/null)
payments_js="$checkout_dir/payments/dist/payments.js"
export outboxd_bin outboxctl_bin orders_bin venv_python payments_js
