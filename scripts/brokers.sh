#!/usr/bin/env bash
# Makes sure the brokers that the sink tests publish to are up: RabbitMQ on 127.0.0.1:5672 and
# NATS with JetStream on 127.0.0.1:4222 (or wherever OUTBOX_TEST_AMQP_URL and
# OUTBOX_TEST_NATS_URL point; those are only checked, not started). A local one that is
# installed but stopped is started. Exits non-zero, naming the broker, if one stays unreachable.
set -euo pipefail

# host:port of a URL such as amqp://user:pass@host:port/vhost.
host_port() {
  local rest=${1#*://}
  rest=${rest%%/*}
  rest=${rest##*@}
  echo "$rest"
}

reachable() {
  local host=${1%:*} port=${1##*:}
  (exec 3<>"/dev/tcp/$host/$port") 2>/dev/null
}

wait_for() {
  local name=$1 addr=$2
  for _ in $(seq 1 60); do
    reachable "$addr" && return 0
    sleep 1
  done
  echo "$name is not reachable at $addr" >&2
  return 1
}

amqp=$(host_port "${OUTBOX_TEST_AMQP_URL:-amqp://127.0.0.1:5672/}")
nats=$(host_port "${OUTBOX_TEST_NATS_URL:-nats://127.0.0.1:4222}")

if ! reachable "$amqp" && [ -z "${OUTBOX_TEST_AMQP_URL:-}" ]; then
  if command -v rabbitmq-server >/dev/null 2>&1; then
    echo "starting RabbitMQ" >&2
    rabbitmq-server -detached || true
  else
    echo "RabbitMQ is not running and rabbitmq-server is not installed (Debian: rabbitmq-server)" >&2
  fi
fi
if ! reachable "$nats" && [ -z "${OUTBOX_TEST_NATS_URL:-}" ]; then
  if [ -x /usr/sbin/nats-server ]; then
    echo "starting NATS with JetStream" >&2
    mkdir -p /var/lib/nats-server
    start-stop-daemon --start --oknodo --background --exec /usr/sbin/nats-server -- \
      -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log
  else
    echo "NATS is not running and nats-server is not installed (Debian: nats-server)" >&2
  fi
fi
wait_for RabbitMQ "$amqp"
wait_for "NATS" "$nats"
