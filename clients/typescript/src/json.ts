// The JSON form of outboxd's answers: the canonical proto3 JSON mapping, as protobuf-es writes
// it. int64 fields (seq, counts) are decimal strings, so no precision is lost and
// `JSON.stringify` works (it throws on a bigint); Timestamps are RFC 3339 strings, Durations
// "1.500s", enums their names, bytes base64, and fields at their default value are left out.
import { createRegistry, isMessage, toJson, type JsonValue, type JsonWriteOptions, type Message } from "@bufbuild/protobuf";
import { file_google_protobuf_duration, file_google_protobuf_timestamp } from "@bufbuild/protobuf/wkt";

import { file_outbox_v1_admin } from "./gen/outbox/v1/admin_pb.js";
import { file_outbox_v1_outbox } from "./gen/outbox/v1/outbox_pb.js";

const registry = createRegistry(
  file_outbox_v1_admin,
  file_outbox_v1_outbox,
  file_google_protobuf_duration,
  file_google_protobuf_timestamp,
);

/** Options of `messageToJson`: protobuf-es's `JsonWriteOptions` (e.g. `alwaysEmitImplicit`). */
export type MessageJsonOptions = Partial<JsonWriteOptions>;

/**
 * The canonical proto3 JSON form of an outboxd message (any answer of `AdminClient`, or any
 * message of `pb`), or of an array of them: int64 as strings, Timestamps as RFC 3339, Durations
 * as `"1.5s"`, enums by name. Throws a TypeError for anything else.
 */
export function messageToJson(message: Message | readonly Message[], options?: MessageJsonOptions): JsonValue {
  if (Array.isArray(message)) {
    return message.map((m) => messageToJson(m, options));
  }
  if (!isMessage(message)) {
    throw new TypeError(`messageToJson: expected an outboxd message (pb.*), got ${describe(message)}`);
  }
  const schema = registry.getMessage(message.$typeName);
  if (schema === undefined) {
    throw new TypeError(`messageToJson: ${message.$typeName} is not a message of outboxd's API`);
  }
  return toJson(schema, message, options);
}

/** `JSON.stringify(messageToJson(message), null, space)`. */
export function messageToJsonString(message: Message | readonly Message[], space?: number | string): string {
  return JSON.stringify(messageToJson(message), null, space);
}

/**
 * Gives an answer a `toJSON` method (not enumerable: it is no field, and equality, cloning and
 * encoding ignore it), so that `JSON.stringify(answer)` writes `messageToJson(answer)`.
 */
export function withToJSON<T extends Message>(message: T): T {
  Object.defineProperty(message, "toJSON", {
    value: () => messageToJson(message),
    enumerable: false,
    configurable: true,
    writable: true,
  });
  return message;
}

function describe(value: unknown): string {
  if (value === null) {
    return "null";
  }
  if (typeof value === "object") {
    return value.constructor?.name === "Object" ? "a plain object" : `a ${value.constructor?.name ?? "object"}`;
  }
  return typeof value;
}
