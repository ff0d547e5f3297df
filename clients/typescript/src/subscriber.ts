// The subscriber runtime: one Subscribe stream at a time, a handler per delivery.
//
// A handler that resolves acks its delivery; one that rejects (or throws) nacks it with the
// error's message, cut to MAX_ERROR_BYTES: retried after the consumer's backoff, dead after
// max_deliveries. At most `concurrency` handlers run at once, and the stream asks for exactly
// that many deliveries in flight, so nothing waits unstarted on the client. A handler that
// outlasts the ack deadline keeps its lease: it is extended every half lease while the
// handler runs. Acks (and extends) that fall due together go out as one request.
//
// A lost connection (UNAVAILABLE, a reset, the server ending the stream) is re-established
// with exponential backoff and jitter, after the handlers still running have finished (their
// acks die with the old stream: those deliveries come again, which the inbox absorbs). Errors
// that retrying cannot fix (NOT_FOUND, INVALID_ARGUMENT, PERMISSION_DENIED, UNAUTHENTICATED,
// FAILED_PRECONDITION) reject `run()`.
//
// Stopping: `stop()` starts no new handler, lets the running ones finish and sends their acks,
// then half-closes the stream; outboxd then releases what it had sent and nobody started, at
// once and without counting it as a failed delivery.
import type { MessageInitShape } from "@bufbuild/protobuf";
import { durationFromMs, timestampDate } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, createClient, type Client } from "@connectrpc/connect";

import { Connection, type ConnectionOptions } from "./connection.js";
import {
  Outbox,
  type Delivery as PbDelivery,
  type SubscribeRequestSchema,
  type SubscribeResponse,
} from "./gen/outbox/v1/outbox_pb.js";
import { ackIn, type Queryable } from "./sql.js";

/** Nack texts are cut to this many bytes (outboxd stores at most this much of `last_error`). */
export const MAX_ERROR_BYTES = 4096;
/** The most deliveries a stream may hold (outboxd's limit on `max_in_flight`). */
export const MAX_CONCURRENCY = 10_000;
// The most ids one ack or extend request carries (outboxd accepts up to 10 000).
const IDS_PER_REQUEST = 1000;
// How long a stopping subscriber waits for outboxd to end the stream after the half-close.
const CLOSE_GRACE_MS = 5000;

/** One delivery handed to a handler. */
export interface Delivery {
  consumer: string;
  messageId: string;
  seq: bigint;
  topic: string;
  type: string;
  payload: Uint8Array;
  headers: Record<string, string>;
  orderingKey?: string;
  enqueuedAt?: Date;
  /** 1 on the first delivery to this consumer. */
  deliveryCount: number;
  /** Ack before this instant (the subscriber extends it while the handler runs). */
  ackDeadline?: Date;
  /** The transactional ack of this delivery on `client` (see `ackIn`). */
  ackIn(client: Queryable): Promise<boolean>;
}

/** Resolves: ack. Rejects or throws: nack with the error's message. */
export type Handler = (delivery: Delivery) => Promise<unknown> | unknown;

/** Where the subscriber reports reconnects; `console` by default (warnings only). */
export interface Logger {
  info(message: string): void;
  warn(message: string): void;
}

export interface SubscriberOptions extends ConnectionOptions {
  /** `host:port`, `http://host:port` (plaintext) or `https://host:port` (TLS). */
  server: string;
  consumer: string;
  handler: Handler;
  /** Handlers running at once, and the stream's `max_in_flight`; default 16. */
  concurrency?: number;
  /** Overrides the consumer's ack deadline for this stream (at least 100 ms). */
  ackDeadlineMs?: number;
  /** First and longest wait before reconnecting; defaults 100 ms and 10 s. */
  reconnectMinMs?: number;
  reconnectMaxMs?: number;
  /** Aborting it is `stop()`. */
  signal?: AbortSignal;
  logger?: Logger;
}

/** Errors that reconnecting cannot fix: `run()` rejects with them. */
const PERMANENT = new Set([
  Code.NotFound,
  Code.InvalidArgument,
  Code.PermissionDenied,
  Code.Unauthenticated,
  Code.FailedPrecondition,
]);

type Request = MessageInitShape<typeof SubscribeRequestSchema>;

/** The requests of one stream, as the async iterable the transport reads. */
class RequestQueue implements AsyncIterable<Request> {
  private items: Request[] = [];
  private wake: (() => void) | undefined;
  private closed = false;

  push(item: Request): void {
    if (this.closed) {
      return;
    }
    this.items.push(item);
    this.wake?.();
  }

  /** Ends the iterable once what was pushed is taken: the stream's half-close. */
  close(): void {
    this.closed = true;
    this.wake?.();
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<Request> {
    for (;;) {
      const item = this.items.shift();
      if (item !== undefined) {
        yield item;
      } else if (this.closed) {
        return;
      } else {
        await new Promise<void>((resolve) => (this.wake = resolve));
        this.wake = undefined;
      }
    }
  }
}

/**
 * Gathers the acks and extends that fall due in one turn of the event loop into one request
 * each; nacks go one by one (each has its own error).
 */
class Outgoing {
  private acks: string[] = [];
  private extends = new Map<number, string[]>();
  private scheduled = false;

  constructor(private readonly queue: RequestQueue) {}

  ack(id: string): void {
    this.acks.push(id);
    this.schedule();
  }

  extend(id: string, deadlineMs: number): void {
    const ids = this.extends.get(deadlineMs) ?? [];
    ids.push(id);
    this.extends.set(deadlineMs, ids);
    this.schedule();
  }

  nack(id: string, error: string): void {
    this.flush();
    this.queue.push({ request: { case: "nack", value: { messageId: id, error } } });
  }

  private schedule(): void {
    if (!this.scheduled) {
      this.scheduled = true;
      setImmediate(() => this.flush());
    }
  }

  /** Sends what is gathered now. */
  flush(): void {
    this.scheduled = false;
    for (const [deadlineMs, ids] of this.extends) {
      for (const chunk of chunks(ids)) {
        this.queue.push({
          request: { case: "extend", value: { messageIds: chunk, deadline: durationFromMs(deadlineMs) } },
        });
      }
    }
    this.extends.clear();
    for (const chunk of chunks(this.acks)) {
      this.queue.push({ request: { case: "ack", value: { messageIds: chunk } } });
    }
    this.acks = [];
  }
}

function chunks(ids: string[]): string[][] {
  const out: string[][] = [];
  for (let i = 0; i < ids.length; i += IDS_PER_REQUEST) {
    out.push(ids.slice(i, i + IDS_PER_REQUEST));
  }
  return out;
}

/** The text of a handler's failure, at most MAX_ERROR_BYTES of UTF-8, cut between characters. */
export function errorText(error: unknown): string {
  let text: string;
  if (error instanceof Error) {
    text = error.message === "" ? error.name : error.message;
  } else {
    try {
      text = typeof error === "string" ? error : (JSON.stringify(error) ?? String(error));
    } catch {
      text = String(error);
    }
  }
  if (text === "") {
    text = "handler failed";
  }
  if (Buffer.byteLength(text, "utf8") <= MAX_ERROR_BYTES) {
    return text;
  }
  let bytes = 0;
  let end = 0;
  for (const ch of text) {
    const n = Buffer.byteLength(ch, "utf8");
    if (bytes + n > MAX_ERROR_BYTES) {
      break;
    }
    bytes += n;
    end += ch.length;
  }
  return text.slice(0, end);
}

function positiveInt(field: string, value: number | undefined, fallback: number, max: number): number {
  if (value === undefined) {
    return fallback;
  }
  if (!Number.isInteger(value) || value < 1 || value > max) {
    throw new RangeError(`${field}: ${value} is not a whole number from 1 to ${max}`);
  }
  return value;
}

const defaultLogger: Logger = {
  info: () => undefined,
  warn: (message) => console.warn(message),
};

type SessionEnd = "stopped" | "server-closed";

const STOP = Symbol("stop");

/**
 * Consumes one consumer's deliveries with `handler` until `stop()`:
 *
 * ```ts
 * const subscriber = new Subscriber({ server: "localhost:50051", consumer: "billing", handler: async (d) => { … } });
 * process.on("SIGTERM", () => subscriber.stop());
 * await subscriber.run();
 * ```
 */
export class Subscriber {
  readonly consumer: string;
  private readonly handler: Handler;
  private readonly concurrency: number;
  private readonly ackDeadlineMs: number | undefined;
  private readonly reconnectMinMs: number;
  private readonly reconnectMaxMs: number;
  private readonly logger: Logger;
  private readonly connection: Connection;
  private readonly rpc: Client<typeof Outbox>;
  // Who waits for stop(): each waits on a promise of its own, dropped when its wait ends, so
  // that waiting once per delivery keeps nothing alive (racing one long-lived promise would
  // add a reaction to it per delivery).
  private readonly stopWaiters = new Set<() => void>();
  private stopping = false;
  private running: Promise<void> | undefined;
  private warnedSkew = false;

  constructor(options: SubscriberOptions) {
    if (options === null || typeof options !== "object") {
      throw new TypeError("Subscriber: options {server, consumer, handler, …} are required");
    }
    if (typeof options.consumer !== "string" || options.consumer === "") {
      throw new TypeError("consumer: a consumer name is required");
    }
    if (typeof options.handler !== "function") {
      throw new TypeError("handler: a function (delivery) => Promise is required");
    }
    this.consumer = options.consumer;
    this.handler = options.handler;
    this.concurrency = positiveInt("concurrency", options.concurrency, 16, MAX_CONCURRENCY);
    if (options.ackDeadlineMs !== undefined && !(options.ackDeadlineMs >= 100 && options.ackDeadlineMs <= 86_400_000)) {
      throw new RangeError(`ackDeadlineMs: ${options.ackDeadlineMs} is outside 100 ms to 24 hours`);
    }
    this.ackDeadlineMs = options.ackDeadlineMs;
    this.reconnectMinMs = positiveInt("reconnectMinMs", options.reconnectMinMs, 100, 3_600_000);
    this.reconnectMaxMs = positiveInt("reconnectMaxMs", options.reconnectMaxMs, 10_000, 3_600_000);
    if (this.reconnectMaxMs < this.reconnectMinMs) {
      throw new RangeError(`reconnectMaxMs: ${this.reconnectMaxMs} is below reconnectMinMs ${this.reconnectMinMs}`);
    }
    this.logger = options.logger ?? defaultLogger;
    this.connection = new Connection(options.server, options);
    this.rpc = createClient(Outbox, this.connection.transport);
    if (options.signal !== undefined) {
      if (options.signal.aborted) {
        this.stopping = true;
      } else {
        options.signal.addEventListener("abort", () => void this.stop(), { once: true });
      }
    }
  }

  /**
   * Consumes until `stop()` (then resolves, once running handlers have finished and their
   * acks are sent) or an error that reconnecting cannot fix (then rejects with it, a
   * `ConnectError` whose `code` says which).
   */
  run(): Promise<void> {
    if (this.running !== undefined) {
      throw new Error("Subscriber.run: a Subscriber runs once; make a new one to run again");
    }
    this.running = this.loop().finally(() => this.connection.close());
    return this.running;
  }

  /**
   * Stops gracefully: no new handler starts; running ones finish and are acked; the stream is
   * closed. Resolves when `run()` has finished (at once if it is not running).
   */
  async stop(): Promise<void> {
    this.stopping = true;
    for (const wake of this.stopWaiters) {
      wake();
    }
    this.stopWaiters.clear();
    await this.running?.catch(() => undefined);
  }

  /** Resolves with STOP once stop() is called, or `other` first; forgets its waiter after. */
  private async unlessStopped<T>(other: Promise<T>): Promise<T | typeof STOP> {
    let wake!: () => void;
    const stopped = new Promise<typeof STOP>((resolve) => (wake = () => resolve(STOP)));
    if (this.stopping) {
      return STOP;
    }
    this.stopWaiters.add(wake);
    try {
      return await Promise.race([other, stopped]);
    } finally {
      this.stopWaiters.delete(wake);
    }
  }

  private async loop(): Promise<void> {
    let backoff = this.reconnectMinMs;
    while (!this.stopping) {
      try {
        const end = await this.session(() => (backoff = this.reconnectMinMs));
        if (end === "stopped") {
          return;
        }
        this.logger.info(`outboxd: the stream of consumer ${this.consumer} was ended by the server; reconnecting`);
      } catch (e) {
        const error = ConnectError.from(e);
        if (PERMANENT.has(error.code)) {
          throw error;
        }
        this.logger.warn(
          `outboxd: the subscription of consumer ${this.consumer} was lost (${error.message}); reconnecting in about ${backoff} ms`,
        );
      }
      // Equal jitter: between half and all of the backoff, so that clients that lost the
      // same server do not all come back at the same instant.
      const wait = backoff / 2 + Math.random() * (backoff / 2);
      let timer: NodeJS.Timeout | undefined;
      await this.unlessStopped(new Promise((resolve) => (timer = setTimeout(resolve, wait))));
      clearTimeout(timer);
      backoff = Math.min(backoff * 2, this.reconnectMaxMs);
    }
  }

  /** One stream, from `start` to its end. */
  private async session(onOpen: () => void): Promise<SessionEnd> {
    const queue = new RequestQueue();
    const outgoing = new Outgoing(queue);
    queue.push({
      request: {
        case: "start",
        value: {
          consumer: this.consumer,
          maxInFlight: this.concurrency,
          ackDeadline: this.ackDeadlineMs === undefined ? undefined : durationFromMs(this.ackDeadlineMs),
        },
      },
    });
    const abort = new AbortController();
    const responses = this.rpc.subscribe(queue, {
      signal: abort.signal,
      // Headers without a status: the stream is attached (a refusal comes as trailers only).
      onHeader: (headers) => {
        if (!headers.has("grpc-status")) {
          onOpen();
        }
      },
    })[Symbol.asyncIterator]();

    const running = new Set<Promise<void>>();
    let pending: Promise<IteratorResult<SubscribeResponse>> | undefined;
    let end: SessionEnd = "stopped";
    let failure: unknown;
    try {
      while (!this.stopping) {
        pending ??= responses.next();
        const next = await this.unlessStopped(pending);
        if (next === STOP) {
          break;
        }
        pending = undefined;
        if (next.done) {
          end = "server-closed";
          break;
        }
        const response = next.value.response;
        if (response.case !== "delivery") {
          continue;
        }
        // outboxd sends at most `concurrency` unacked deliveries; this holds the bound even
        // against one that did not.
        while (running.size >= this.concurrency && !this.stopping) {
          await this.unlessStopped(Promise.race(running));
        }
        if (this.stopping) {
          break;
        }
        const task = this.handle(response.value, outgoing);
        running.add(task);
        void task.finally(() => running.delete(task));
      }
    } catch (e) {
      failure = e;
    }

    // Running handlers finish and their acks go out (on a broken stream they are lost, and
    // those deliveries come again); then our half of the stream closes.
    await Promise.all(running);
    outgoing.flush();
    queue.close();
    if (failure !== undefined) {
      abort.abort();
      throw failure;
    }
    if (end === "stopped") {
      // outboxd applies everything sent before the half-close, releases the rest, and ends
      // the stream; deliveries that still arrive are not started (it releases them too).
      const drained = (async () => {
        try {
          for (;;) {
            const next = await (pending ?? responses.next());
            pending = undefined;
            if (next.done) {
              return;
            }
          }
        } catch {
          // The stream ending badly after our half-close changes nothing for us.
        }
      })();
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([drained, new Promise((resolve) => (timer = setTimeout(resolve, CLOSE_GRACE_MS)))]);
      clearTimeout(timer);
    }
    abort.abort();
    return end;
  }

  private async handle(pb: PbDelivery, outgoing: Outgoing): Promise<void> {
    const id = pb.messageId;
    const consumer = this.consumer;
    const delivery: Delivery = {
      consumer,
      messageId: id,
      seq: pb.seq,
      topic: pb.topic,
      type: pb.type,
      payload: pb.payload,
      headers: pb.headers,
      orderingKey: pb.orderingKey === "" ? undefined : pb.orderingKey,
      enqueuedAt: pb.enqueuedAt === undefined ? undefined : timestampDate(pb.enqueuedAt),
      deliveryCount: pb.deliveryCount,
      ackDeadline: pb.ackDeadline === undefined ? undefined : timestampDate(pb.ackDeadline),
      ackIn: (client: Queryable) => ackIn(client, consumer, id),
    };
    // The lease granted: the stream's deadline when we chose it, otherwise what is left of
    // the delivery's as it arrives. Extended by as much every half lease while the handler runs.
    const left = this.ackDeadlineMs ?? (delivery.ackDeadline === undefined ? 0 : delivery.ackDeadline.getTime() - Date.now());
    // In steps of 100 ms, so that the extends of deliveries that arrived together batch.
    const lease = left > 0 ? Math.max(100, Math.floor(left / 100) * 100) : 0;
    let ticker: NodeJS.Timeout | undefined;
    if (lease > 0) {
      ticker = setInterval(() => outgoing.extend(id, lease), Math.max(1, Math.floor(lease / 2)));
    } else if (delivery.ackDeadline !== undefined && !this.warnedSkew) {
      this.warnedSkew = true;
      this.logger.warn(
        `outboxd: a delivery to ${consumer} arrived past its ack deadline by this host's clock (clock skew?); ` +
          "leases are not extended: set ackDeadlineMs to extend them",
      );
    }
    try {
      await this.handler(delivery);
      outgoing.ack(id);
    } catch (error) {
      outgoing.nack(id, errorText(error));
    } finally {
      clearInterval(ticker);
    }
  }
}
