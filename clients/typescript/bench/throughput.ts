// The Subscriber's throughput: messages acked per second by one Subscriber (one stream) whose
// handler does nothing, against one outboxd on PostgreSQL.
//
//   npm run bench -- [--messages 100000] [--concurrency 64]
//
// The messages are committed and relayed before the Subscriber starts, so the figure is the
// delivery path alone: outboxd leasing and sending, the client handling and acking in batches,
// outboxd applying the acks. OUTBOXD_BIN picks the server (use a release build for figures);
// a fresh database outboxd_test_ts_<random> is created and dropped.
import { parseArgs } from "node:util";

import { AdminClient, Subscriber } from "@outboxd/client";

import { Outboxd, TestDatabase, eventually } from "../test/harness.js";

const { values } = parseArgs({
  options: {
    messages: { type: "string", default: "100000" },
    concurrency: { type: "string", default: "64" },
  },
});
const messages = Number(values.messages);
const concurrency = Number(values.concurrency);

const db = await TestDatabase.create();
const outboxd = await Outboxd.start(db.url);
const admin = new AdminClient(outboxd.addr);
try {
  await admin.createConsumer({ name: "bench", topics: ["bench.>"] });
  const sql = await db.connect();
  // 160-byte payloads, as outbox-bench uses; committed in batches of 10,000.
  for (let done = 0; done < messages; done += 10_000) {
    const n = Math.min(10_000, messages - done);
    await sql.query("SELECT outbox.enqueue('bench.created', 'Created', convert_to(repeat('x', 160), 'UTF8')) FROM generate_series(1, $1)", [n]);
  }
  await sql.end();
  await eventually("all relayed", 600_000, async () => (await admin.getStats("bench")).consumers[0]?.backlog === BigInt(messages));

  let handled = 0;
  const subscriber = new Subscriber({
    server: outboxd.addr,
    consumer: "bench",
    concurrency,
    handler: async () => {
      handled++;
    },
  });
  const started = performance.now();
  const cpu = process.cpuUsage();
  const running = subscriber.run();
  await eventually("all acked", 600_000, async () => (await admin.getStats("bench")).consumers[0]?.acked === BigInt(messages));
  const seconds = (performance.now() - started) / 1000;
  const used = process.cpuUsage(cpu);
  await subscriber.stop();
  await running;
  const rss = process.memoryUsage().rss / 2 ** 20;
  console.log(
    JSON.stringify({
      messages,
      concurrency,
      handled,
      seconds: Number(seconds.toFixed(2)),
      acked_per_s: Math.round(messages / seconds),
      // The client's own CPU while it consumed (1.0 = one core the whole time).
      client_cpu_share: Number(((used.user + used.system) / 1e6 / seconds).toFixed(2)),
      client_rss_mib: Math.round(rss),
    }),
  );
} finally {
  admin.close();
  await outboxd.kill();
  await db.drop();
}
