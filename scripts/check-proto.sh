#!/usr/bin/env bash
# The wire contract's guard (ADR 0036): `buf lint` on proto/, then `buf breaking` of the working
# tree's proto/ against a baseline commit, so that a renamed, renumbered, retyped or removed
# field, message, enum value or RPC fails, whether the change is uncommitted or committed.
#
# The baseline:
#   - on a branch that has diverged from main: the merge-base of HEAD and main (what the
#     branch would change on main);
#   - on main itself (HEAD is main, or behind it; CI runs on main): HEAD~1's first parent, so
#     that the newest commit (a merge, say) is checked along with anything uncommitted;
#   - when that commit is not in the clone (shallow, or the first commit): HEAD, which checks
#     only uncommitted changes; the script says so.
# BUF_AGAINST=<commit> chooses the baseline by hand.
#
# buf comes from clients/typescript's locked npm packages (`npm ci` there, run if missing).
set -euo pipefail
cd "$(dirname "$0")/.."

buf=clients/typescript/node_modules/.bin/buf
if ! [ -x "$buf" ]; then
  (cd clients/typescript && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error)
fi

"$buf" lint proto
echo "buf lint: proto/ passes"

commit() { git rev-parse --verify --quiet "$1^{commit}" 2>/dev/null; }

head=$(commit HEAD)
main=$(commit main || commit origin/main || true)
if [ -n "${BUF_AGAINST:-}" ]; then
  base=$(commit "$BUF_AGAINST") || { echo "BUF_AGAINST=$BUF_AGAINST is not a commit in this clone" >&2; exit 1; }
  why="BUF_AGAINST"
elif [ -n "$main" ] && mb=$(git merge-base HEAD "$main" 2>/dev/null) && [ "$mb" != "$head" ]; then
  base=$mb
  why="the merge-base of HEAD and main"
elif base=$(commit HEAD~1); then
  why="HEAD~1 (HEAD is on main)"
else
  base=$head
  why="HEAD, because HEAD~1 is not in this clone (shallow or first commit): only uncommitted changes are checked"
fi
echo "buf breaking: proto/ against $(git rev-parse --short "$base"), $why"

baseline=$(mktemp -d)
trap 'rm -rf "$baseline"' EXIT
if ! git cat-file -e "$base:proto/outbox/v1" 2>/dev/null; then
  echo "buf breaking: the baseline has no proto/outbox/v1; nothing to compare"
  exit 0
fi
git archive "$base" proto | tar -x -C "$baseline"
"$buf" breaking proto --against "$baseline/proto"
echo "buf breaking: no breaking change"
