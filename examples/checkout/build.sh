#!/usr/bin/env bash
# Prepares what the checkout demo runs, building only what is missing or out of date:
#   - outboxd, outboxctl and Orders (checkout-orders): prebuilt binaries are used as they are,
#     from OUTBOXD_BIN, OUTBOXCTL_BIN and ORDERS_BIN when set, otherwise from
#     ${CARGO_TARGET_DIR:-<repository>/target}/{release,debug} (the newer of the two). cargo
#     builds one only when it is missing, or older than the Rust sources (CHECKOUT_BUILD=auto,
#     the default; CHECKOUT_BUILD=never uses what is there, CHECKOUT_BUILD=always runs cargo).
#     CHECKOUT_PROFILE=release builds optimised binaries; by default what is missing is built in
#     release when a release outboxd is there already (the README's build: its optimised
#     dependencies are reused), else in debug.
#   - a virtualenv for Inventory with the Python client (clients/python) and requirements.txt
#     (CHECKOUT_VENV, default <repository>/target/checkout-venv; pytest too with
#     CHECKOUT_TEST=1); pip runs only when the client's sources or a requirements file changed
#     since the last install (a hash of them is kept in the virtualenv).
#   - the TypeScript client (clients/typescript) and Payments: `npm ci` only when node_modules
#     is older than the lock file, the build only when dist/ is older than the sources.
# Prints nothing but progress on stderr and fails at once, with the reason, when something is
# missing and cannot be built. Sourced by run.sh and test.sh, which then use $outboxd_bin,
# $outboxctl_bin, $orders_bin, $venv_python and $payments_js.
set -euo pipefail
checkout_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$checkout_dir/../.." && pwd)"

step() { echo "checkout: $*" >&2; }
fail() { echo "checkout: $*" >&2; exit 1; }

# --- Rust binaries -------------------------------------------------------------------------

target_dir="${CARGO_TARGET_DIR:-$repo/target}"
case "$target_dir" in /*) ;; *) target_dir="$PWD/$target_dir" ;; esac
build_mode="${CHECKOUT_BUILD:-auto}"
case "$build_mode" in auto|never|always) ;; *) fail "CHECKOUT_BUILD is auto, never or always, got '$build_mode'" ;; esac
case "${CHECKOUT_PROFILE:-}" in ''|debug|release) ;; *) fail "CHECKOUT_PROFILE is debug or release, got '$CHECKOUT_PROFILE'" ;; esac
# Where to look: the profile asked for, or both (the newer binary wins).
if [ -n "${CHECKOUT_PROFILE:-}" ]; then profiles=("$CHECKOUT_PROFILE"); else profiles=(release debug); fi
if [ -n "${CHECKOUT_PROFILE:-}" ]; then
  build_profile="$CHECKOUT_PROFILE"
elif [ -x "$target_dir/release/outboxd" ]; then
  build_profile=release
else
  build_profile=debug
fi

# The prebuilt binary `name` (empty when there is none): the newest of the profiles'.
prebuilt() {
  local name=$1 found="" p
  for p in "${profiles[@]}"; do
    local f="$target_dir/$p/$name"
    if [ -f "$f" ] && [ -x "$f" ] && { [ -z "$found" ] || [ "$f" -nt "$found" ]; }; then
      found="$f"
    fi
  done
  printf '%s' "$found"
}

# True when a Rust source of the workspace is newer than `bin` (one file is enough to tell).
stale() {
  local bin=$1
  [ -n "$(cd "$repo" && find Cargo.toml Cargo.lock proto server client examples/checkout/orders \
      -newer "$bin" -type f -not -path '*/target/*' -not -path 'server/fuzz/*' -print -quit 2>/dev/null)" ]
}

# cargo build of the packages that hold the binaries, once for all of them.
cargo_built=0
cargo_build() {
  [ "$cargo_built" = 1 ] && return 0
  if ! command -v cargo >/dev/null 2>&1; then
    return 1
  fi
  local args=()
  [ "$build_profile" = release ] && args=(--release)
  if [ "$build_profile" = release ] && [ -x "$target_dir/release/outboxd" ]; then
    step "building what is missing with cargo (release, into $target_dir, reusing the release build that is there: a few minutes)"
  else
    step "building outboxd, outboxctl and orders with cargo ($build_profile, into $target_dir; from scratch this takes about 25 minutes on 2 cores)"
  fi
  # The same invocation as CI's image check, so its build is reused.
  (cd "$repo" && cargo build -q "${args[@]}" -p outbox-server --bin outboxd) || fail "cargo build of outboxd failed (see above)"
  (cd "$repo" && cargo build -q "${args[@]}" -p outbox-client -p checkout-orders --bins) || fail "cargo build of outboxctl and orders failed (see above)"
  cargo_built=1
}

# Sets `resolved` to the binary `name` (its variable `var` overrides): prebuilt, or built now;
# fails with the reason.
resolve_bin() {
  local name=$1 var=$2
  local given="${!var:-}"
  if [ -n "$given" ]; then
    [ -f "$given" ] && [ -x "$given" ] || fail "$var=$given is not an executable file"
    resolved="$given"
    return
  fi
  local bin looked
  bin="$(prebuilt "$name")"
  looked="$(for p in "${profiles[@]}"; do printf '%s ' "$target_dir/$p/$name"; done)"
  local why=""
  if [ "$build_mode" = always ]; then
    why="CHECKOUT_BUILD=always"
  elif [ -z "$bin" ]; then
    why="missing"
  elif [ "$build_mode" = auto ] && stale "$bin"; then
    why="older than its sources"
  fi
  if [ -n "$why" ] && [ "$build_mode" != never ]; then
    if cargo_build; then
      bin="$target_dir/$build_profile/$name"
      [ -x "$bin" ] || fail "cargo built no $bin"
    elif [ -z "$bin" ]; then
      fail "$name is not built (looked for ${looked% }) and cargo is not installed: install Rust (https://rustup.rs), point CARGO_TARGET_DIR at the folder that holds the builds, or set $var"
    else
      step "warning: $bin is $why, and cargo is not installed to rebuild it; using it as it is"
    fi
  elif [ -z "$bin" ]; then
    fail "$name is not built (looked for ${looked% }) and CHECKOUT_BUILD=never"
  fi
  resolved="$bin"
}

resolve_bin outboxd OUTBOXD_BIN
outboxd_bin="$resolved"
resolve_bin outboxctl OUTBOXCTL_BIN
outboxctl_bin="$resolved"
resolve_bin checkout-orders ORDERS_BIN
orders_bin="$resolved"
step "using $outboxd_bin, $outboxctl_bin and $orders_bin"

# --- Python: Inventory's virtualenv --------------------------------------------------------

venv="${CHECKOUT_VENV:-$repo/target/checkout-venv}"
if [ ! -x "$venv/bin/python" ]; then
  step "creating the Python virtualenv $venv"
  "${PYTHON:-python3}" -m venv "$venv" || fail "cannot create a virtualenv with ${PYTHON:-python3} (on Debian: apt install python3-venv)"
fi
venv_python="$venv/bin/python"
pip=("$venv_python" -m pip install --disable-pip-version-check -q)
stamps="$venv/.checkout-stamps"
mkdir -p "$stamps"
# A hash of files' names and contents.
hash_of() { (cd "$repo" && find "$@" -type f -not -path '*/__pycache__/*' -print0 | sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1); }
# Runs the rest of the line unless stamp `key` already holds `hash`; then records it.
unless_stamped() {
  local key=$1 hash=$2
  shift 2
  if [ "$(cat "$stamps/$key" 2>/dev/null)" != "$hash" ]; then
    "$@"
    printf '%s\n' "$hash" >"$stamps/$key"
  fi
}
install_requirements() { step "installing $1 into $venv"; "${pip[@]}" -r "$1"; }
install_client() {
  step "installing the Python client (clients/python) into $venv"
  # The client as the tree has it now (pip may keep an earlier build of the same version), and
  # its dependencies when some are missing.
  "${pip[@]}" --force-reinstall --no-deps "$repo/clients/python"
  if ! "$venv_python" -m pip check >/dev/null 2>&1; then
    "${pip[@]}" "$repo/clients/python"
  fi
}
unless_stamped inventory-requirements "$(hash_of examples/checkout/inventory/requirements.txt)" \
  install_requirements "$checkout_dir/inventory/requirements.txt"
if [ "${CHECKOUT_TEST:-0}" = 1 ]; then
  unless_stamped test-requirements "$(hash_of examples/checkout/tests/requirements.txt)" \
    install_requirements "$checkout_dir/tests/requirements.txt"
fi
unless_stamped client "$(hash_of clients/python/pyproject.toml clients/python/README.md clients/python/src)" install_client

# --- TypeScript: the client and Payments ---------------------------------------------------

command -v node >/dev/null 2>&1 || fail "node is not installed (Payments needs Node.js 20 or later)"
command -v npm >/dev/null 2>&1 || fail "npm is not installed (it comes with Node.js)"
# `npm ci` in a folder, unless its node_modules is as new as its lock file.
npm_ci() {
  if [ ! -f node_modules/.package-lock.json ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
    step "npm ci in ${PWD#"$repo"/}"
    npm ci --no-audit --no-fund --loglevel=error >/dev/null
  fi
}
# True when one of the paths holds a file newer than `out` (or `out` is missing).
newer_than() {
  local out=$1
  shift
  [ ! -f "$out" ] || [ -n "$(find "$@" -newer "$out" -type f -not -path '*/src/gen/*' -print -quit)" ]
}
# Payments links to the client folder (a file: dependency). The client is built there first,
# from its own lock file, so the link points at a build of the tree as it is now with locked
# dependencies; again only when its sources or proto/ changed.
(
  cd "$repo/clients/typescript"
  npm_ci
  if newer_than dist/index.js src "$repo/proto" package.json package-lock.json buf.gen.yaml tsconfig.json; then
    step "building the TypeScript client"
    npm run -s build >/dev/null
  fi
)
(
  cd "$checkout_dir/payments"
  npm_ci
  if newer_than dist/payments.js src package.json package-lock.json tsconfig.json "$repo/clients/typescript/dist/index.js"; then
    step "building Payments"
    npm run -s build >/dev/null
  fi
)
payments_js="$checkout_dir/payments/dist/payments.js"
export outboxd_bin outboxctl_bin orders_bin venv_python payments_js
