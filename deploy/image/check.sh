#!/usr/bin/env bash
# Builds the runtime stage of deploy/Dockerfile from a release binary and checks the image, on a
# machine with no container engine, no registry and no container runtime:
#
#   deploy/image/check.sh target/release/outboxd
#
# 1. A stand-in for the runtime base image (distroless cc-debian12:nonroot) is assembled from
#    this machine's Debian 12 files: the shared libraries the binary links, CA certificates, the
#    nonroot user (65532) and a /tmp, and committed with `buildah` (vfs storage, no daemon).
# 2. `buildah bud` builds the Dockerfile's runtime stage on it, the builder stage replaced by a
#    build context holding what that stage makes (/out/usr/local/bin/outboxd); no RUN step runs.
# 3. The image's config is checked (user, entrypoint, command, ports), its root filesystem is
#    unpacked, and the binary runs from it under chroot as user 65532, read-only where the
#    machine allows a read-only bind mount: --help, then, if PostgreSQL is reachable,
#    `outboxd migrate` and `outboxd serve` on a scratch database, answered by
#    `outboxd healthcheck` from inside the image and a metrics scrape from outside.
#
# What this cannot check: the builder stage (it needs a container runtime to RUN cargo) and the
# real base image (it needs a registry); see docs/deploying.md, "The image".
set -euo pipefail
cd "$(dirname "$0")/../.."

bin=$(realpath "${1:?usage: deploy/image/check.sh PATH-TO-RELEASE-outboxd}")
pg_url="${OUTBOX_TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
work=$(mktemp -d)
b() { buildah --root "$work/storage" --runroot "$work/run" --storage-driver vfs "$@"; }
cleanup() {
  status=$?
  set +e
  if [ -n "${srv_pid:-}" ]; then
    kill "$srv_pid" 2>/dev/null
    wait "$srv_pid" 2>/dev/null
  fi
  if [ -n "${ro_root:-}" ] && ! umount "$ro_root"; then
    echo "image check: could not unmount $ro_root; leaving $work" >&2
    exit 1
  fi
  [ -n "${scratch_db:-}" ] && psql "$pg_url" -qc "DROP DATABASE IF EXISTS \"$scratch_db\" WITH (FORCE)"
  b unmount --all >/dev/null 2>&1
  b rm --all >/dev/null 2>&1
  rm -rf "$work"
  exit "$status"
}
trap cleanup EXIT
fail() { echo "image check: $*" >&2; exit 1; }
start=$(date +%s)

# 1. The base: what distroless cc-debian12:nonroot holds that outboxd uses.
base="$work/base"
mkdir -p "$base/etc/ssl/certs" "$base/tmp" "$base/home/nonroot"
chmod 1777 "$base/tmp"
chown 65532:65532 "$base/home/nonroot"
for lib in $(ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\/.*ld-linux/ { print $1 }'); do
  cp -L --parents "$lib" "$base/"
done
# The dynamic loader must also be at the path the binary names (e.g. /lib64 → /usr/lib64).
interp=$(readelf -l "$bin" | sed -n 's/.*Requesting program interpreter: \(.*\)]/\1/p')
[ -e "$base$interp" ] || cp -L --parents "$interp" "$base/"
cp -L /etc/ssl/certs/ca-certificates.crt "$base/etc/ssl/certs/"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$base/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$base/etc/group"
c=$(b from scratch)
b copy "$c" "$base/" / >/dev/null
b commit -q "$c" localhost/outboxd-runtime-base >/dev/null

# 2. The Dockerfile's runtime stage on that base.
install -D -m 0755 "$bin" "$work/builder/out/usr/local/bin/outboxd"
mkdir -p "$work/context"
b bud -q --pull=never --target runtime \
  --build-arg RUNTIME_IMAGE=localhost/outboxd-runtime-base \
  --build-context builder="$work/builder" \
  -f deploy/Dockerfile -t localhost/outboxd:check "$work/context" >/dev/null

# 3. The image: config, files, and the binary running from its root filesystem.
b inspect --type image localhost/outboxd:check >"$work/image.json"
python3 - "$work/image.json" <<'PY'
import json, sys
cfg = json.load(open(sys.argv[1]))["OCIv1"]["config"]
want = {"User": "65532:65532", "Entrypoint": ["/usr/local/bin/outboxd"], "Cmd": ["serve"]}
bad = [f"{k} is {cfg.get(k)!r}, not {v!r}" for k, v in want.items() if cfg.get(k) != v]
ports = sorted(cfg.get("ExposedPorts", {}))
if ports != ["50051/tcp", "8081/tcp", "9090/tcp"]:
    bad.append(f"exposed ports are {ports}")
env = dict(e.split("=", 1) for e in cfg.get("Env", []))
if env.get("OUTBOXD_LISTEN") != "0.0.0.0:50051":
    bad.append(f"OUTBOXD_LISTEN is {env.get('OUTBOXD_LISTEN')!r}")
if bad:
    sys.exit("image check: " + "; ".join(bad))
PY
c=$(b from --pull=never localhost/outboxd:check)
root=$(b mount "$c")
for f in bin/sh usr/bin/sh bin/bash usr/bin/bash bin/busybox; do
  [ -e "$root/$f" ] && fail "the image has a shell: /$f"
done
[ "$(stat -c '%u %a' "$root/usr/local/bin/outboxd")" = "0 755" ] ||
  fail "/usr/local/bin/outboxd should be root-owned, mode 755: $(stat -c '%u %a' "$root/usr/local/bin/outboxd")"
files=$(find "$root" -type f | wc -l)

# Read-only, like readOnlyRootFilesystem, when the machine lets us bind-mount.
run_root="$root"
ro_note="writable root (no read-only bind mount here)"
if mkdir -p "$work/ro" && mount --bind "$root" "$work/ro" 2>/dev/null; then
  ro_root="$work/ro"
  if mount -o remount,bind,ro "$ro_root" 2>/dev/null; then
    run_root="$ro_root"
    ro_note="read-only root"
  fi
fi
in_image() { chroot --userspec=65532:65532 "$run_root" /usr/local/bin/outboxd "$@"; }
in_image --help | grep -q 'serve' || fail "outboxd --help from the image does not list serve"
in_image --version >/dev/null || fail "outboxd --version failed in the image"

served="not run (PostgreSQL unreachable at $pg_url)"
if pg_isready -d "$pg_url" -q 2>/dev/null; then
  scratch_db="outboxd_image_check_$$"
  db_url="${pg_url%/*}/$scratch_db"
  in_image migrate --database-url "$db_url" 2>"$work/migrate.log" ||
    fail "outboxd migrate from the image failed: $(tail -n 5 "$work/migrate.log")"
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  mport=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  # chroot execs outboxd, so this pid is outboxd's (a shell function here would fork).
  chroot --userspec=65532:65532 "$run_root" /usr/local/bin/outboxd serve --no-migrate --database-url "$db_url" --listen "127.0.0.1:$port" \
    --metrics-listen "127.0.0.1:$mport" 2>"$work/serve.log" &
  srv_pid=$!
  ok=""
  for _ in $(seq 1 100); do
    if in_image healthcheck --addr "127.0.0.1:$port" --timeout 1s >/dev/null 2>&1; then ok=1; break; fi
    kill -0 "$srv_pid" 2>/dev/null || break
    sleep 0.1
  done
  [ -n "$ok" ] || fail "outboxd serve from the image never became healthy: $(tail -n 5 "$work/serve.log")"
  python3 -c "import sys, urllib.request; sys.exit(0 if b'outboxd_' in urllib.request.urlopen('http://127.0.0.1:$mport/metrics', timeout=5).read() else 1)" ||
    fail "no outboxd metrics from the image's outboxd"
  kill -TERM "$srv_pid"
  wait "$srv_pid" || fail "outboxd from the image did not exit cleanly on SIGTERM: $(tail -n 5 "$work/serve.log")"
  srv_pid=""
  served="migrate, serve, healthcheck SERVING, metrics scraped, clean SIGTERM exit"
fi
echo "image check: runtime stage built with buildah ($files files, user 65532, no shell, $ro_note); --help; $served; $(($(date +%s) - start)) s"
