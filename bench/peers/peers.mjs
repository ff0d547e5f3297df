// The peers the harness measures: how each one's schema is installed, how a producer enqueues
// one job on its own connection, how a backlog is enqueued in bulk, how many jobs are still to
// do, and how its workers run. Worker settings are the ones each project documents for
// throughput; README.md lists them.
import { createRequire } from 'node:module';

import { Logger, makeWorkerUtils, run } from 'graphile-worker';
import PgBoss from 'pg-boss';

const require = createRequire(import.meta.url);
const QUEUE = 'bench';
const BULK_CHUNK = 5000;

const version = (pkg) => require(`${pkg}/package.json`).version;

// graphile-worker logs every start and stop at info; keep warnings and errors only.
const quietLogger = new Logger(() => (level, message) => {
  if (level === 'error' || level === 'warning') console.error(`graphile-worker ${level}: ${message}`);
});

/// The settings of graphile-worker's performance page (worker.graphile.org/docs/performance).
const GRAPHILE_WORKER = {
  concurrentJobs: 24,
  maxPoolSize: 25,
  localQueue: { size: 500 },
  completeJobBatchDelay: 0,
  failJobBatchDelay: 0,
};

/// pg-boss 10: each work() call is one polling worker; 0.5 s is the shortest interval it allows
/// (the default is 2 s and one job a fetch).
const PG_BOSS_WORKERS = 16;
const PG_BOSS_WORK = { pollingIntervalSeconds: 0.5, batchSize: 1000 };

const graphileWorker = {
  name: 'graphile-worker',
  version: version('graphile-worker'),
  settings: `one run(): concurrentJobs ${GRAPHILE_WORKER.concurrentJobs}, maxPoolSize ${GRAPHILE_WORKER.maxPoolSize}, localQueue ${GRAPHILE_WORKER.localQueue.size}, completeJobBatchDelay 0; producers call graphile_worker.add_job`,

  /// Installs the schema; returns what producers need (nothing here: add_job is SQL).
  async install(url) {
    const utils = await makeWorkerUtils({ connectionString: url, logger: quietLogger });
    try {
      await utils.migrate();
    } finally {
      await utils.release();
    }
    return {};
  },

  /// One job, one autocommit statement on the producer's connection.
  producer(client) {
    return (data) =>
      client.query({
        name: 'add_job',
        text: "SELECT graphile_worker.add_job('bench', $1::json)",
        values: [JSON.stringify(data)],
      });
  },

  async enqueueMany(client, _ctx, payloads) {
    for (let i = 0; i < payloads.length; i += BULK_CHUNK) {
      const chunk = payloads.slice(i, i + BULK_CHUNK);
      await client.query(
        `SELECT count(*) FROM graphile_worker.add_jobs(array(
           SELECT ROW('bench', p, NULL, NULL, NULL, NULL, NULL, NULL)::graphile_worker.job_spec
             FROM json_array_elements($1::json) AS p))`,
        [JSON.stringify(chunk)],
      );
    }
  },

  /// Jobs not yet completed (graphile-worker deletes a job when it completes).
  async outstanding(client) {
    const { rows } = await client.query('SELECT count(*)::int AS n FROM graphile_worker.jobs');
    return rows[0].n;
  },

  /// Connects nothing yet; start() runs the workers, calling onJobs(keys) as handlers run.
  async prepare(url, onJobs) {
    let runner = null;
    return {
      async start() {
        runner = await run({
          connectionString: url,
          noHandleSignals: true,
          logger: quietLogger,
          taskList: {
            [QUEUE]: async (payload) => {
              onJobs([payload.k]);
            },
          },
          preset: { worker: GRAPHILE_WORKER },
        });
      },
      async stop() {
        if (runner) await runner.stop();
      },
    };
  },
};

const pgBoss = {
  name: 'pg-boss',
  version: version('pg-boss'),
  settings: `${PG_BOSS_WORKERS} work() workers, pollingIntervalSeconds ${PG_BOSS_WORK.pollingIntervalSeconds}, batchSize ${PG_BOSS_WORK.batchSize}; producers call send() on their own connection`,

  async install(url) {
    const boss = new PgBoss({ connectionString: url });
    boss.on('error', (e) => console.error(`pg-boss error: ${e.message}`));
    await boss.start();
    await boss.createQueue(QUEUE);
    return { boss };
  },

  producer(client, { boss }) {
    const db = { executeSql: (text, values) => client.query({ name: 'send', text, values }) };
    return (data) => boss.send(QUEUE, data, { db });
  },

  async enqueueMany(client, { boss }, payloads) {
    const db = { executeSql: (text, values) => client.query(text, values) };
    for (let i = 0; i < payloads.length; i += BULK_CHUNK) {
      const chunk = payloads.slice(i, i + BULK_CHUNK).map((data) => ({ name: QUEUE, data }));
      await boss.insert(chunk, { db });
    }
  },

  async outstanding(client) {
    const { rows } = await client.query(
      "SELECT count(*)::int AS n FROM pgboss.job WHERE name = $1 AND state < 'completed'",
      [QUEUE],
    );
    return rows[0].n;
  },

  /// boss.start() connects and migrates; start() adds the polling workers.
  async prepare(url, onJobs) {
    const boss = new PgBoss({ connectionString: url });
    boss.on('error', (e) => console.error(`pg-boss error: ${e.message}`));
    await boss.start();
    return {
      async start() {
        for (let i = 0; i < PG_BOSS_WORKERS; i++) {
          await boss.work(QUEUE, PG_BOSS_WORK, async (jobs) => {
            onJobs(jobs.map((job) => job.data.k));
          });
        }
      },
      async stop() {
        await boss.stop({ graceful: true, wait: true });
      },
    };
  },
};

export const PEERS = { [graphileWorker.name]: graphileWorker, [pgBoss.name]: pgBoss };

/// Closes what install() opened.
export async function uninstall(ctx) {
  if (ctx.boss) await ctx.boss.stop({ graceful: false, wait: true });
}
