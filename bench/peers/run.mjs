// The peers of docs/benchmarks.md, measured as outbox-bench measures outboxd. For each peer
// named, in a database of its own (created, then dropped):
//
// 1. ceiling: pgbench, one row per autocommit transaction into a plain table, 16 clients
//    (`-n -M prepared -c 16 -j 2 -T 8`), before the peer's schema exists;
// 2. completed/s: 16 producers, each on its own connection, commit one job per autocommit
//    transaction as fast as they can for --seconds, while the peer's workers (another process)
//    run them; jobs whose handler returned inside the window, per second;
// 3. latency: the same producers paced to --latency-rate jobs/s in all for --latency-seconds;
//    from each producer's commit returning to the job's handler starting, p50 and p99;
// 4. drain: --drain jobs enqueued in bulk while no worker runs, then the workers start; jobs
//    per second until the last handler returned.
//
// Between phases the queue is emptied by the workers and the database vacuumed and analysed
// (this machine's PostgreSQL may run with autovacuum off). One table row per peer goes to
// stdout, in the shape of docs/benchmarks.md; progress and details go to stderr.
import { execFile as execFileCb, fork } from 'node:child_process';
import { dirname, join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { fileURLToPath } from 'node:url';
import { parseArgs, promisify } from 'node:util';

import pg from 'pg';

import { PEERS, uninstall } from './peers.mjs';

const execFile = promisify(execFileCb);
const HERE = dirname(fileURLToPath(import.meta.url));
const PAYLOAD_BYTES = 160;
const WINDOW_LEAD_MS = 200;

const USAGE = `usage: node run.mjs [options] PEER...   (PEER: ${Object.keys(PEERS).join(', ')})

  --database-url URL      a database to connect to for CREATE/DROP DATABASE
                          (default postgres://postgres@127.0.0.1:5432/postgres)
  --producers N           producers, and pgbench clients for the ceiling (16)
  --ceiling-seconds S     pgbench's -T (8)
  --seconds S             the completed/s window (10)
  --latency-rate R        jobs per second offered in the latency phase, all producers (1000)
  --latency-seconds S     the latency window (10)
  --drain N               jobs in the drain's backlog (100000)
  --settle-seconds S      how long the workers may take to empty the queue between phases (300)`;

const { values: opts, positionals: peerNames } = parseArgs({
  allowPositionals: true,
  options: {
    'database-url': { type: 'string', default: 'postgres://postgres@127.0.0.1:5432/postgres' },
    producers: { type: 'string', default: '16' },
    'ceiling-seconds': { type: 'string', default: '8' },
    seconds: { type: 'string', default: '10' },
    'latency-rate': { type: 'string', default: '1000' },
    'latency-seconds': { type: 'string', default: '10' },
    drain: { type: 'string', default: '100000' },
    'settle-seconds': { type: 'string', default: '300' },
    help: { type: 'boolean', short: 'h' },
  },
});

if (opts.help || peerNames.length === 0 || peerNames.some((p) => !PEERS[p])) {
  console.error(USAGE);
  process.exit(opts.help ? 0 : 2);
}

const num = (name) => {
  const v = Number(opts[name]);
  if (!Number.isFinite(v) || v <= 0) throw new Error(`--${name} must be a positive number`);
  return v;
};
const P = {
  producers: num('producers'),
  ceilingSeconds: num('ceiling-seconds'),
  seconds: num('seconds'),
  latencyRate: num('latency-rate'),
  latencySeconds: num('latency-seconds'),
  drain: num('drain'),
  settleSeconds: num('settle-seconds'),
};

const now = () => performance.timeOrigin + performance.now();
const sleep = (ms) => new Promise((r) => setTimeout(r, Math.max(0, ms)));
const log = (msg) => console.error(`[peers] ${msg}`);

// ---------------------------------------------------------------------------------------------
// Payloads: a JSON object of about PAYLOAD_BYTES (outbox-bench's payload size) whose key k
// identifies the job for the latency phase.

const PAD = 'x'.repeat(PAYLOAD_BYTES - '{"k":1000000,"pad":""}'.length);
let nextKey = 1;
const payload = () => ({ k: nextKey++, pad: PAD });

// ---------------------------------------------------------------------------------------------
// Databases

function urlFor(base, database) {
  const u = new URL(base);
  u.pathname = `/${database}`;
  return u.toString();
}

async function withClient(url, fn) {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    return await fn(client);
  } finally {
    await client.end();
  }
}

async function vacuum(url) {
  await withClient(url, (c) => c.query('VACUUM ANALYZE'));
}

// ---------------------------------------------------------------------------------------------
// Phase 1: the ceiling, with pgbench

async function ceiling(url) {
  await withClient(url, (c) =>
    c.query(`CREATE TABLE bench_ceiling (seq bigserial PRIMARY KEY, id uuid, topic text, type text,
                                         payload bytea, enqueued_at timestamptz NOT NULL DEFAULT now())`),
  );
  const args = ['-n', '-M', 'prepared', '-c', String(P.producers), '-j', '2', '-T', String(P.ceilingSeconds),
    '-f', join(HERE, 'ceiling.sql'), '-D', `payload=${JSON.stringify({ k: 0, pad: PAD })}`, url];
  log(`pgbench ${args.slice(0, -1).join(' ')} <database>`);
  const { stdout } = await execFile('pgbench', args, { maxBuffer: 1 << 20 });
  const m = /^tps = ([\d.]+) \(without initial connection time\)/m.exec(stdout);
  if (!m) throw new Error(`no tps in pgbench's output:\n${stdout}`);
  await withClient(url, (c) => c.query('DROP TABLE bench_ceiling'));
  return Number(m[1]);
}

// ---------------------------------------------------------------------------------------------
// The worker process

class Workers {
  constructor(peer, url) {
    this.child = fork(join(HERE, 'worker.mjs'), [peer.name, url], { stdio: ['ignore', 'inherit', 'inherit', 'ipc'] });
    this.waiters = new Map();
    this.exited = new Promise((resolve) => this.child.on('exit', resolve));
    this.child.on('message', (m) => {
      const waiter = this.waiters.get(m.ev);
      if (waiter) {
        this.waiters.delete(m.ev);
        waiter.resolve(m);
      }
    });
    this.child.on('exit', (code) => {
      for (const w of this.waiters.values()) w.reject(new Error(`the worker process exited (${code})`));
      this.waiters.clear();
    });
  }

  /// Waits for the next message `ev`, after sending `msg` if given.
  next(ev, msg) {
    const p = new Promise((resolve, reject) => this.waiters.set(ev, { resolve, reject }));
    if (msg) this.child.send(msg);
    return p;
  }

  static async spawn(peer, url) {
    const w = new Workers(peer, url);
    await w.next('ready');
    return w;
  }

  async count() {
    return (await this.next('count', { cmd: 'count' })).n;
  }

  async stop() {
    await this.next('stopped', { cmd: 'stop' });
    await this.exited;
  }
}

/// Waits until the peer has no job left to do.
async function settle(peer, url, what) {
  const deadline = now() + P.settleSeconds * 1000;
  await withClient(url, async (c) => {
    for (;;) {
      const n = await peer.outstanding(c);
      if (n === 0) return;
      if (now() > deadline) throw new Error(`${n} jobs still outstanding ${P.settleSeconds} s after ${what}`);
      await sleep(200);
    }
  });
}

// ---------------------------------------------------------------------------------------------
// Producers

async function connectProducers(url, n) {
  const clients = [];
  for (let i = 0; i < n; i++) {
    const c = new pg.Client({ connectionString: url, application_name: 'peers-bench-producer' });
    await c.connect();
    clients.push(c);
  }
  return clients;
}

/// Runs the producers through one window. `rate` (jobs per second across all) paces them;
/// without it they commit as fast as they can. `commits` (a Map), when given, gets each job's
/// key → when its commit returned. `atEdges(start, end)`, when given, is called with two
/// promises that resolve at the window's opening and closing.
async function produce(producers, seconds, rate, commits, atEdges) {
  const start = now() + WINDOW_LEAD_MS;
  const end = start + seconds * 1000;
  atEdges?.(sleep(start - now()), sleep(end - now()));
  const period = rate ? (producers.length * 1000) / rate : 0;
  const one = async (enqueue, i) => {
    let inWindow = 0;
    let due = start + (period * i) / producers.length;
    while (due < end) {
      if (due > now()) await sleep(due - now());
      const data = payload();
      await enqueue(data);
      const at = now();
      if (at <= end) inWindow++;
      if (commits) commits.set(data.k, at);
      due = period ? due + period : at;
    }
    return inWindow;
  };
  const counts = await Promise.all(producers.map(one));
  return { start, end, inWindow: counts.reduce((a, b) => a + b, 0) };
}

// ---------------------------------------------------------------------------------------------
// One peer

function percentile(sorted, q) {
  if (sorted.length === 0) return NaN;
  return sorted[Math.min(sorted.length - 1, Math.ceil(q * sorted.length) - 1)];
}

/// The database of the peer being measured, dropped on an interrupt too.
let current = null;
process.on('SIGINT', () => {
  if (!current) process.exit(130);
  log(`interrupted: dropping ${current}`);
  withClient(opts['database-url'], (c) => c.query(`DROP DATABASE IF EXISTS ${current} WITH (FORCE)`)).finally(() =>
    process.exit(130),
  );
});

async function measure(peer, adminUrl) {
  const database = `peers_bench_${peer.name.replace(/\W/g, '_')}_${process.pid}`;
  current = database;
  const url = urlFor(adminUrl, database);
  await withClient(adminUrl, async (c) => {
    await c.query(`DROP DATABASE IF EXISTS ${database} WITH (FORCE)`);
    await c.query(`CREATE DATABASE ${database}`);
  });
  log(`${peer.name} ${peer.version} in database ${database}`);
  let workers = null;
  let ctx = null;
  let producers = [];
  try {
    const ceilingPerS = await ceiling(url);
    log(`ceiling ${ceilingPerS.toFixed(0)} rows/s`);

    ctx = await peer.install(url);
    await vacuum(url);
    producers = (await connectProducers(url, P.producers)).map((c) => ({ client: c, enqueue: peer.producer(c, ctx) }));
    const enqueuers = producers.map((p) => p.enqueue);
    workers = await Workers.spawn(peer, url);
    await workers.next('started', { cmd: 'start' });

    // Phase 2: completed/s: the worker process's count when the window opens and closes.
    let counts;
    const flat = await produce(enqueuers, P.seconds, null, null, (opened, closed) => {
      counts = opened.then(async () => [await workers.count(), await closed.then(() => workers.count())]);
    });
    const [countAtStart, countAtEnd] = await counts;
    const completedPerS = (countAtEnd - countAtStart) / P.seconds;
    const enqueuedPerS = flat.inWindow / P.seconds;
    log(`completed ${completedPerS.toFixed(0)}/s, enqueued ${enqueuedPerS.toFixed(0)}/s; letting the workers catch up`);
    await settle(peer, url, 'the completed/s window');
    await vacuum(url);

    // Phase 3: latency at a fixed offered rate.
    await workers.next('record', { cmd: 'record', on: true });
    const commits = new Map();
    const paced = await produce(enqueuers, P.latencySeconds, P.latencyRate, commits);
    const starts = new Map();
    const deadline = now() + 30_000;
    while (starts.size < commits.size) {
      const { samples } = await workers.next('samples', { cmd: 'samples' });
      for (let i = 0; i < samples.length; i += 2) if (commits.has(samples[i])) starts.set(samples[i], samples[i + 1]);
      if (starts.size >= commits.size) break;
      if (now() > deadline) throw new Error(`${commits.size - starts.size} jobs of the latency phase not started after 30 s`);
      await sleep(100);
    }
    await workers.next('record', { cmd: 'record', on: false });
    // A handler may start before its producer has read the commit's reply: that counts as 0.
    const latencies = [...commits].map(([k, at]) => Math.max(0, starts.get(k) - at)).sort((a, b) => a - b);
    const achieved = paced.inWindow / P.latencySeconds;
    const latency = { p50: percentile(latencies, 0.5), p99: percentile(latencies, 0.99), achieved };
    log(`latency at ${achieved.toFixed(0)}/s achieved: p50 ${latency.p50.toFixed(2)} ms, p99 ${latency.p99.toFixed(2)} ms (${latencies.length} jobs)`);
    await settle(peer, url, 'the latency window');

    // Phase 4: drain a backlog enqueued while no worker runs.
    await workers.stop();
    workers = null;
    const backlog = Array.from({ length: P.drain }, payload);
    await withClient(url, (c) => peer.enqueueMany(c, ctx, backlog));
    await withClient(url, async (c) => {
      const n = await peer.outstanding(c);
      if (n !== P.drain) throw new Error(`the drain's backlog is ${n} jobs, not ${P.drain}`);
    });
    await vacuum(url);
    workers = await Workers.spawn(peer, url);
    const countBefore = await workers.count();
    await workers.next('target', { cmd: 'target', n: countBefore + P.drain });
    const reached = workers.next('reached');
    const { t: startedAt } = await workers.next('started', { cmd: 'start' });
    const { t: doneAt } = await reached;
    const drainPerS = P.drain / ((doneAt - startedAt) / 1000);
    log(`drain of ${P.drain} in ${((doneAt - startedAt) / 1000).toFixed(2)} s`);
    await settle(peer, url, 'the drain');

    return { ceilingPerS, completedPerS, latency, drainPerS };
  } finally {
    if (workers) await workers.stop().catch((e) => log(`stopping the workers: ${e.message}`));
    for (const p of producers) await p.client.end().catch(() => {});
    if (ctx) await uninstall(ctx).catch((e) => log(`closing ${peer.name}: ${e.message}`));
    await withClient(adminUrl, (c) => c.query(`DROP DATABASE IF EXISTS ${database} WITH (FORCE)`));
    current = null;
  }
}

// ---------------------------------------------------------------------------------------------
// The table

const thousands = (n) => Math.round(n).toLocaleString('en-US');
const kilo = (n) => (n >= 1000 ? `${(n / 1000).toFixed(1)}k` : thousands(n));
const ms = (n) => (n >= 100 ? n.toFixed(0) : n.toFixed(1));

console.log(`| | ceiling | completed/s | × ceiling | latency at ${thousands(P.latencyRate)}/s offered p50 / p99 | drain ${kilo(P.drain)} |`);
console.log('|---|---|---|---|---|---|');
for (const name of peerNames) {
  const peer = PEERS[name];
  log(`settings: ${peer.settings}`);
  const r = await measure(peer, opts['database-url']);
  console.log(
    `| ${peer.name} ${peer.version} | ${kilo(r.ceilingPerS)} | ${thousands(r.completedPerS)} | ` +
      `${(r.completedPerS / r.ceilingPerS).toFixed(3)} | ${ms(r.latency.p50)} / ${ms(r.latency.p99)} ms` +
      // Producers that could not keep up with the offered rate: say what they achieved.
      `${r.latency.achieved < 0.95 * P.latencyRate ? ` (${thousands(r.latency.achieved)}/s achieved)` : ''} | ${kilo(r.drainPerS)}/s |`,
  );
}
