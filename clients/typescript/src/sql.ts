// Enqueue and the transactional ack, in the caller's own PostgreSQL transaction (node-postgres).
//
// Both call the SQL functions that outboxd's migrations install in schema `outbox`, with the
// statements of the client contract (contract/sql, generated into contract.ts):
//   outbox.enqueue(topic text, type text, payload bytea, headers jsonb, message_id uuid,
//                  ordering_key text) RETURNS uuid
//   outbox.ack(consumer text, message_id uuid) RETURNS boolean
// They run with the owner's rights, so the caller's role needs only `outbox_producer` /
// `outbox_consumer` (EXECUTE on these functions) and no privilege on outboxd's tables.

import { PG_ACK, PG_ENQUEUE, TOPIC, TOPIC_MAX_LENGTH } from "./contract.js";

/**
 * What `enqueue` and `ackIn` need of a connection: a node-postgres `Client` or `PoolClient` on
 * which the caller has begun a transaction (`BEGIN`). A `Pool` works too, but each call is
 * then its own transaction, atomic with nothing of the caller's.
 */
export interface Queryable {
  query(text: string, values: unknown[]): Promise<{ rows: Array<Record<string, unknown>> }>;
}

/** A message to enqueue. */
export interface EnqueueMessage {
  /** Dot-separated segments of [A-Za-z0-9_-], e.g. `orders.created`. */
  topic: string;
  /** The event type, e.g. `OrderPlaced`; at most 255 bytes. */
  type: string;
  /** Opaque bytes; a string is sent as its UTF-8 bytes. */
  payload: Uint8Array | string;
  /** String headers (at most 64, 16 KiB in all); `traceparent` carries W3C trace context. */
  headers?: Record<string, string>;
  /** A UUID chosen for idempotency: enqueueing it again is a success that writes nothing. */
  messageId?: string;
  /** Messages sharing an ordering key are delivered one at a time per consumer. */
  orderingKey?: string;
}

// Validated here so that a bad argument throws before it reaches the database: a failing
// statement would abort the caller's whole transaction.
const UUID = /^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$/;
const MAX_TYPE_BYTES = 255;
const MAX_ORDERING_KEY_BYTES = 255;
/**
 * outboxd's default `--max-payload-bytes`. A producer's login cannot read the server's flag:
 * where it is raised, set `OUTBOXD_MAX_PAYLOAD_BYTES` to the same value for the clients.
 */
export const DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024;

/** The payload limit checked before any SQL runs: `OUTBOXD_MAX_PAYLOAD_BYTES`, else 1 MiB. */
export function maxPayloadBytes(): number {
  const raw = process.env.OUTBOXD_MAX_PAYLOAD_BYTES ?? "";
  if (raw === "") {
    return DEFAULT_MAX_PAYLOAD_BYTES;
  }
  const value = Number(raw);
  if (!Number.isSafeInteger(value) || value <= 0) {
    throw new RangeError(`OUTBOXD_MAX_PAYLOAD_BYTES is ${JSON.stringify(raw)}; it must be a positive number of bytes`);
  }
  return value;
}

function text(field: string, value: unknown, max: number): string {
  if (typeof value !== "string" || value === "") {
    throw new TypeError(`${field}: a non-empty string is required`);
  }
  const bytes = Buffer.byteLength(value, "utf8");
  if (bytes > max) {
    throw new RangeError(`${field}: ${bytes} bytes; the limit is ${max} bytes`);
  }
  return value;
}

export function checkUuid(field: string, value: unknown): string {
  if (typeof value !== "string" || !UUID.test(value)) {
    throw new TypeError(`${field}: ${JSON.stringify(value)} is not a UUID`);
  }
  return value.toLowerCase();
}

function payloadBytes(payload: unknown): Buffer {
  let bytes: Buffer;
  if (typeof payload === "string") {
    bytes = Buffer.from(payload, "utf8");
  } else if (payload instanceof Uint8Array) {
    bytes = Buffer.from(payload.buffer, payload.byteOffset, payload.byteLength);
  } else {
    throw new TypeError(`payload: a Uint8Array or a string is required, got ${payload === null ? "null" : typeof payload}`);
  }
  const limit = maxPayloadBytes();
  if (bytes.byteLength > limit) {
    throw new RangeError(
      `payload: ${bytes.byteLength} bytes; the limit is ${limit} bytes (outboxd's --max-payload-bytes; ` +
        "set OUTBOXD_MAX_PAYLOAD_BYTES to the server's value where it is raised)",
    );
  }
  return bytes;
}

function headersJson(headers: unknown): string {
  if (headers === undefined || headers === null) {
    return "{}";
  }
  if (typeof headers !== "object" || Array.isArray(headers)) {
    throw new TypeError("headers: an object of string values is required");
  }
  for (const [key, value] of Object.entries(headers)) {
    if (typeof value !== "string") {
      throw new TypeError(`headers: the value of ${JSON.stringify(key)} is a ${typeof value}; header values are strings`);
    }
  }
  return JSON.stringify(headers);
}

/**
 * Enqueues a message in the caller's transaction: it exists if and only if that transaction
 * commits. Returns the message id (the one given, or a new UUIDv7); an id that exists already
 * is an idempotent success returning that id.
 *
 * ```ts
 * await client.query("BEGIN");
 * await client.query("INSERT INTO orders (id) VALUES ($1)", [orderId]);
 * const id = await enqueue(client, { topic: "orders.created", type: "OrderPlaced", payload: JSON.stringify({ orderId }) });
 * await client.query("COMMIT");
 * ```
 */
export async function enqueue(client: Queryable, message: EnqueueMessage): Promise<string> {
  if (message === null || typeof message !== "object") {
    throw new TypeError("enqueue: a message {topic, type, payload, headers?, messageId?, orderingKey?} is required");
  }
  const topic = text("topic", message.topic, TOPIC_MAX_LENGTH);
  if (!TOPIC.test(topic)) {
    throw new TypeError(`topic: ${JSON.stringify(topic)} must be dot-separated segments of [A-Za-z0-9_-], without wildcards`);
  }
  const type = text("type", message.type, MAX_TYPE_BYTES);
  const values = [
    topic,
    type,
    payloadBytes(message.payload),
    headersJson(message.headers),
    message.messageId === undefined ? null : checkUuid("messageId", message.messageId),
    message.orderingKey === undefined ? null : text("orderingKey", message.orderingKey, MAX_ORDERING_KEY_BYTES),
  ];
  const result = await client.query(PG_ENQUEUE, values);
  const id = result.rows[0]?.message_id;
  if (typeof id !== "string") {
    throw new Error("outbox.enqueue returned no message id");
  }
  return id;
}

/**
 * The transactional ack: marks `messageId` acked for `consumer` in the caller's transaction,
 * the one that performs the message's effect, so that effect and ack commit together or not
 * at all. Resolves `true` when this call acked it; `false` when there is nothing for it to ack:
 * the delivery was acked already (another delivery of the message got there first), is dead
 * (only a replay delivers it again), or there is no delivery of the message to this consumer
 * (unknown, not its topics, or not relayed yet: that delivery comes later). Then roll the
 * effect back and return normally: `false` never leaves a delivery that can still be delivered
 * without its effect (docs/sql-api.md, `outbox.ack`).
 */
export async function ackIn(client: Queryable, consumer: string, messageId: string): Promise<boolean> {
  if (typeof consumer !== "string" || consumer === "") {
    throw new TypeError("consumer: a consumer name is required");
  }
  const id = checkUuid("messageId", messageId);
  const result = await client.query(PG_ACK, [consumer, id]);
  return result.rows[0]?.acked === true;
}
