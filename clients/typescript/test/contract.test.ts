// The client contract (contract/, ADR 0084): enqueue's topic validation runs the grammar's test
// vectors, and the statements it sends are the contract's (scripts/contract.py --check keeps
// src/contract.ts in step). No database: a stand-in connection records what would be sent.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";

import { ackIn, enqueue, type Queryable } from "@outboxd/client";

import { repoRoot } from "./harness.js";

interface Grammar {
  max_length: number;
  topics: { valid: string[]; invalid: string[] };
}

const grammar = JSON.parse(readFileSync(join(repoRoot, "contract", "topics.json"), "utf8")) as Grammar;
const id = "0193a0b4-7c1e-7d2a-9f00-000000000001";

function statement(name: string): string {
  const text = readFileSync(join(repoRoot, "contract", "sql", name), "utf8");
  return text.split("\n").filter((line) => !line.startsWith("--")).join(" ").split(/\s+/).filter(Boolean).join(" ");
}

/** A connection that answers every statement and remembers what it was sent. */
function recorder(): Queryable & { sent: string[] } {
  const sent: string[] = [];
  return {
    sent,
    async query(text: string) {
      sent.push(text);
      return { rows: [{ message_id: id, acked: true }] };
    },
  };
}

test("every valid topic of the contract is enqueued, with the contract's statement", async () => {
  for (const topic of [...grammar.topics.valid, "a".repeat(grammar.max_length)]) {
    const client = recorder();
    assert.equal(await enqueue(client, { topic, type: "T", payload: "" }), id, topic);
    assert.deepEqual(client.sent, [statement("postgres-enqueue.sql")]);
  }
});

test("every invalid topic of the contract throws before anything is sent", async () => {
  for (const topic of [...grammar.topics.invalid, "a".repeat(grammar.max_length + 1)]) {
    const client = recorder();
    await assert.rejects(enqueue(client, { topic, type: "T", payload: "" }), /topic: /, JSON.stringify(topic));
    assert.deepEqual(client.sent, []);
  }
});

test("the transactional ack sends the contract's statement", async () => {
  const client = recorder();
  assert.equal(await ackIn(client, "billing", id), true);
  assert.deepEqual(client.sent, [statement("postgres-ack.sql")]);
});
