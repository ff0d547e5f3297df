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
# The client as the tree has it now (pip may keep an earlier build of the same version), and
# its dependencies when some are missing.
"${pip[@]}" --force-reinstall --no-deps "$repo/clients/python"
if ! "$venv_python" -m pip check >/dev/null 2>&1; then
  "${pip[@]}" "$repo/clients/python"
fi

step "building the TypeScript client and Payments"
# `npm ci` in a folder, unless its node_modules is as new as its lock file.
npm_ci() {
  if [ ! -f node_modules/.package-lock.json ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
    npm ci --no-audit --no-fund --loglevel=error >/dev/null
  fi
}
# Payments links to the client folder (a file: dependency). The client is built there first,
# from its own lock file, so the link points at a build of the tree as it is now with locked
# dependencies; again only when its sources or proto/ changed.
(
  cd "$repo/clients/typescript"
  npm_ci
  if [ ! -f dist/index.js ] || [ -n "$(find src "$repo/proto" package.json buf.gen.yaml -newer dist/index.js \
      -not -path 'src/gen/*' -print -quit)" ]; then
    npm run -s build >/dev/null
  fi
)
(cd "$checkout_dir/payments" && npm_ci && npm run -s build >/dev/null)
payments_js="$checkout_dir/payments/dist/payments.js"
export outboxd_bin outboxctl_bin orders_bin venv_python payments_js
