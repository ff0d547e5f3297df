// The package as another project gets it: `npm install <path to clients/typescript>` from a
// scratch project builds it through `prepare` (generate + tsc), and
// `import { Subscriber, enqueue, ackIn, AdminClient } from "@outboxd/client"` works, in
// JavaScript and type-checked TypeScript.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { cpSync, existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, relative } from "node:path";
import { after, test } from "node:test";

import { docsExamples, repoRoot } from "./harness.js";

const scratch = mkdtempSync(join(tmpdir(), "outboxd-ts-package-"));
after(() => rmSync(scratch, { recursive: true, force: true }));

test("npm install of the folder from a scratch project builds it and the package imports", { timeout: 300_000 }, () => {
  // A clean copy of what a clone holds: proto/ and the package's sources, nothing built.
  const repo = join(scratch, "repo");
  const pkg = join(repo, "clients", "typescript");
  cpSync(join(repoRoot, "proto"), join(repo, "proto"), { recursive: true });
  const source = join(repoRoot, "clients", "typescript");
  cpSync(source, pkg, {
    recursive: true,
    filter: (path) => !/^(node_modules|dist|build|src\/gen)(\/|$)/.test(relative(source, path)),
  });
  assert.equal(existsSync(join(pkg, "dist")), false);

  const app = join(scratch, "app");
  cpSync(join(source, "test", "fixtures", "app"), app, { recursive: true });
  // From the npm cache when it has the packages (it does after this folder's own `npm ci`).
  const env = { ...process.env, npm_config_prefer_offline: "true", npm_config_audit: "false", npm_config_fund: "false" };
  execFileSync("npm", ["install", pkg, "pg@8", "@types/pg@8", "@types/node@20"], { cwd: app, env, stdio: ["ignore", "inherit", "inherit"] });
  assert.ok(existsSync(join(pkg, "dist", "index.js")), "prepare built dist/");
  assert.ok(existsSync(join(pkg, "src", "gen", "outbox", "v1", "admin_pb.ts")), "prepare generated the code");

  const out = execFileSync("node", ["main.mjs"], { cwd: app, encoding: "utf8" });
  assert.equal(out.trim(), "function function function function");
  // The declarations resolve through the package's exports and type-check a typical use, and
  // every example of docs/clients/typescript.md.
  docsExamples().forEach((code, i) => writeFileSync(join(app, `docs-${i + 1}.ts`), `${code}\nexport {};\n`));
  execFileSync(join(pkg, "node_modules", ".bin", "tsc"), ["-p", "."], { cwd: app, stdio: ["ignore", "inherit", "inherit"] });
  writeFileSync(join(app, "bad.ts"), 'import { enqueue } from "@outboxd/client";\nenqueue(null as never, { topic: 1 });\n');
  assert.throws(
    () => execFileSync(join(pkg, "node_modules", ".bin", "tsc"), ["--noEmit", "--module", "nodenext", "--skipLibCheck", "bad.ts"], { cwd: app, stdio: "pipe" }),
    "a mistyped call is a type error",
  );
});
