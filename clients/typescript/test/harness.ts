// Test harness: a fresh PostgreSQL database per test file, real outboxd processes on it, and
// polling with a bound instead of sleeping.
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { existsSync, readFileSync } from "node:fs";
import { createServer } from "node:net";
import { dirname, join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

import { AdminClient, ConnectError } from "@outboxd/client";
import pg from "pg";

/** The repository root: the nearest folder above this file that holds proto/outbox/v1. */
export const repoRoot: string = (() => {
  let dir = dirname(fileURLToPath(import.meta.url));
  while (!existsSync(join(dir, "proto", "outbox", "v1"))) {
    const up = dirname(dir);
    if (up === dir) {
      throw new Error("cannot find the repository root (a folder with proto/outbox/v1) above the tests");
    }
    dir = up;
  }
  return dir;
})();

/** The TypeScript blocks of docs/clients/typescript.md, in order. */
export function docsExamples(): string[] {
  const doc = readFileSync(join(repoRoot, "docs", "clients", "typescript.md"), "utf8");
  const blocks = [...doc.matchAll(/^```ts\n([\s\S]*?)^```$/gm)].map((m) => m[1] ?? "");
  if (blocks.length === 0) {
    throw new Error("docs/clients/typescript.md has no TypeScript examples");
  }
  return blocks;
}

export const adminUrl = process.env.OUTBOX_TEST_DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/postgres";

/** `OUTBOXD_BIN`, or the workspace's debug build (built first if it is missing). */
export function outboxdBin(): string {
  const fromEnv = process.env.OUTBOXD_BIN;
  if (fromEnv !== undefined && fromEnv !== "") {
    return resolve(fromEnv);
  }
  const bin = join(repoRoot, "target", "debug", "outboxd");
  if (!existsSync(bin)) {
    const built = spawnSync("cargo", ["build", "-p", "outbox-server", "--bin", "outboxd"], {
      cwd: repoRoot,
      stdio: "inherit",
    });
    if (built.status !== 0 || !existsSync(bin)) {
      throw new Error("cargo build -p outbox-server --bin outboxd failed");
    }
  }
  return bin;
}

/** A database of its own, `outboxd_test_ts_<random>`, dropped by `drop()`. */
export class TestDatabase {
  private constructor(
    readonly name: string,
    readonly url: string,
  ) {}

  static async create(): Promise<TestDatabase> {
    const name = `outboxd_test_ts_${randomBytes(6).toString("hex")}`;
    await withAdmin((c) => c.query(`CREATE DATABASE ${name}`));
    const url = new URL(adminUrl);
    url.pathname = `/${name}`;
    return new TestDatabase(name, url.toString());
  }

  /** A connected client on this database; the caller ends it. */
  async connect(): Promise<pg.Client> {
    const client = new pg.Client({ connectionString: this.url });
    await client.connect();
    return client;
  }

  async drop(): Promise<void> {
    await withAdmin((c) => c.query(`DROP DATABASE IF EXISTS ${this.name} WITH (FORCE)`));
  }
}

async function withAdmin<T>(f: (c: pg.Client) => Promise<T>): Promise<T> {
  const client = new pg.Client({ connectionString: adminUrl });
  await client.connect();
  try {
    return await f(client);
  } finally {
    await client.end();
  }
}

/** A free TCP port on 127.0.0.1 (for a server that must come back on the same port). */
export async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((ok, fail) => server.listen(0, "127.0.0.1", ok).once("error", fail));
  const address = server.address();
  await new Promise((ok) => server.close(ok));
  if (address === null || typeof address === "string") {
    throw new Error("no port");
  }
  return address.port;
}

/** A running `outboxd serve`, on port 0 unless `--listen` is among its flags. */
export class Outboxd {
  private constructor(
    private readonly child: ChildProcess,
    readonly addr: string,
    private readonly exited: Promise<void>,
    /** Its log (stderr) so far, one entry a line. */
    readonly lines: string[],
  ) {}

  get endpoint(): string {
    return `http://${this.addr}`;
  }

  static async start(databaseUrl: string, flags: string[] = []): Promise<Outboxd> {
    const args = ["serve", "--database-url", databaseUrl];
    if (!flags.includes("--listen")) {
      args.push("--listen", "127.0.0.1:0");
    }
    args.push(...flags);
    const child = spawn(outboxdBin(), args, {
      env: { ...process.env, RUST_LOG: process.env.OUTBOXD_TEST_LOG ?? "info,sqlx=warn" },
      stdio: ["ignore", "ignore", "pipe"],
    });
    const exited = new Promise<void>((ok) => child.once("exit", () => ok()));
    const lines: string[] = [];
    const addr = await new Promise<string>((ok, fail) => {
      const timer = setTimeout(() => fail(new Error(`outboxd did not start serving within 60 s:\n${lines.join("\n")}`)), 60_000);
      const rl = createInterface({ input: child.stderr! });
      rl.on("line", (line) => {
        lines.push(line);
        if (process.env.OUTBOXD_TEST_VERBOSE) {
          process.stderr.write(`[outboxd] ${line}\n`);
        }
        const m = /outboxd serving.*local_addr=(\S+)/.exec(line);
        if (m?.[1] !== undefined) {
          clearTimeout(timer);
          ok(m[1]);
        }
      });
      child.once("exit", (code) => {
        clearTimeout(timer);
        fail(new Error(`outboxd exited (${code}) before serving:\n${lines.join("\n")}`));
      });
    });
    return new Outboxd(child, addr, exited, lines);
  }

  /** SIGKILL, and wait until the process is gone. */
  async kill(): Promise<void> {
    this.child.kill("SIGKILL");
    await this.exited;
  }

  /** SIGTERM (graceful shutdown), and wait until the process is gone. */
  async terminate(): Promise<void> {
    this.child.kill("SIGTERM");
    await this.exited;
  }
}

/** Polls `check` every 25 ms until it returns something other than `undefined`/`false`. */
export async function eventually<T>(what: string, withinMs: number, check: () => Promise<T | undefined | false> | T | undefined | false): Promise<T> {
  const deadline = Date.now() + withinMs;
  let last: unknown;
  for (;;) {
    try {
      const value = await check();
      if (value !== undefined && value !== false) {
        return value;
      }
    } catch (e) {
      last = e;
    }
    if (Date.now() > deadline) {
      throw new Error(`${what}: not within ${withinMs} ms${last === undefined ? "" : ` (last error: ${String(last)})`}`);
    }
    await new Promise((ok) => setTimeout(ok, 25));
  }
}

/** A unique name for a consumer or topic segment. */
export function unique(prefix: string): string {
  return `${prefix}-${randomBytes(4).toString("hex")}`;
}

/** A database, an outboxd on it, an admin client, and a SQL connection; `close()` ends them all. */
export interface Stack {
  db: TestDatabase;
  outboxd: Outboxd;
  admin: AdminClient;
  sql: pg.Client;
  close(): Promise<void>;
}

export async function startStack(flags: string[] = []): Promise<Stack> {
  const db = await TestDatabase.create();
  const outboxd = await Outboxd.start(db.url, flags);
  const admin = new AdminClient(outboxd.endpoint);
  const sql = await db.connect();
  return {
    db,
    outboxd,
    admin,
    sql,
    close: async () => {
      await sql.end();
      admin.close();
      await outboxd.kill();
      await db.drop();
    },
  };
}

/** The error a call that must fail failed with. */
export async function failure(p: Promise<unknown>): Promise<ConnectError> {
  try {
    await p;
  } catch (e) {
    return ConnectError.from(e);
  }
  throw new Error("expected the call to fail");
}
