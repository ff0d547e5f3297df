#!/usr/bin/env bash
# Creates the three consumers of the checkout saga on the outboxd at OUTBOXD_SERVER (default
# http://127.0.0.1:50051), with the outboxctl at OUTBOXCTL (default: the one on the PATH);
# OUTBOXD_TOKEN, OUTBOXD_TLS_CA and the other outboxctl variables apply. Safe to run again:
# creating a consumer with the same definition succeeds.
#
# This is a deployment step, not something the services do: creating consumers needs the
# admin:write permission, which the services themselves never get (ADR 0037). Each consumer
# starts from the EARLIEST message retained, so messages enqueued before a consumer existed
# are still delivered to it.
set -euo pipefail
ctl="${OUTBOXCTL:-outboxctl}"

create() {
  local name=$1
  shift
  local topics=()
  for t in "$@"; do topics+=(--topic "$t"); done
  # 10 deliveries with backoff from 200 ms to 10 s before a message is dead; a handler that
  # dies mid-message loses its lease when its stream breaks, or after 15 s at most.
  "$ctl" consumers create "$name" "${topics[@]}" --max-deliveries 10 --backoff-base 200ms \
    --backoff-max 10s --ack-deadline 15s --start-from earliest >/dev/null
  echo "consumer $name: $*"
}

# Orders hears the answers to its commands (orchestration) and the events that settle an
# order (choreography).
create orders checkout.orders.replies checkout.inventory.events checkout.payments.events
# Inventory obeys its commands and reacts to OrderPlaced and PaymentFailed.
create inventory checkout.inventory.commands checkout.orders.events checkout.payments.events
# Payments obeys its commands and reacts to StockReserved.
create payments checkout.payments.commands checkout.inventory.events
