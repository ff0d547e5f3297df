-- The Orders service's own tables, in schema `orders` of the database that outboxd uses.
-- Idempotent: applied at every start (under an advisory lock, so two starting replicas do not
-- race on it).
CREATE SCHEMA IF NOT EXISTS orders;

CREATE TABLE IF NOT EXISTS orders.orders (
    id              uuid        PRIMARY KEY,
    sku             text        NOT NULL,
    quantity        integer     NOT NULL CHECK (quantity > 0),
    amount          bigint      NOT NULL CHECK (amount > 0),
    status          text        NOT NULL DEFAULT 'PENDING' CHECK (status IN ('PENDING', 'CONFIRMED', 'CANCELLED')),
    reason          text,
    -- The saga style the order was placed in; its saga finishes in that style.
    style           text        NOT NULL CHECK (style IN ('orchestration', 'choreography')),
    -- The client's Idempotency-Key: the same key returns the same order.
    idempotency_key text        UNIQUE,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);

-- The orchestrator's state machine, one row per order placed in the orchestration style.
CREATE TABLE IF NOT EXISTS orders.sagas (
    order_id   uuid        PRIMARY KEY REFERENCES orders.orders (id),
    state      text        NOT NULL CHECK (state IN ('RESERVING_STOCK', 'CHARGING_PAYMENT', 'RELEASING_STOCK', 'DONE')),
    -- Why the saga is compensating (kept for the final OrderCancelled).
    reason     text,
    updated_at timestamptz NOT NULL DEFAULT now()
);
