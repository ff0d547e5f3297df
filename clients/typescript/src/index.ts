// @outboxd/client: produce in your own PostgreSQL transaction, consume with a Subscriber,
// administer with an AdminClient; TLS and bearer tokens on every connection.
export { enqueue, ackIn, type EnqueueMessage, type Queryable } from "./sql.js";
export {
  Subscriber,
  MAX_CONCURRENCY,
  MAX_ERROR_BYTES,
  type Delivery,
  type Handler,
  type Logger,
  type SubscriberOptions,
} from "./subscriber.js";
export {
  AdminClient,
  type ConsumerInput,
  type DurationInput,
  type ReleaseKeyOptions,
  type ReplayOptions,
  type StatsOptions,
  type StreamOptions,
  type TimestampInput,
} from "./admin.js";
// The JSON form of answers (canonical proto3 JSON: int64 as strings); answers' own toJSON uses it.
export { messageToJson, messageToJsonString, type MessageJsonOptions } from "./json.js";
export type { ConnectionOptions, TlsOptions, TokenSource } from "./connection.js";
// Errors from outboxd are ConnectErrors: `err.code === Code.NotFound`, `err.rawMessage`.
export { Code, ConnectError } from "@connectrpc/connect";
// The generated wire types (admin answers are these), for whoever needs the raw messages.
export * as pb from "./pb.js";
