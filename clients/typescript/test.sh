#!/usr/bin/env bash
# The TypeScript client's tests: installs the locked packages (which runs `prepare`: code
# generated from proto/ and dist/ compiled), then `node --test` against real outboxd processes
# and PostgreSQL (OUTBOX_TEST_DATABASE_URL, default postgres://postgres@127.0.0.1:5432/postgres;
# OUTBOXD_BIN, default target/debug/outboxd, built if missing), including every example of
# docs/clients/typescript.md; then scripts/pack-test.sh: the packed tarball installed outside
# the repository, against a real outboxd.
set -euo pipefail
cd "$(dirname "$0")"
# src/contract.ts and the statements the docs quote match the client contract (contract/, ADR 0084).
python3 ../../scripts/contract.py --check
npm ci --no-audit --no-fund
npm test
if [ -z "${OUTBOXD_BIN:-}" ]; then
  # The binary the tests used (they build it when it is missing).
  export OUTBOXD_BIN="$PWD/../../target/debug/outboxd"
fi
bash scripts/pack-test.sh
