// Connecting to outboxd: the address forms, TLS, and the bearer token on every call.
import type { Interceptor, Transport } from "@connectrpc/connect";
import { createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";

/**
 * TLS material, each a PEM **string or Buffer holding the PEM text** (not a file path: read
 * files yourself, e.g. `readFileSync("ca.pem")`, so that rotation and secret stores stay
 * yours).
 */
export interface TlsOptions {
  /** CA certificates the server's certificate must chain to; the system's roots when absent. */
  ca?: string | Buffer;
  /** A client certificate chain, for outboxd's `--tls-client-ca` (mTLS); needs `key`. */
  cert?: string | Buffer;
  /** The private key of `cert`. */
  key?: string | Buffer;
}

/**
 * A bearer token, sent as `authorization: Bearer <token>` on every call; or a function that
 * returns it, asked before every call (a stream asks once per connection), so that a rotated
 * token is picked up.
 */
export type TokenSource = string | (() => string | Promise<string>);

/** How to reach and authenticate to outboxd; shared by `Subscriber` and `AdminClient`. */
export interface ConnectionOptions {
  token?: TokenSource;
  /** TLS options; an `https://` address is TLS with the system's roots without them. */
  tls?: TlsOptions;
}

/** Deliveries and admin answers may carry payloads up to the server's limit (64 MiB at most). */
export const MAX_MESSAGE_BYTES = 80 * 1024 * 1024;

/**
 * The base URL of a server address: `host:port` and `http://host:port` are plaintext (HTTP/2
 * without TLS), `https://host:port` is TLS.
 */
export function baseUrl(server: string, tls: TlsOptions | undefined): URL {
  if (typeof server !== "string" || server.trim() === "") {
    throw new TypeError("server: an address is required (host:port, http://host:port or https://host:port)");
  }
  const text = server.includes("://") ? server : `http://${server}`;
  let url: URL;
  try {
    url = new URL(text);
  } catch {
    throw new TypeError(`server: ${JSON.stringify(server)} is not an address (host:port, http://host:port or https://host:port)`);
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") {
    throw new TypeError(`server: ${JSON.stringify(server)} has the scheme ${url.protocol.slice(0, -1)}; use http:// or https://`);
  }
  if (url.pathname !== "/" || url.search !== "" || url.hash !== "" || url.username !== "" || url.password !== "") {
    throw new TypeError(`server: ${JSON.stringify(server)} must be only a scheme, a host and a port`);
  }
  if (tls !== undefined && url.protocol !== "https:") {
    throw new TypeError(`tls: TLS options were given but ${JSON.stringify(server)} is not an https:// address`);
  }
  if ((tls?.cert === undefined) !== (tls?.key === undefined)) {
    throw new TypeError("tls: a client certificate needs both cert and key");
  }
  return url;
}

// What an HTTP/2 header value carries as it is, without spaces: visible ASCII.
const TOKEN_CHARS = /^[\x21-\x7e]+$/;

function checkToken(raw: unknown): string {
  if (typeof raw !== "string") {
    throw new TypeError(`token: expected a string, got ${typeof raw}`);
  }
  const token = raw.trim();
  if (token === "") {
    throw new TypeError("token: the token is empty");
  }
  if (!TOKEN_CHARS.test(token)) {
    throw new TypeError("token: the token has characters a header cannot carry (visible ASCII only, no spaces)");
  }
  return token;
}

async function resolveToken(source: TokenSource): Promise<string> {
  return checkToken(typeof source === "function" ? await source() : source);
}

function bearer(source: TokenSource): Interceptor {
  return (next) => async (req) => {
    req.header.set("authorization", `Bearer ${await resolveToken(source)}`);
    return next(req);
  };
}

/**
 * One HTTP/2 connection to `server` (opened on first use, re-opened after it fails) and the
 * gRPC transport over it; `close()` ends it and every call on it.
 */
export class Connection {
  readonly transport: Transport;
  readonly url: URL;
  private readonly sessions: Http2SessionManager;

  constructor(server: string, options: ConnectionOptions = {}) {
    this.url = baseUrl(server, options.tls);
    if (options.token !== undefined && typeof options.token !== "function") {
      // A bad token fails here, not on the first call.
      checkToken(options.token);
    }
    const tls = options.tls;
    this.sessions = new Http2SessionManager(
      this.url,
      // A dead connection is noticed within a minute even when nothing flows on it.
      { pingIntervalMs: 30_000, pingTimeoutMs: 15_000, pingIdleConnection: true },
      this.url.protocol === "https:" ? { ca: tls?.ca, cert: tls?.cert, key: tls?.key } : {},
    );
    this.transport = createGrpcTransport({
      baseUrl: this.url.origin,
      sessionManager: this.sessions,
      interceptors: options.token === undefined ? [] : [bearer(options.token)],
      readMaxBytes: MAX_MESSAGE_BYTES,
      writeMaxBytes: MAX_MESSAGE_BYTES,
    });
  }

  /** Closes the connection and the calls still open on it. */
  close(): void {
    this.sessions.abort();
  }
}
