// Every example of docs/clients/typescript.md runs as written, in order, as a JavaScript module
// (`node example.mjs`), against a fresh database and an outboxd on it: OUTBOXD_SERVER and
// DATABASE_URL point the examples there, as the page says. (package.test.ts type-checks them.)
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdirSync, rmSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { after, test } from "node:test";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

import { Outboxd, TestDatabase, docsExamples } from "./harness.js";

const run = promisify(execFile);
// Inside the package's folder, so that `import "@outboxd/client"` resolves to this package
// (its own name, through its exports) and `pg` to its node_modules.
const dir = join(dirname(fileURLToPath(import.meta.url)), "docs-examples");
mkdirSync(dir, { recursive: true });

const db = await TestDatabase.create();
const outboxd = await Outboxd.start(db.url);
after(async () => {
  await outboxd.kill();
  await db.drop();
  rmSync(dir, { recursive: true, force: true });
});

test("every example of docs/clients/typescript.md runs, in order", { timeout: 180_000 }, async () => {
  const env: NodeJS.ProcessEnv = { ...process.env, OUTBOXD_SERVER: outboxd.endpoint, DATABASE_URL: db.url };
  delete env.OUTBOXD_TOKEN;
  delete env.OUTBOXD_TLS_CA;
  const outputs: string[] = [];
  for (const [i, code] of docsExamples().entries()) {
    const file = join(dir, `example-${i + 1}.mjs`);
    writeFileSync(file, code);
    try {
      const { stdout } = await run("node", [file], { env, timeout: 60_000 });
      outputs.push(stdout);
    } catch (e) {
      const err = e as { stdout?: string; stderr?: string };
      assert.fail(`example ${i + 1} failed:\n${code}\n--- stdout\n${err.stdout ?? ""}\n--- stderr\n${err.stderr ?? String(e)}`);
    }
  }
  const [setup, produce, consume, watch] = outputs;
  assert.match(setup ?? "", /"name":"ts-billing"/);
  const order = /order (\d+): message ([0-9a-f-]{36})/.exec(produce ?? "");
  assert.ok(order, `the produce example prints its order: ${produce}`);
  assert.match(consume ?? "", new RegExp(`charged order ${order[1]} \\(message ${order[2]}`));
  // JSON.stringify of the stats works, with the int64 counts as strings.
  assert.match(watch ?? "", /"acked": "1"/);
});
