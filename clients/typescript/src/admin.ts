// The admin client: one method per OutboxAdmin RPC, camelCase, each returning a promise (the
// two streaming RPCs an async iterable). Answers are the generated message types, each with a
// `toJSON` (so `JSON.stringify(answer)` writes its canonical proto3 JSON: int64 as strings).
import { create, type MessageInitShape, type Message as PbMessage } from "@bufbuild/protobuf";
import { DurationSchema, durationFromMs, timestampFromDate, type Duration, type Timestamp } from "@bufbuild/protobuf/wkt";
import { createClient, type Client } from "@connectrpc/connect";

import { Connection, type ConnectionOptions } from "./connection.js";
import { withToJSON } from "./json.js";
import {
  ConsumerSchema,
  Consumer_StartFrom,
  DeadKeyPolicy,
  OutboxAdmin,
  type Consumer,
  type DeadLetter,
  type GetMessageResponse,
  type GetStatsResponse,
  type HeldKey,
  type ListDeadLettersResponse,
  type ListHeldKeysResponse,
  type Message,
  type PruneResponse,
  type ReplayProgress,
  type ReplayResponse,
} from "./gen/outbox/v1/admin_pb.js";

/** A duration: milliseconds, or a `google.protobuf.Duration`. */
export type DurationInput = number | Duration | { seconds?: bigint | number; nanos?: number };
/** An instant: a `Date`, or a `google.protobuf.Timestamp`. */
export type TimestampInput = Date | Timestamp;

/**
 * A consumer to create: `name` and `topics` (exact names or patterns, `orders.*` one segment,
 * `orders.>` the rest), and optionally the retry policy, ack deadline, start and sink.
 */
export type ConsumerInput = Omit<
  MessageInitShape<typeof ConsumerSchema>,
  "backoffBase" | "backoffMax" | "ackDeadline" | "startFrom" | "deadKeyPolicy" | "createdAt" | "$typeName"
> & {
  name: string;
  topics: string[];
  /** Retry n waits backoffBase · 2^(n−1), capped at backoffMax; defaults 1 s and 5 min. */
  backoffBase?: DurationInput;
  backoffMax?: DurationInput;
  /** How long a stream may hold a delivery unacked; default 30 s. */
  ackDeadline?: DurationInput;
  /** `NEW` (the default): messages enqueued from now on; `EARLIEST`: all retained. */
  startFrom?: Consumer_StartFrom | "NEW" | "EARLIEST";
  /**
   * When a message with an ordering key dead-letters: `"skip"` (the default) delivers the key's
   * next messages; `"hold"` holds the key, its later messages waiting until the dead one is
   * replayed and acked or the key is released (`listHeldKeys`, `releaseKey`).
   */
  deadKeyPolicy?: DeadKeyPolicy | "skip" | "hold";
};

/** Which messages `replay` makes due again for a consumer (see ReplayRequest in admin.proto). */
export interface ReplayOptions {
  messageIds?: string[];
  deadLetters?: boolean;
  /** Inclusive. */
  enqueuedAfter?: TimestampInput;
  /** Exclusive. */
  enqueuedBefore?: TimestampInput;
  dryRun?: boolean;
  allowBeyondRetention?: boolean;
  types?: string[];
  topics?: string[];
  maxPerSecond?: number;
}

/** What `releaseKey` takes: `skipDead` leaves the dead message dead and lets the waiting ones go. */
export interface ReleaseKeyOptions {
  skipDead?: boolean;
}

/** What `getStats` takes besides a consumer's name: `{ consumer }` (absent: every consumer). */
export interface StatsOptions {
  consumer?: string;
}

/** Options of a streaming call: an `AbortSignal` ends it. */
export interface StreamOptions {
  signal?: AbortSignal;
}

function duration(field: string, d: DurationInput | undefined): Duration | undefined {
  if (d === undefined) {
    return undefined;
  }
  if (typeof d === "number") {
    if (!Number.isFinite(d) || d < 0) {
      throw new RangeError(`${field}: ${d} is not a duration in milliseconds (a finite number >= 0)`);
    }
    return durationFromMs(d);
  }
  return create(DurationSchema, { seconds: BigInt(d.seconds ?? 0), nanos: d.nanos ?? 0 });
}

function timestamp(t: TimestampInput | undefined): Timestamp | undefined {
  if (t === undefined || !(t instanceof Date)) {
    return t;
  }
  if (Number.isNaN(t.getTime())) {
    throw new RangeError("timestamp: an invalid Date");
  }
  return timestampFromDate(t);
}

function startFrom(s: ConsumerInput["startFrom"]): Consumer_StartFrom | undefined {
  switch (s) {
    case undefined:
      return undefined;
    case "NEW":
      return Consumer_StartFrom.NEW;
    case "EARLIEST":
      return Consumer_StartFrom.EARLIEST;
    default:
      if (s !== Consumer_StartFrom.NEW && s !== Consumer_StartFrom.EARLIEST) {
        throw new TypeError(`startFrom: ${JSON.stringify(s)} is not NEW or EARLIEST`);
      }
      return s;
  }
}

function deadKeyPolicy(p: ConsumerInput["deadKeyPolicy"]): DeadKeyPolicy | undefined {
  switch (p) {
    case undefined:
      return undefined;
    case "skip":
      return DeadKeyPolicy.SKIP;
    case "hold":
      return DeadKeyPolicy.HOLD;
    default:
      if (p !== DeadKeyPolicy.UNSPECIFIED && p !== DeadKeyPolicy.SKIP && p !== DeadKeyPolicy.HOLD) {
        throw new TypeError(`deadKeyPolicy: ${JSON.stringify(p)} is not "skip" or "hold"`);
      }
      return p;
  }
}

function consumerName(field: string, name: unknown): string {
  if (typeof name !== "string" || name === "") {
    throw new TypeError(`${field}: a consumer name is required`);
  }
  return name;
}

/**
 * The admin API of one outboxd: `new AdminClient("https://outboxd:50051", { token, tls })`.
 * Errors are `ConnectError`s with the server's gRPC code (`Code.NotFound`, …) and message.
 */
export class AdminClient {
  private readonly connection: Connection;
  private readonly rpc: Client<typeof OutboxAdmin>;

  constructor(server: string, options: ConnectionOptions = {}) {
    this.connection = new Connection(server, options);
    this.rpc = createClient(OutboxAdmin, this.connection.transport);
  }

  /** Creates a consumer; the same definition again returns it, a different one is ALREADY_EXISTS. */
  async createConsumer(consumer: ConsumerInput): Promise<Consumer> {
    if (consumer === null || typeof consumer !== "object") {
      throw new TypeError("createConsumer: a consumer {name, topics, …} is required");
    }
    const { backoffBase, backoffMax, ackDeadline, startFrom: from, deadKeyPolicy: policy, ...rest } = consumer;
    const res = await this.rpc.createConsumer({
      consumer: {
        ...rest,
        name: consumerName("name", consumer.name),
        backoffBase: duration("backoffBase", backoffBase),
        backoffMax: duration("backoffMax", backoffMax),
        ackDeadline: duration("ackDeadline", ackDeadline),
        startFrom: startFrom(from),
        deadKeyPolicy: deadKeyPolicy(policy),
      },
    });
    return withToJSON(required(res.consumer, "CreateConsumer"));
  }

  async getConsumer(name: string): Promise<Consumer> {
    const res = await this.rpc.getConsumer({ consumer: consumerName("name", name) });
    return withToJSON(required(res.consumer, "GetConsumer"));
  }

  async listConsumers(): Promise<Consumer[]> {
    return (await this.rpc.listConsumers({})).consumers.map(withToJSON);
  }

  /** Deletes a consumer and its deliveries. */
  async deleteConsumer(name: string): Promise<void> {
    await this.rpc.deleteConsumer({ consumer: consumerName("name", name) });
  }

  /** A paused consumer keeps collecting deliveries, and streams get none of them. */
  async pauseConsumer(name: string): Promise<Consumer> {
    const res = await this.rpc.pauseConsumer({ consumer: consumerName("name", name) });
    return withToJSON(required(res.consumer, "PauseConsumer"));
  }

  async resumeConsumer(name: string): Promise<Consumer> {
    const res = await this.rpc.resumeConsumer({ consumer: consumerName("name", name) });
    return withToJSON(required(res.consumer, "ResumeConsumer"));
  }

  /**
   * The relay's backlog, each consumer's counts, and outboxd's tables; one consumer's if named,
   * as a string (`getStats("billing")`) or an object (`getStats({ consumer: "billing" })`).
   */
  async getStats(consumer?: string | StatsOptions): Promise<GetStatsResponse> {
    let name: unknown = consumer;
    if (consumer !== null && typeof consumer === "object" && !Array.isArray(consumer)) {
      name = (consumer as StatsOptions).consumer;
    }
    if (name !== undefined && typeof name !== "string") {
      throw new TypeError(`getStats: expected a consumer name (string) or { consumer: string }, got ${typeOf(consumer)}`);
    }
    return withToJSON(await this.rpc.getStats({ consumer: name ?? "" }));
  }

  /** One page of a consumer's dead letters; pass `nextPageToken` back for the next. */
  async listDeadLetters(
    consumer: string,
    page: { pageSize?: number; pageToken?: string } = {},
  ): Promise<ListDeadLettersResponse> {
    return withToJSON(
      await this.rpc.listDeadLetters({
        consumer: consumerName("consumer", consumer),
        pageSize: page.pageSize ?? 0,
        pageToken: page.pageToken ?? "",
      }),
    );
  }

  /** Every dead letter of a consumer, page after page. */
  async *deadLetters(consumer: string, pageSize = 100): AsyncGenerator<DeadLetter> {
    let pageToken = "";
    do {
      const page = await this.listDeadLetters(consumer, { pageSize, pageToken });
      yield* page.deadLetters.map(withToJSON);
      pageToken = page.nextPageToken;
    } while (pageToken !== "");
  }

  /**
   * The ordering keys a consumer with `deadKeyPolicy: "hold"` holds because a message of the key
   * dead-lettered: oldest first, at most 1000 (`truncated` when more are held).
   */
  async listHeldKeys(consumer: string): Promise<ListHeldKeysResponse> {
    return withToJSON(await this.rpc.listHeldKeys({ consumer: consumerName("consumer", consumer) }));
  }

  /**
   * Lets a held key flow again; resolves the key as it was held, NOT_FOUND if it is not held.
   * The dead message is delivered again first (as a replay of it would), then the waiting ones
   * once it is acked; with `skipDead` it stays a dead letter and the waiting ones go. Needs
   * `replay:CONSUMER`.
   */
  async releaseKey(consumer: string, orderingKey: string, options: ReleaseKeyOptions = {}): Promise<HeldKey> {
    if (typeof orderingKey !== "string" || orderingKey === "") {
      throw new TypeError(`releaseKey: expected an ordering key (a non-empty string), got ${typeOf(orderingKey)}`);
    }
    const skipDead: unknown = options?.skipDead;
    if (options === null || typeof options !== "object" || (skipDead !== undefined && typeof skipDead !== "boolean")) {
      throw new TypeError(`releaseKey: options are { skipDead?: boolean }, got ${typeOf(options)}`);
    }
    const res = await this.rpc.releaseKey({
      consumer: consumerName("consumer", consumer),
      orderingKey,
      skipDead: skipDead ?? false,
    });
    return withToJSON(required(res.key, "ReleaseKey", "a key"));
  }

  /** A message and its delivery state for each consumer; NOT_FOUND if unknown. */
  async getMessage(messageId: string): Promise<GetMessageResponse> {
    if (typeof messageId !== "string" || messageId === "") {
      throw new TypeError(`getMessage: expected a message id (a UUID string), got ${typeOf(messageId)}`);
    }
    return withToJSON(await this.rpc.getMessage({ messageId }));
  }

  /** Makes the selected deliveries due again, bypassing the inbox; resolves when done. */
  async replay(consumer: string, options: ReplayOptions): Promise<ReplayResponse> {
    return withToJSON(await this.rpc.replay(replayRequest(consumer, options)));
  }

  /** `replay` with progress: one `ReplayProgress` after the count and after each batch. */
  replayStream(consumer: string, options: ReplayOptions, call: StreamOptions = {}): AsyncIterable<ReplayProgress> {
    return mapStream(this.rpc.replayStream(replayRequest(consumer, options), { signal: call.signal }));
  }

  /** Deletes relayed messages older than `olderThan` (default: the server's retention). */
  async prune(options: { olderThan?: DurationInput } = {}): Promise<PruneResponse> {
    return withToJSON(await this.rpc.prune({ olderThan: duration("olderThan", options.olderThan) }));
  }

  /** Messages as they are committed, for watching (best effort); end it with `signal`. */
  tail(options: { topics?: string[] } & StreamOptions = {}): AsyncIterable<Message> {
    return mapStream(this.rpc.tail({ topics: options.topics ?? [] }, { signal: options.signal }));
  }

  /** Closes the connection (and any stream still open on it). */
  close(): void {
    this.connection.close();
  }
}

function replayRequest(consumer: string, o: ReplayOptions) {
  if (o === null || typeof o !== "object") {
    throw new TypeError("replay: options {messageIds | deadLetters | enqueuedAfter/enqueuedBefore, …} are required");
  }
  return {
    consumer: consumerName("consumer", consumer),
    messageIds: o.messageIds ?? [],
    deadLetters: o.deadLetters ?? false,
    enqueuedAfter: timestamp(o.enqueuedAfter),
    enqueuedBefore: timestamp(o.enqueuedBefore),
    dryRun: o.dryRun ?? false,
    allowBeyondRetention: o.allowBeyondRetention ?? false,
    types: o.types ?? [],
    topics: o.topics ?? [],
    maxPerSecond: o.maxPerSecond ?? 0,
  };
}

/** The messages of a server stream, each with its `toJSON`. */
async function* mapStream<T extends PbMessage>(stream: AsyncIterable<T>): AsyncGenerator<T> {
  for await (const m of stream) {
    yield withToJSON(m);
  }
}

function typeOf(value: unknown): string {
  if (value === null) {
    return "null";
  }
  if (Array.isArray(value)) {
    return "an array";
  }
  return typeof value === "object" ? `an object ${JSON.stringify(Object.keys(value))}` : `${typeof value} ${String(value)}`;
}

function required<T>(value: T | undefined, rpc: string, what = "a consumer"): T {
  if (value === undefined) {
    throw new Error(`${rpc} answered without ${what}`);
  }
  return value;
}
