// The Subscriber against a real outboxd on PostgreSQL: ack, nack, dead letters, the concurrency
// bound, lease extension, graceful stop, reconnect, and errors that end run().
import assert from "node:assert/strict";
import { after, test } from "node:test";

import { Code, ConnectError, MAX_ERROR_BYTES, Subscriber, enqueue, pb, type Delivery } from "@outboxd/client";

import { Outboxd, eventually, freePort, startStack, unique } from "./harness.js";

// Expired leases are found within 100 ms, so that a lease that was not extended shows.
const stack = await startStack(["--sweep-interval", "100ms"]);
after(() => stack.close());
const { db, outboxd, admin, sql } = stack;

/** A consumer of its own topic, and a function that enqueues n messages to it (committed). */
async function setUp(options: { maxDeliveries?: number; ackDeadline?: number } = {}) {
  const name = unique("c");
  const topic = `t.${name}`;
  await admin.createConsumer({
    name,
    topics: [topic],
    maxDeliveries: options.maxDeliveries ?? 0,
    backoffBase: 10,
    backoffMax: 20,
    ackDeadline: options.ackDeadline,
  });
  const send = async (n: number, type = "T"): Promise<string[]> => {
    await sql.query("BEGIN");
    const ids: string[] = [];
    for (let i = 0; i < n; i++) {
      ids.push(await enqueue(sql, { topic, type, payload: `${i}` }));
    }
    await sql.query("COMMIT");
    return ids;
  };
  return { name, topic, send };
}

function gate() {
  let open!: () => void;
  const opened = new Promise<void>((resolve) => (open = resolve));
  return { open, opened };
}

async function stats(name: string): Promise<pb.ConsumerStats> {
  const s = (await admin.getStats(name)).consumers.find((c) => c.consumer === name);
  assert.ok(s, `stats of ${name}`);
  return s;
}

async function state(id: string, consumer: string): Promise<pb.DeliveryState | undefined> {
  return (await admin.getMessage(id)).deliveries.find((d) => d.consumer === consumer);
}

test("a resolved handler acks; a throwing one nacks with its message, comes back with deliveryCount 2, and is dead after maxDeliveries", async () => {
  const c = await setUp({ maxDeliveries: 3 });
  const seen: Array<[string, number]> = [];
  const subscriber = new Subscriber({
    server: outboxd.addr,
    consumer: c.name,
    handler: async (d: Delivery) => {
      seen.push([d.type, d.deliveryCount]);
      assert.equal(d.consumer, c.name);
      assert.equal(d.topic, c.topic);
      assert.ok(d.payload instanceof Uint8Array);
      if (d.type === "Bad") {
        throw new Error(`boom on attempt ${d.deliveryCount}`);
      }
    },
  });
  const running = subscriber.run();
  const [good] = await c.send(1, "Good");
  const [bad] = await c.send(1, "Bad");
  await eventually("the bad message dead", 15_000, async () => (await state(bad!, c.name))?.state === pb.DeliveryState_State.DEAD);
  await eventually("the good message acked", 5_000, async () => (await state(good!, c.name))?.state === pb.DeliveryState_State.ACKED);
  await subscriber.stop();
  await running;

  assert.deepEqual(seen.filter(([t]) => t === "Good"), [["Good", 1]]);
  assert.deepEqual(seen.filter(([t]) => t === "Bad"), [["Bad", 1], ["Bad", 2], ["Bad", 3]]);
  const dead = await admin.listDeadLetters(c.name);
  assert.equal(dead.deadLetters.length, 1);
  assert.equal(dead.deadLetters[0]?.message?.messageId, bad);
  assert.equal(dead.deadLetters[0]?.deliveryCount, 3);
  assert.equal(dead.deadLetters[0]?.lastError, "boom on attempt 3");
  const s = await stats(c.name);
  assert.equal(s.dead, 1n);
  assert.equal(s.acked, 1n);
});

test("at most `concurrency` handlers run at once, and the stream holds no more leases than that", async () => {
  const c = await setUp();
  const ids = await c.send(40);
  let active = 0;
  let most = 0;
  let done = 0;
  let hold = gate();
  const subscriber = new Subscriber({
    server: outboxd.endpoint,
    consumer: c.name,
    concurrency: 4,
    handler: async () => {
      active++;
      most = Math.max(most, active);
      await hold.opened;
      // Handler work that overlaps with the others once the gate is open.
      await new Promise((resolve) => setTimeout(resolve, 5));
      active--;
      done++;
    },
  });
  const running = subscriber.run();
  // All handlers held: the server has leased exactly `concurrency` deliveries (max_in_flight).
  await eventually("4 handlers running", 10_000, () => active === 4);
  const held = await eventually("4 in flight", 5_000, async () => {
    const s = await stats(c.name);
    return s.inFlight === 4n && s.backlog === 36n ? s : undefined;
  });
  assert.equal(held.inFlight, 4n);
  hold.open();
  await eventually("all 40 handled", 20_000, () => done === 40);
  await eventually("all 40 acked", 5_000, async () => (await stats(c.name)).acked === 40n);
  await subscriber.stop();
  await running;
  assert.equal(most, 4, "the bound is reached and never passed");
  assert.equal(ids.length, 40);
  hold = gate();
});

test("a handler slower than the ack deadline keeps its lease: extended, never redelivered", async () => {
  const c = await setUp({ ackDeadline: 300 });
  const counts: number[] = [];
  let finished = false;
  const subscriber = new Subscriber({
    server: outboxd.addr,
    consumer: c.name,
    handler: async (d) => {
      counts.push(d.deliveryCount);
      // Five ack deadlines.
      await new Promise((resolve) => setTimeout(resolve, 1500));
      finished = true;
    },
  });
  const running = subscriber.run();
  const [id] = await c.send(1);
  await eventually("the slow handler done", 10_000, () => finished);
  await eventually("acked", 5_000, async () => (await state(id!, c.name))?.state === pb.DeliveryState_State.ACKED);
  await subscriber.stop();
  await running;
  assert.deepEqual(counts, [1], "handled once, on the first delivery");
  assert.equal((await state(id!, c.name))?.deliveryCount, 1);
});

test("stop() lets running handlers finish and acks them; what was not started is released without counting as a failure", async () => {
  // One delivery each: were a release counted as a failure, the rest would be dead.
  const c = await setUp({ maxDeliveries: 1 });
  const ids = await c.send(5);
  const hold = gate();
  const started: string[] = [];
  const subscriber = new Subscriber({
    server: outboxd.addr,
    consumer: c.name,
    concurrency: 2,
    handler: async (d) => {
      started.push(d.messageId);
      await hold.opened;
    },
  });
  const running = subscriber.run();
  await eventually("2 handlers running", 10_000, () => started.length === 2);
  let stopped = false;
  const stopping = subscriber.stop().then(() => (stopped = true));
  for (let i = 0; i < 20; i++) {
    await new Promise((resolve) => setImmediate(resolve));
  }
  assert.equal(stopped, false, "stop() waits for the running handlers");
  hold.open();
  await stopping;
  await running;
  assert.equal(started.length, 2, "no handler started after stop()");
  for (const id of started) {
    assert.equal((await state(id, c.name))?.state, pb.DeliveryState_State.ACKED, "a finished handler is acked");
  }
  const rest = ids.filter((id) => !started.includes(id));
  for (const id of rest) {
    assert.equal((await state(id, c.name))?.state, pb.DeliveryState_State.PENDING, "not started: pending, not dead");
  }

  // The rest are delivered to the next subscriber.
  const seen: string[] = [];
  const next = new Subscriber({ server: outboxd.addr, consumer: c.name, handler: (d) => void seen.push(d.messageId) });
  const again = next.run();
  await eventually("the other 3 delivered", 10_000, () => seen.length === 3);
  await next.stop();
  await again;
  assert.deepEqual(new Set(seen), new Set(rest));
  assert.equal((await stats(c.name)).dead, 0n);
});

test("aborting the `signal` option stops the subscriber like stop()", async () => {
  const c = await setUp();
  const abort = new AbortController();
  const handled: string[] = [];
  const subscriber = new Subscriber({ server: outboxd.addr, consumer: c.name, signal: abort.signal, handler: (d) => void handled.push(d.messageId) });
  const running = subscriber.run();
  const [id] = await c.send(1);
  await eventually("handled", 10_000, () => handled.includes(id!));
  abort.abort();
  await running;
  assert.equal((await state(id!, c.name))?.state, pb.DeliveryState_State.ACKED);
  await eventually("the stream closed", 5_000, async () => (await stats(c.name)).streams === 0);
});

test("the subscriber reconnects after outboxd is killed and started again on the same port", async () => {
  const c = await setUp();
  const port = await freePort();
  const listen = ["--listen", `127.0.0.1:${port}`];
  let first: Outboxd | undefined = await Outboxd.start(db.url, listen);
  const handled: string[] = [];
  const warnings: string[] = [];
  const subscriber = new Subscriber({
    server: `http://127.0.0.1:${port}`,
    consumer: c.name,
    reconnectMinMs: 50,
    reconnectMaxMs: 500,
    logger: { info: () => undefined, warn: (m) => void warnings.push(m) },
    handler: (d) => void handled.push(d.messageId),
  });
  let ended: unknown = "running";
  const running = subscriber.run().then(
    () => (ended = "resolved"),
    (e) => (ended = e),
  );
  try {
    const [a] = await c.send(1);
    await eventually("the first message handled", 10_000, () => handled.includes(a!));
    await first.kill();
    first = undefined;
    const [b] = await c.send(1);
    await eventually("a reconnect attempt logged", 10_000, () => warnings.length > 0);
    first = await Outboxd.start(db.url, listen);
    await eventually("the second message handled after the restart", 20_000, () => handled.includes(b!));
    assert.equal(ended, "running", "run() goes on through the outage");
    assert.match(warnings[0]!, new RegExp(`subscription of consumer ${c.name} was lost`));
  } finally {
    await subscriber.stop();
    await running;
    await first?.kill();
  }
  assert.equal(ended, "resolved");
});

test("run() rejects on errors that reconnecting cannot fix: an unknown consumer is NOT_FOUND", async () => {
  const subscriber = new Subscriber({ server: outboxd.addr, consumer: "nobody-here", handler: () => undefined });
  await assert.rejects(subscriber.run(), (e: unknown) => e instanceof ConnectError && e.code === Code.NotFound);
});

test("bad options are refused at construction, naming the option and its limit", () => {
  const handler = () => undefined;
  assert.throws(() => new Subscriber({ server: "localhost:1", consumer: "c", handler, concurrency: 0 }), /concurrency: 0 is not a whole number from 1 to 10000/);
  assert.throws(() => new Subscriber({ server: "localhost:1", consumer: "c", handler, concurrency: 10_001 }), /from 1 to 10000/);
  assert.throws(() => new Subscriber({ server: "localhost:1", consumer: "c", handler, ackDeadlineMs: 50 }), /ackDeadlineMs: 50 is outside 100 ms to 24 hours/);
  assert.throws(() => new Subscriber({ server: "localhost:1", consumer: "", handler }), /consumer: a consumer name is required/);
  assert.throws(() => new Subscriber({ server: "ftp://x:1", consumer: "c", handler }), /server: "ftp:\/\/x:1" has the scheme ftp/);
  assert.throws(() => new Subscriber({ server: "x:1/path", consumer: "c", handler }), /only a scheme, a host and a port/);
  assert.throws(() => new Subscriber({ server: "http://x:1", consumer: "c", handler, tls: { ca: "" } }), /tls: TLS options were given but "http:\/\/x:1" is not an https:\/\/ address/);
  assert.throws(() => new Subscriber({ server: "https://x:1", consumer: "c", handler, tls: { cert: "c" } }), /needs both cert and key/);
  assert.throws(() => new Subscriber({ server: "x:1", consumer: "c", handler, token: "has space" }), /token: the token has characters/);
  assert.throws(() => new Subscriber({ server: "x:1", consumer: "c", handler: 5 as never }), /handler: a function/);
});

test("the nack carries the error's message, at most MAX_ERROR_BYTES of UTF-8; a thrown non-Error as JSON", async () => {
  const c = await setUp({ maxDeliveries: 1 });
  const subscriber = new Subscriber({
    server: outboxd.addr,
    consumer: c.name,
    handler: (d) => {
      if (d.type === "Long") {
        throw new Error(`x${"é".repeat(5000)}`);
      }
      throw { code: 7 };
    },
  });
  const running = subscriber.run();
  const [long] = await c.send(1, "Long");
  const [odd] = await c.send(1, "Odd");
  const dead = await eventually("both dead", 10_000, async () => {
    const page = await admin.listDeadLetters(c.name);
    return page.deadLetters.length === 2 ? page.deadLetters : undefined;
  });
  await subscriber.stop();
  await running;
  const error = (id: string) => dead.find((d) => d.message?.messageId === id)?.lastError;
  // Cut between characters: "x" and 2047 two-byte characters fill all but one byte.
  assert.equal(error(long!), `x${"é".repeat((MAX_ERROR_BYTES - 2) / 2)}`);
  assert.equal(Buffer.byteLength(error(long!)!), MAX_ERROR_BYTES - 1);
  assert.equal(error(odd!), '{"code":7}');
});
