// Every AdminClient method against a real outboxd on PostgreSQL.
import assert from "node:assert/strict";
import { after, test } from "node:test";

import { Code, ConnectError, Subscriber, ackIn, enqueue, messageToJson, messageToJsonString, pb } from "@outboxd/client";

import { eventually, failure, startStack } from "./harness.js";

const stack = await startStack();
after(() => stack.close());
const { outboxd, admin, sql } = stack;

test("consumers: create (durations in ms, startFrom), get, list, pause, resume, delete", async () => {
  const created = await admin.createConsumer({
    name: "inventory",
    topics: ["orders.*", "stock.>"],
    maxDeliveries: 5,
    backoffBase: 250,
    backoffMax: { seconds: 60n },
    ackDeadline: 45_000,
    startFrom: "EARLIEST",
  });
  assert.equal(created.name, "inventory");
  assert.deepEqual(created.topics, ["orders.*", "stock.>"]);
  assert.equal(created.maxDeliveries, 5);
  assert.equal(created.backoffBase?.nanos, 250_000_000);
  assert.equal(created.backoffMax?.seconds, 60n);
  assert.equal(created.ackDeadline?.seconds, 45n);
  assert.equal(created.startFrom, pb.Consumer_StartFrom.EARLIEST);
  assert.ok(created.createdAt !== undefined);

  // The same definition again is a success; a different one is ALREADY_EXISTS.
  assert.equal((await admin.createConsumer({ ...created, backoffBase: 250, backoffMax: 60_000, ackDeadline: 45_000, startFrom: "EARLIEST" })).name, "inventory");
  assert.equal((await failure(admin.createConsumer({ name: "inventory", topics: ["other"] }))).code, Code.AlreadyExists);

  assert.equal((await admin.getConsumer("inventory")).maxDeliveries, 5);
  assert.ok((await admin.listConsumers()).some((c) => c.name === "inventory"));
  assert.equal((await admin.pauseConsumer("inventory")).paused, true);
  assert.equal((await admin.getStats("inventory")).consumers[0]?.paused, true);
  assert.equal((await admin.resumeConsumer("inventory")).paused, false);
  await admin.deleteConsumer("inventory");
  assert.equal((await failure(admin.getConsumer("inventory"))).code, Code.NotFound);
});

test("bad requests are INVALID_ARGUMENT naming the field; bad input is refused before the call", async () => {
  const e = await failure(admin.createConsumer({ name: "bad name!", topics: ["t"] }));
  assert.equal(e.code, Code.InvalidArgument);
  assert.match(e.rawMessage, /consumer\.name/);
  await assert.rejects(admin.createConsumer({ name: "x", topics: ["t"], ackDeadline: -1 }), /ackDeadline: -1 is not a duration/);
  await assert.rejects(admin.createConsumer({ name: "x", topics: ["t"], startFrom: "LATEST" as never }), /startFrom: "LATEST" is not NEW or EARLIEST/);
  await assert.rejects(admin.getConsumer(""), /name: a consumer name is required/);
});

test("stats, dead letters page by page, getMessage, replay, replayStream", async () => {
  await admin.createConsumer({ name: "fragile", topics: ["fragile.>"], maxDeliveries: 1, backoffBase: 10, backoffMax: 10 });
  await sql.query("BEGIN");
  const ids: string[] = [];
  for (let i = 0; i < 3; i++) {
    ids.push(await enqueue(sql, { topic: "fragile.x", type: "Poison", payload: `${i}` }));
  }
  await sql.query("COMMIT");
  const failing = new Subscriber({
    server: outboxd.addr,
    consumer: "fragile",
    handler: () => {
      throw new Error("cannot");
    },
  });
  const running = failing.run();
  await eventually("3 dead", 10_000, async () => (await admin.getStats("fragile")).consumers[0]?.dead === 3n);
  await failing.stop();
  await running;

  const stats = await admin.getStats();
  assert.ok(stats.consumers.some((c) => c.consumer === "fragile" && c.dead === 3n));
  assert.ok(stats.tables.length > 0, "outboxd's tables are listed");

  const first = await admin.listDeadLetters("fragile", { pageSize: 2 });
  assert.equal(first.deadLetters.length, 2);
  assert.notEqual(first.nextPageToken, "");
  const all: string[] = [];
  for await (const d of admin.deadLetters("fragile", 2)) {
    assert.equal(d.lastError, "cannot");
    all.push(d.message!.messageId);
  }
  assert.deepEqual(new Set(all), new Set(ids));

  const message = await admin.getMessage(ids[0]!);
  assert.equal(message.message?.type, "Poison");
  assert.equal(message.deliveries[0]?.state, pb.DeliveryState_State.DEAD);
  assert.equal((await failure(admin.getMessage("0193a0b4-7c1e-7d2a-9f00-00000000ffff"))).code, Code.NotFound);

  const dry = await admin.replay("fragile", { deadLetters: true, dryRun: true });
  assert.equal(dry.dryRun, true);
  assert.equal(dry.replayed, 3n);
  assert.equal((await admin.getStats("fragile")).consumers[0]?.dead, 3n, "a dry run changes nothing");

  const one = await admin.replay("fragile", { messageIds: [ids[0]!] });
  assert.equal(one.replayed, 1n);
  const progress = [];
  for await (const p of admin.replayStream("fragile", { deadLetters: true, enqueuedAfter: new Date(Date.now() - 3_600_000) })) {
    progress.push(p);
  }
  assert.equal(progress.at(-1)?.done, true);
  assert.equal(progress.at(-1)?.replayed, 2n);
  const after = (await admin.getStats("fragile")).consumers[0];
  assert.equal(after?.dead, 0n);
  assert.equal(after?.backlog, 3n, "all three due again");
});

test("held keys: a hold consumer holds a key whose message dies; listHeldKeys, releaseKey with skipDead", async () => {
  const ledger = { name: "ledger", topics: ["ledger.>"], maxDeliveries: 1, backoffBase: 10, backoffMax: 10 };
  const created = await admin.createConsumer({ ...ledger, deadKeyPolicy: "hold" });
  assert.equal(created.deadKeyPolicy, pb.DeadKeyPolicy.HOLD);
  assert.equal(JSON.parse(JSON.stringify(created)).deadKeyPolicy, "DEAD_KEY_POLICY_HOLD");
  // The same definition with the enum is the same consumer; "skip" is another definition.
  assert.equal((await admin.createConsumer({ ...ledger, deadKeyPolicy: pb.DeadKeyPolicy.HOLD })).name, "ledger");
  assert.equal((await failure(admin.createConsumer({ ...ledger, deadKeyPolicy: "skip" }))).code, Code.AlreadyExists);
  await assert.rejects(admin.createConsumer({ ...ledger, deadKeyPolicy: "drop" as never }), /deadKeyPolicy: "drop" is not "skip" or "hold"/);
  assert.deepEqual((await admin.listHeldKeys("ledger")).keys, []);

  await sql.query("BEGIN");
  const ids: string[] = [];
  for (let i = 0; i < 3; i++) {
    ids.push(await enqueue(sql, { topic: "ledger.posted", type: "Posted", payload: `${i}`, orderingKey: "k1" }));
  }
  await sql.query("COMMIT");
  const [deadId, ...waiting] = ids;
  const got: Record<string, string[]> = { k1: [], k2: [] };
  const subscriber = new Subscriber({
    server: outboxd.addr,
    consumer: "ledger",
    handler: (d) => {
      if (d.messageId === deadId) {
        throw new Error("balance would go negative");
      }
      got[d.orderingKey ?? ""]?.push(d.messageId);
    },
  });
  const running = subscriber.run();
  try {
    const held = await eventually("k1 held, 2 waiting", 10_000, async () => {
      const h = await admin.listHeldKeys("ledger");
      return h.keys[0]?.waiting === 2n ? h : undefined;
    });
    assert.equal(held.truncated, false);
    assert.equal(held.keys.length, 1);
    const key = held.keys[0]!;
    assert.deepEqual([key.orderingKey, key.messageId, key.lastError], ["k1", deadId, "balance would go negative"]);
    assert.ok(key.heldAt !== undefined);
    const json = JSON.parse(JSON.stringify(held));
    assert.equal(json.keys[0].waiting, "2", "int64 as a string");
    assert.match(json.keys[0].heldAt, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$/);
    assert.equal((await admin.getStats("ledger")).consumers[0]?.heldKeys, 1n);

    // Another key flows while k1 is held.
    const other = await enqueue(sql, { topic: "ledger.posted", type: "Posted", payload: "k2", orderingKey: "k2" });
    await eventually("k2 delivered", 10_000, () => got.k2?.includes(other));
    assert.deepEqual(got.k1, [], "k1's messages wait behind the dead one");

    const released = await admin.releaseKey("ledger", "k1", { skipDead: true });
    assert.deepEqual([released.orderingKey, released.messageId], ["k1", deadId]);
    assert.equal(JSON.parse(JSON.stringify(released)).waiting, "2");
    await eventually("k1's waiting messages delivered in order", 10_000, () => got.k1?.length === 2);
    assert.deepEqual(got.k1, waiting);
    await eventually("all acked", 10_000, async () => {
      const c = (await admin.getStats("ledger")).consumers[0];
      return c?.acked === 3n && c.dead === 1n && c.heldKeys === 0n;
    });
  } finally {
    await subscriber.stop();
    await running;
  }
  assert.deepEqual((await admin.listHeldKeys("ledger")).keys, []);
  const dead = await admin.listDeadLetters("ledger");
  assert.deepEqual(dead.deadLetters.map((d) => d.message?.messageId), [deadId], "skipDead leaves the dead message dead");
  assert.equal((await failure(admin.releaseKey("ledger", "k1"))).code, Code.NotFound);
  await assert.rejects(admin.releaseKey("ledger", ""), /releaseKey: expected an ordering key/);
  await assert.rejects(admin.releaseKey("ledger", "k1", { skipDead: "yes" } as never), /skipDead\?: boolean/);
  await assert.rejects(admin.listHeldKeys(""), /consumer: a consumer name is required/);
});

test("tail shows messages as they commit; prune deletes acked ones older than the retention", async () => {
  await admin.createConsumer({ name: "audit", topics: ["audit.>"] });
  const abort = new AbortController();
  const seen: string[] = [];
  const tailing = (async () => {
    try {
      for await (const m of admin.tail({ topics: ["audit.>"], signal: abort.signal })) {
        seen.push(m.messageId);
      }
    } catch (e) {
      if (ConnectError.from(e).code !== Code.Canceled) {
        throw e;
      }
    }
  })();
  // Tail starts at the newest message: enqueue until one is seen.
  const ids: string[] = [];
  await eventually("a tailed message", 10_000, async () => {
    ids.push(await enqueue(sql, { topic: "audit.login", type: "Login", payload: "{}" }));
    return seen.length > 0;
  });
  abort.abort();
  await tailing;
  assert.ok(seen.every((id) => ids.includes(id)));

  await eventually("delivered to audit", 10_000, async () =>
    (await Promise.all(ids.map((id) => admin.getMessage(id)))).every((m) => m.deliveries.length === 1),
  );
  await sql.query("BEGIN");
  for (const id of ids) {
    assert.equal(await ackIn(sql, "audit", id), true);
  }
  await sql.query("COMMIT");
  const pruned = await eventually("the acked messages pruned", 10_000, async () => {
    const r = await admin.prune({ olderThan: 1 });
    return r.messagesDeleted > 0n ? r : undefined;
  });
  assert.ok(pruned.deliveriesDeleted >= 0n);
  assert.equal((await failure(admin.getMessage(ids[0]!))).code, Code.NotFound);
});

test("answers are JSON: int64 as strings (the canonical proto3 mapping); getStats takes a name or { consumer }", async () => {
  await admin.createConsumer({ name: "jsonable", topics: ["jsonable.>"], ackDeadline: 1500, startFrom: "EARLIEST" });
  await sql.query("BEGIN");
  const id = await enqueue(sql, { topic: "jsonable.created", type: "Json", payload: "{}" });
  await sql.query("COMMIT");

  const byName = await admin.getStats("jsonable");
  const byOptions = await admin.getStats({ consumer: "jsonable" });
  assert.deepEqual(byOptions.consumers.map((c) => c.consumer), ["jsonable"]);
  assert.deepEqual(byName.consumers.map((c) => c.consumer), ["jsonable"]);
  assert.ok((await admin.getStats({})).consumers.length > 1, "{} is every consumer, as no argument is");
  for (const bad of [42, ["jsonable"], { consumer: 7 }, null]) {
    await assert.rejects(admin.getStats(bad as never), (e: Error) => e instanceof TypeError && /a consumer name \(string\) or \{ consumer: string \}/.test(e.message));
  }
  await assert.rejects(admin.getMessage({ messageId: id } as never), TypeError);

  const stats = JSON.parse(JSON.stringify(byName));
  assert.equal(typeof stats.unrelayed === "string" || stats.unrelayed === undefined, true);
  assert.equal(stats.consumers[0].consumer, "jsonable");
  const got = await admin.getMessage(id);
  const json = JSON.parse(JSON.stringify(got));
  assert.equal(json.message.messageId, id);
  assert.equal(json.message.seq, String(got.message?.seq));
  assert.match(json.message.enqueuedAt, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$/);
  assert.equal(json.message.payload, Buffer.from("{}").toString("base64"));
  assert.deepEqual(messageToJson(got), json);
  assert.equal(messageToJsonString(got), JSON.stringify(got));
  const consumer = JSON.parse(JSON.stringify(await admin.getConsumer("jsonable")));
  assert.deepEqual([consumer.startFrom, consumer.ackDeadline], ["EARLIEST", "1.500s"]);
  assert.deepEqual(JSON.parse(JSON.stringify(await admin.listConsumers())).map((c: { name: string }) => c.name).includes("jsonable"), true);
  // The toJSON is not a field: spreading and equality ignore it.
  assert.equal(Object.keys(got).includes("toJSON"), false);
  assert.throws(() => messageToJson({ id: 1n } as never), TypeError);
});
