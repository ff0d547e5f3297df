#!/usr/bin/env bash
# The package as someone outside the repository gets it: `npm pack` here, then in a scratch
# project in a temporary folder (no proto/, no buf) `npm install <tarball>`, and an ESM script
# (test/fixtures/pack/main.mjs) that imports it, talks to a real outboxd (OUTBOXD_BIN, on a
# SQLite file in the same folder) and prints its answers as JSON. Run by test.sh after the
# build; needs the package built (npm ci here).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
outboxd="${OUTBOXD_BIN:-$here/../../target/debug/outboxd}"
[ -x "$outboxd" ] || { echo "pack-test: no outboxd at $outboxd (set OUTBOXD_BIN)" >&2; exit 1; }

scratch="$(mktemp -d "${TMPDIR:-/tmp}/outboxd-ts-pack-XXXXXX")"
pid=""
cleanup() {
  if [ -n "$pid" ]; then kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  rm -rf "$scratch"
}
trap cleanup EXIT

# The tarball, and what it holds: the generated code and dist/, so nothing is built on install.
(cd "$here" && npm pack --silent --pack-destination "$scratch" >/dev/null)
tarball="$(ls "$scratch"/outboxd-client-*.tgz)"
contents="$(tar -tzf "$tarball")"
for f in package/dist/index.js package/dist/index.d.ts package/dist/gen/outbox/v1/admin_pb.js package/src/gen/outbox/v1/admin_pb.ts; do
  grep -qx "$f" <<<"$contents" || { echo "pack-test: $f is not in the tarball" >&2; exit 1; }
done

mkdir "$scratch/app"
cp "$here/test/fixtures/pack/main.mjs" "$scratch/app/"
cd "$scratch/app"
printf '{ "name": "pack-test-app", "private": true, "type": "module" }\n' >package.json
npm install --no-audit --no-fund --loglevel=error "$tarball" >/dev/null
[ ! -e "$scratch/proto" ] || { echo "pack-test: the scratch folder should have no proto/" >&2; exit 1; }
# Its prepare script, should npm run it there (when allowed), does nothing and succeeds.
(cd node_modules/@outboxd/client && npm run -s prepare) || { echo "pack-test: prepare fails in the installed package" >&2; exit 1; }

port="$(node -e 'const s=require("net").createServer().listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})')"
"$outboxd" serve --database-url "sqlite://$scratch/outbox.db" --listen "127.0.0.1:$port" >"$scratch/outboxd.log" 2>&1 &
pid=$!
for _ in $(seq 1 150); do
  "$outboxd" healthcheck --addr "127.0.0.1:$port" >/dev/null 2>&1 && break
  kill -0 "$pid" 2>/dev/null || { cat "$scratch/outboxd.log" >&2; echo "pack-test: outboxd exited" >&2; exit 1; }
  sleep 0.2
done

out="$(OUTBOXD_ADDR="127.0.0.1:$port" node main.mjs)"
echo "$out"
# int64 fields are strings, the answers' JSON is the canonical proto3 mapping, and both forms
# of getStats name the same consumer.
OUT="$out" node -e '
  const a = JSON.parse(process.env.OUT);
  const check = (ok, what) => { if (!ok) { console.error("pack-test: " + what); process.exit(1); } };
  check(a.consumer.name === "pack-test" && a.consumer.startFrom === "EARLIEST", "the consumer as JSON");
  check(typeof a.enqueued.seq === "string" && /^[0-9]+$/.test(a.enqueued.seq), "seq (int64) is a decimal string");
  check(a.stats.consumers?.[0]?.consumer === "pack-test", "getStats({consumer}) answers for that consumer");
  check(JSON.stringify(a.same.consumers.map((c) => c.consumer)) === JSON.stringify(["pack-test"]), "getStats(name) answers for that consumer too");
  check(a.message.message.messageId === a.enqueued.messageId && a.message.message.seq === a.enqueued.seq, "getMessage as JSON");
'
echo "pack-test: ok ($(basename "$tarball"), installed outside the repository)"
