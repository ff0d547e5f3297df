// TLS, mTLS and bearer tokens against real outboxd processes, with a CA and certificates made
// for the test by the openssl command.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";

import { AdminClient, Code, ConnectError, Subscriber, enqueue } from "@outboxd/client";

import { Outboxd, TestDatabase, eventually, failure } from "./harness.js";

let dir: string;
let db: TestDatabase;
let tlsAuth: Outboxd;
let mtls: Outboxd;
let ca: Buffer;
const token = randomBytes(32).toString("base64url");
const consumeOnly = randomBytes(32).toString("base64url");

function openssl(...args: string[]): void {
  execFileSync("openssl", args, { cwd: dir, stdio: ["ignore", "ignore", "pipe"] });
}

/** A certificate for `cn`, signed by the test CA, with the given extensions file. */
function issue(name: string, cn: string, ext: string): void {
  writeFileSync(join(dir, `${name}.ext`), ext);
  openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", `${name}.key`, "-subj", `/CN=${cn}`, "-out", `${name}.csr`);
  openssl("x509", "-req", "-in", `${name}.csr`, "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-days", "2", "-extfile", `${name}.ext`, "-out", `${name}.pem`);
}

const sha256 = (s: string) => createHash("sha256").update(s).digest("hex");

before(async () => {
  dir = mkdtempSync(join(tmpdir(), "outboxd-ts-tls-"));
  openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", "ca.key", "-subj", "/CN=outboxd test CA", "-days", "2", "-out", "ca.pem");
  issue("server", "localhost", "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n");
  issue("client", "payments", "extendedKeyUsage=clientAuth\n");
  ca = readFileSync(join(dir, "ca.pem"));
  writeFileSync(
    join(dir, "auth.toml"),
    `[[principal]]
name = "operator"
tokens = ["sha256:${sha256(token)}"]
permissions = ["*"]

[[principal]]
name = "other-team"
tokens = ["sha256:${sha256(consumeOnly)}"]
permissions = ["consume:theirs"]
`,
  );
  db = await TestDatabase.create();
  const serverTls = ["--tls-cert", join(dir, "server.pem"), "--tls-key", join(dir, "server.key")];
  tlsAuth = await Outboxd.start(db.url, [...serverTls, "--auth-file", join(dir, "auth.toml")]);
  mtls = await Outboxd.start(db.url, [...serverTls, "--tls-client-ca", join(dir, "ca.pem")]);
});

after(async () => {
  await tlsAuth?.kill();
  await mtls?.kill();
  await db?.drop();
  if (dir !== undefined) {
    rmSync(dir, { recursive: true, force: true });
  }
});

const https = (d: Outboxd) => `https://${d.addr}`;

async function code(p: Promise<unknown>): Promise<Code> {
  return (await failure(p)).code;
}

test("over TLS with a token: the admin client and a Subscriber work; the token goes on every call", async () => {
  const admin = new AdminClient(https(tlsAuth), { token, tls: { ca } });
  // A function token source is asked for the token at each call.
  let asked = 0;
  const rotating = new AdminClient(https(tlsAuth), { token: () => (asked++, token), tls: { ca: ca.toString() } });
  try {
    await admin.createConsumer({ name: "secure", topics: ["secure.>"] });
    assert.equal((await rotating.getConsumer("secure")).name, "secure");
    await rotating.listConsumers();
    assert.equal(asked, 2);

    const sql = await db.connect();
    const id = await enqueue(sql, { topic: "secure.created", type: "T", payload: "{}" });
    await sql.end();
    const got: string[] = [];
    const subscriber = new Subscriber({
      server: https(tlsAuth),
      consumer: "secure",
      token,
      tls: { ca },
      handler: (d) => void got.push(d.messageId),
    });
    const running = subscriber.run();
    await eventually("delivered over TLS", 10_000, () => got.includes(id));
    await subscriber.stop();
    await running;
    assert.equal((await admin.getStats("secure")).consumers[0]?.acked, 1n);
  } finally {
    admin.close();
    rotating.close();
  }
});

test("without a token, or with an unknown one, calls are UNAUTHENTICATED and run() rejects", async () => {
  const anonymous = new AdminClient(https(tlsAuth), { tls: { ca } });
  const wrong = new AdminClient(https(tlsAuth), { token: "not-a-known-token", tls: { ca } });
  try {
    assert.equal(await code(anonymous.listConsumers()), Code.Unauthenticated);
    assert.equal(await code(wrong.listConsumers()), Code.Unauthenticated);
  } finally {
    anonymous.close();
    wrong.close();
  }
  const subscriber = new Subscriber({ server: https(tlsAuth), consumer: "secure", token: "not-a-known-token", tls: { ca }, handler: () => undefined });
  assert.equal(await code(subscriber.run()), Code.Unauthenticated);
});

test("a principal without the permission is PERMISSION_DENIED, and run() rejects instead of retrying", async () => {
  const subscriber = new Subscriber({ server: https(tlsAuth), consumer: "secure", token: consumeOnly, tls: { ca }, handler: () => undefined });
  await assert.rejects(subscriber.run(), (e: unknown) => {
    const error = ConnectError.from(e);
    return error.code === Code.PermissionDenied && /consume:secure/.test(error.rawMessage);
  });
});

test("a certificate the CA did not sign is refused: the server is checked", async () => {
  const systemRoots = new AdminClient(https(tlsAuth), { token });
  try {
    const e = await failure(systemRoots.listConsumers());
    assert.match(e.rawMessage, /unable to verify the first certificate/);
  } finally {
    systemRoots.close();
  }
});

test("mTLS: a client certificate (cert and key, PEM) is accepted; without one the handshake fails", async () => {
  const withCert = new AdminClient(https(mtls), {
    tls: { ca, cert: readFileSync(join(dir, "client.pem")), key: readFileSync(join(dir, "client.key"), "utf8") },
  });
  const without = new AdminClient(https(mtls), { tls: { ca } });
  try {
    assert.ok(Array.isArray(await withCert.listConsumers()));
    const e = await failure(without.listConsumers());
    assert.match(e.rawMessage, /certificate required/);
  } finally {
    withCert.close();
    without.close();
  }
});
