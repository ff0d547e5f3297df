// Payments, the checkout saga's third service: charges an order's amount, or declines it above
// a limit (--limit, PAYMENTS_LIMIT, default 1000).
//
// It serves both saga styles at once (ADR 0037): it obeys `ChargePayment` on
// `checkout.payments.commands` and answers the orchestrator on `checkout.orders.replies`, and
// it reacts to the choreography's `StockReserved` on `checkout.inventory.events` with
// `PaymentCharged` or `PaymentFailed` on `checkout.payments.events`. Each message is handled in
// one transaction on its own schema `payments`: the transactional ack, the payment row and the
// outgoing message commit together, so a redelivery never charges twice.
//
// HTTP: `GET /payments/{order_id}` -> {"order_id", "amount", "status", "reason"}, `GET /health`.
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { parseArgs } from "node:util";

import { ackIn, enqueue, Subscriber, type Delivery } from "@outboxd/client";
import pg from "pg";

const INVENTORY_EVENTS = "checkout.inventory.events";
const PAYMENTS_EVENTS = "checkout.payments.events";
const PAYMENTS_COMMANDS = "checkout.payments.commands";
const ORDERS_REPLIES = "checkout.orders.replies";

/** (topic, type) -> where the answer goes: a command is answered to the orchestrator, an event
 * is followed by an event of Payments' own. */
const ROUTES = new Map<string, string>([
  [`${PAYMENTS_COMMANDS} ChargePayment`, ORDERS_REPLIES],
  [`${INVENTORY_EVENTS} StockReserved`, PAYMENTS_EVENTS],
]);

const SCHEMA = `
CREATE SCHEMA IF NOT EXISTS payments;
-- One row per order Payments was asked to charge: charged, or declined with the reason.
CREATE TABLE IF NOT EXISTS payments.payments (
    order_id   uuid        PRIMARY KEY,
    amount     bigint      NOT NULL CHECK (amount > 0),
    status     text        NOT NULL CHECK (status IN ('charged', 'declined')),
    reason     text,
    created_at timestamptz NOT NULL DEFAULT now()
);
`;

const UUID = /^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$/;

/** A payload without the fields its type needs: nacked, dead after max_deliveries. */
class BadMessage extends Error {}

function log(level: "info" | "warn" | "error", message: string): void {
  process.stderr.write(`${new Date().toISOString()} ${level.toUpperCase()} payments: ${message}\n`);
}

/** The test hook of ADR 0038: with CHECKOUT_TEST_PAUSE_DIR and CHECKOUT_TEST_PAUSE=charge set,
 * a charge creates `<dir>/charge.<order id>` once it has written everything, and waits before
 * committing until `<dir>/charge.<order id>.go` exists; with CHECKOUT_TEST_PAUSE_AT=after-commit,
 * just after committing instead. */
class Pause {
  private readonly dir = process.env.CHECKOUT_TEST_PAUSE_DIR || undefined;
  readonly step = this.dir ? process.env.CHECKOUT_TEST_PAUSE || undefined : undefined;
  readonly phase = process.env.CHECKOUT_TEST_PAUSE_AT === "after-commit" ? "after-commit" : "before-commit";

  async at(phase: string, step: string, orderId: string): Promise<void> {
    if (this.dir === undefined || step !== this.step || phase !== this.phase) {
      return;
    }
    writeFileSync(join(this.dir, `${step}.${orderId}`), "");
    const go = join(this.dir, `${step}.${orderId}.go`);
    log("warn", `test pause: holding ${step} of ${orderId} (${phase}) until ${go} exists`);
    while (!existsSync(go)) {
      await sleep(10);
    }
  }
}

interface Options {
  databaseUrl: string;
  outboxd: string;
  host: string;
  port: number;
  consumer: string;
  concurrency: number;
  limit: number;
}

function options(): Options {
  const { values } = parseArgs({
    options: {
      "database-url": { type: "string", default: process.env.DATABASE_URL },
      outboxd: { type: "string", default: process.env.OUTBOXD_SERVER ?? "127.0.0.1:50051" },
      listen: { type: "string", default: process.env.PAYMENTS_LISTEN ?? "127.0.0.1:8082" },
      consumer: { type: "string", default: process.env.PAYMENTS_CONSUMER ?? "payments" },
      concurrency: { type: "string", default: "8" },
      limit: { type: "string", default: process.env.PAYMENTS_LIMIT ?? "1000" },
    },
  });
  const fail = (message: string): never => {
    process.stderr.write(`payments: ${message}\n`);
    process.exit(2);
  };
  const databaseUrl = values["database-url"] || fail("--database-url (or DATABASE_URL) is required");
  const listen = values.listen ?? "";
  const colon = listen.lastIndexOf(":");
  const port = Number(listen.slice(colon + 1));
  if (colon < 0 || !Number.isInteger(port) || port <= 0 || port > 65535) {
    fail(`--listen must be host:port, got ${JSON.stringify(listen)}`);
  }
  const concurrency = Number(values.concurrency);
  if (!Number.isInteger(concurrency) || concurrency < 1 || concurrency > 256) {
    fail(`--concurrency must be an integer from 1 to 256, got ${JSON.stringify(values.concurrency)}`);
  }
  const limit = Number(values.limit);
  if (!Number.isSafeInteger(limit) || limit < 0) {
    fail(`--limit (PAYMENTS_LIMIT) must be a non-negative integer, got ${JSON.stringify(values.limit)}`);
  }
  return {
    databaseUrl,
    outboxd: values.outboxd ?? "127.0.0.1:50051",
    host: listen.slice(0, colon).replace(/^\[|\]$/g, "") || "127.0.0.1",
    port,
    consumer: values.consumer ?? "payments",
    concurrency,
    limit,
  };
}

function parse(d: Delivery): { orderId: string; amount: number } {
  let msg: unknown;
  try {
    msg = JSON.parse(Buffer.from(d.payload).toString("utf8"));
  } catch (e) {
    throw new BadMessage(`${d.topic} ${d.type}: the payload is not JSON: ${(e as Error).message}`);
  }
  const m = msg as { order_id?: unknown; amount?: unknown };
  if (typeof m !== "object" || m === null || typeof m.order_id !== "string" || !UUID.test(m.order_id)) {
    throw new BadMessage(`${d.topic} ${d.type}: order_id must be a UUID, got ${JSON.stringify(m?.order_id)}`);
  }
  if (typeof m.amount !== "number" || !Number.isSafeInteger(m.amount) || m.amount <= 0) {
    throw new BadMessage(`${d.topic} ${d.type}: amount must be a positive integer, got ${JSON.stringify(m.amount)}`);
  }
  return { orderId: m.order_id.toLowerCase(), amount: m.amount };
}

class Payments {
  constructor(
    readonly pool: pg.Pool,
    readonly limit: number,
    readonly pause: Pause,
  ) {}

  async setup(): Promise<void> {
    const client = await this.pool.connect();
    try {
      await client.query("BEGIN");
      await client.query("SELECT pg_advisory_xact_lock(hashtext('checkout.payments.schema'))");
      await client.query(SCHEMA);
      await client.query("COMMIT");
    } catch (e) {
      await client.query("ROLLBACK").catch(() => undefined);
      throw e;
    } finally {
      client.release();
    }
  }

  /** One delivery: the transactional ack, the payment and its answer in one transaction. */
  readonly handle = async (d: Delivery): Promise<void> => {
    const replyTo = ROUTES.get(`${d.topic} ${d.type}`);
    const client = await this.pool.connect();
    let broken: Error | undefined;
    let committed: string | undefined;
    try {
      await client.query("BEGIN");
      if (!(await ackIn(client, d.consumer, d.messageId)) || replyTo === undefined) {
        // Another delivery of this message did it, or it is another service's cue.
        await client.query("COMMIT");
        return;
      }
      const { orderId, amount } = parse(d);
      await this.charge(client, orderId, amount, replyTo);
      await this.pause.at("before-commit", "charge", orderId);
      await client.query("COMMIT");
      committed = orderId;
    } catch (e) {
      await client.query("ROLLBACK").catch((r: Error) => (broken = r));
      throw e;
    } finally {
      // A connection whose ROLLBACK failed is closed rather than handed out again.
      client.release(broken);
    }
    if (committed !== undefined) {
      await this.pause.at("after-commit", "charge", committed);
    }
  };

  private async charge(client: pg.PoolClient, orderId: string, amount: number, replyTo: string): Promise<void> {
    const declined = amount > this.limit;
    const reason = declined ? `payment declined: amount ${amount} exceeds the limit of ${this.limit}` : null;
    await client.query("INSERT INTO payments.payments (order_id, amount, status, reason) VALUES ($1, $2, $3, $4)", [
      orderId,
      amount,
      declined ? "declined" : "charged",
      reason,
    ]);
    const answer = declined ? { order_id: orderId, amount, reason } : { order_id: orderId, amount };
    await enqueue(client, {
      topic: replyTo,
      type: declined ? "PaymentFailed" : "PaymentCharged",
      payload: JSON.stringify(answer),
      headers: { "content-type": "application/json" },
      orderingKey: orderId,
    });
    log("info", declined ? `declined order ${orderId}: ${reason}` : `charged ${amount} for order ${orderId}`);
  }
}

function reply(res: ServerResponse, status: number, body: unknown): void {
  res.writeHead(status, { "content-type": "application/json" });
  res.end(JSON.stringify(body));
}

function http(payments: Payments) {
  return async (req: IncomingMessage, res: ServerResponse): Promise<void> => {
    try {
      const path = new URL(req.url ?? "/", "http://localhost").pathname;
      if (req.method !== "GET") {
        return reply(res, 405, { error: `${req.method} is not served; this API is read-only` });
      }
      if (path === "/health") {
        await payments.pool.query("SELECT 1");
        return reply(res, 200, { status: "ok" });
      }
      const m = /^\/payments\/([^/]+)$/.exec(path);
      if (m === null) {
        return reply(res, 404, { error: `no route ${path}` });
      }
      const orderId = decodeURIComponent(m[1] ?? "");
      if (!UUID.test(orderId)) {
        return reply(res, 400, { error: `an order id is a UUID, got ${JSON.stringify(orderId)}` });
      }
      const { rows } = await payments.pool.query(
        "SELECT order_id::text, amount::text, status, reason FROM payments.payments WHERE order_id = $1",
        [orderId],
      );
      const row = rows[0];
      if (row === undefined) {
        return reply(res, 404, { error: `no payment for order ${orderId}` });
      }
      reply(res, 200, {
        order_id: row.order_id,
        amount: Number(row.amount),
        status: String(row.status).toUpperCase(),
        reason: row.reason,
      });
    } catch (e) {
      log("error", `request failed: ${(e as Error).message}`);
      reply(res, 503, { error: "the payment store is unavailable" });
    }
  };
}

async function main(): Promise<void> {
  const opts = options();
  const pause = new Pause();
  if (pause.step !== undefined) {
    log("warn", `CHECKOUT_TEST_PAUSE is set: a test hook holds step ${pause.step} (${pause.phase})`);
  }
  const pool = new pg.Pool({ connectionString: opts.databaseUrl, max: opts.concurrency + 2 });
  pool.on("error", (e) => log("warn", `idle database connection failed: ${e.message}`));
  const payments = new Payments(pool, opts.limit, pause);
  await payments.setup();

  const ca = process.env.OUTBOXD_TLS_CA;
  const subscriber = new Subscriber({
    server: opts.outboxd,
    consumer: opts.consumer,
    handler: payments.handle,
    concurrency: opts.concurrency,
    token: process.env.OUTBOXD_TOKEN || undefined,
    tls: ca ? { ca: readFileSync(ca) } : undefined,
    logger: { info: (m) => log("info", m), warn: (m) => log("warn", m) },
  });
  const server = createServer((req, res) => void http(payments)(req, res));
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(opts.port, opts.host, resolve);
  });
  log("info", `payments serving on ${opts.host}:${opts.port}, limit ${opts.limit}, subscribed as ${opts.consumer}`);

  const stop = (): void => {
    log("info", "stopping");
    void subscriber.stop();
  };
  process.once("SIGTERM", stop);
  process.once("SIGINT", stop);
  try {
    await subscriber.run();
  } finally {
    server.close();
    await pool.end();
    log("info", "stopped");
  }
}

main().catch((e: unknown) => {
  log("error", (e as Error).stack ?? String(e));
  process.exit(1);
});
