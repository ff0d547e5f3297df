// enqueue and ackIn in the caller's node-postgres transaction, against a real outboxd.
import assert from "node:assert/strict";
import { after, test } from "node:test";

import { Code, ConnectError, ackIn, enqueue, pb } from "@outboxd/client";

import { eventually, startStack } from "./harness.js";

const stack = await startStack();
after(() => stack.close());
const { admin, sql: client } = stack;
await admin.createConsumer({ name: "billing", topics: ["orders.>"] });
await client.query("CREATE TABLE orders (id int PRIMARY KEY)");

async function exists(id: string): Promise<boolean> {
  try {
    await admin.getMessage(id);
    return true;
  } catch (e) {
    if (e instanceof ConnectError && e.code === Code.NotFound) {
      return false;
    }
    throw e;
  }
}

test("a message enqueued in a committed transaction exists, with its fields; a rolled-back one never does", async () => {
  await client.query("BEGIN");
  await client.query("INSERT INTO orders VALUES (1)");
  const id = await enqueue(client, {
    topic: "orders.created",
    type: "OrderPlaced",
    payload: new Uint8Array([0, 1, 2, 255]),
    headers: { source: "ts" },
    orderingKey: "order-1",
  });
  await client.query("COMMIT");
  const got = await admin.getMessage(id);
  assert.equal(got.message?.topic, "orders.created");
  assert.equal(got.message?.type, "OrderPlaced");
  assert.deepEqual([...(got.message?.payload ?? [])], [0, 1, 2, 255]);
  assert.deepEqual(got.message?.headers, { source: "ts" });
  assert.equal(got.message?.orderingKey, "order-1");

  const chosen = "0193a0b4-7c1e-7d2a-9f00-000000000001";
  await client.query("BEGIN");
  await client.query("INSERT INTO orders VALUES (2)");
  assert.equal(await enqueue(client, { topic: "orders.created", type: "OrderPlaced", payload: "{}", messageId: chosen }), chosen);
  await client.query("ROLLBACK");
  assert.equal(await exists(chosen), false, "the rolled-back message must not exist");
  const { rows } = await client.query("SELECT count(*)::int AS n FROM orders");
  assert.equal(rows[0].n, 1);
});

test("enqueueing an existing message id again returns that id and writes nothing", async () => {
  const chosen = "0193a0b4-7c1e-7d2a-9f00-000000000002";
  await client.query("BEGIN");
  const first = await enqueue(client, { topic: "orders.created", type: "A", payload: "1", messageId: chosen.toUpperCase() });
  const again = await enqueue(client, { topic: "orders.created", type: "A", payload: "1", messageId: chosen });
  await client.query("COMMIT");
  assert.equal(first, chosen);
  assert.equal(again, chosen);
  assert.equal((await admin.getMessage(chosen)).message?.type, "A");
  // Another message under the same id is refused (SQLSTATE 23505): an id names one message.
  await client.query("BEGIN");
  await assert.rejects(
    enqueue(client, { topic: "orders.created", type: "B", payload: "2", messageId: chosen }),
    /exists already with a different topic, type or payload/,
  );
  await client.query("ROLLBACK");
});

test("bad arguments throw naming the field, before the database sees them: the transaction goes on", async () => {
  await client.query("BEGIN");
  const kept = await enqueue(client, { topic: "orders.kept", type: "Kept", payload: "" });
  await assert.rejects(enqueue(client, { topic: "orders.*", type: "T", payload: "" }), /topic: "orders\.\*"/);
  await assert.rejects(enqueue(client, { topic: "orders.x", type: "", payload: "" }), /type: a non-empty string/);
  await assert.rejects(enqueue(client, { topic: "orders.x", type: "t".repeat(256), payload: "" }), /type: 256 bytes; the limit is 255/);
  await assert.rejects(enqueue(client, { topic: "orders.x", type: "T", payload: "", messageId: "nope" }), /messageId: "nope" is not a UUID/);
  await assert.rejects(
    enqueue(client, { topic: "orders.x", type: "T", payload: "", headers: { n: 1 as unknown as string } }),
    /headers: the value of "n" is a number/,
  );
  await assert.rejects(enqueue(client, { topic: "orders.x", type: "T", payload: 5 as unknown as string }), /payload: a Uint8Array or a string/);
  // Past the server's default --max-payload-bytes: refused here, not by the database.
  await assert.rejects(
    enqueue(client, { topic: "orders.x", type: "T", payload: new Uint8Array(5 * 1024 * 1024) }),
    /payload: 5242880 bytes; the limit is 1048576 bytes \(outboxd's --max-payload-bytes/,
  );
  await assert.rejects(ackIn(client, "billing", "not-a-uuid"), /messageId: "not-a-uuid" is not a UUID/);
  await client.query("COMMIT");
  assert.equal(await exists(kept), true, "the transaction survived the refused calls and committed");
});

test("the database's own limits come back as its error (65 headers)", async () => {
  await client.query("BEGIN");
  const headers = Object.fromEntries(Array.from({ length: 65 }, (_, i) => [`h${i}`, "v"]));
  await assert.rejects(
    enqueue(client, { topic: "orders.x", type: "T", payload: "", headers }),
    /65 headers; the limit is 64 entries/,
  );
  await client.query("ROLLBACK");
});

test("ackIn acks in the caller's transaction: rolled back it did nothing, committed it is true once, then false", async () => {
  await client.query("BEGIN");
  const id = await enqueue(client, { topic: "orders.paid", type: "OrderPaid", payload: "{}" });
  await client.query("COMMIT");
  await eventually("the delivery to billing", 10_000, async () =>
    (await admin.getMessage(id)).deliveries.some((d) => d.consumer === "billing"),
  );

  await client.query("BEGIN");
  assert.equal(await ackIn(client, "billing", id), true);
  await client.query("ROLLBACK");

  await client.query("BEGIN");
  assert.equal(await ackIn(client, "billing", id), true, "the rolled-back ack did not count");
  await client.query("COMMIT");
  await client.query("BEGIN");
  assert.equal(await ackIn(client, "billing", id), false, "acked already: the effect must be rolled back");
  await client.query("ROLLBACK");

  const state = (await admin.getMessage(id)).deliveries.find((d) => d.consumer === "billing");
  assert.equal(state?.state, pb.DeliveryState_State.ACKED);
  assert.equal(await ackIn(client, "nobody", id), false, "an unknown consumer has nothing to ack");
});
