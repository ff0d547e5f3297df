// The peer's workers, in a process of their own as they would be deployed, driven by run.mjs
// over the IPC channel of child_process.fork. Handlers do nothing but note when they ran.
//
// Commands: start (the workers begin; answers `started` with the time just before), count
// (jobs whose handler has returned so far), record (on/off: keep each job's key and handler
// start time), samples (hands over and forgets what was kept), target (answers `reached` once
// the count is at least n), stop (stops the workers gracefully and exits).
import { performance } from 'node:perf_hooks';

import { PEERS } from './peers.mjs';

const [peerName, url] = process.argv.slice(2);
const peer = PEERS[peerName];
if (!peer) throw new Error(`unknown peer ${peerName}`);

/// Wall-clock milliseconds with sub-millisecond resolution, comparable across processes.
const now = () => performance.timeOrigin + performance.now();

let done = 0;
let target = Infinity;
let recording = false;
let samples = [];

function onJobs(keys) {
  const t = now();
  if (recording) for (const k of keys) samples.push(k, t);
  done += keys.length;
  if (done >= target) {
    target = Infinity;
    process.send({ ev: 'reached', n: done, t });
  }
}

const workers = await peer.prepare(url, onJobs);

process.on('message', async (m) => {
  try {
    switch (m.cmd) {
      case 'start': {
        const t = now();
        await workers.start();
        process.send({ ev: 'started', t });
        break;
      }
      case 'count':
        process.send({ ev: 'count', n: done, t: now() });
        break;
      case 'record':
        recording = m.on;
        process.send({ ev: 'record' });
        break;
      case 'samples':
        process.send({ ev: 'samples', samples });
        samples = [];
        break;
      case 'target':
        target = m.n;
        process.send({ ev: 'target' });
        if (done >= target) onJobs([]);
        break;
      case 'stop':
        await workers.stop();
        process.send({ ev: 'stopped' }, () => process.exit(0));
        break;
      default:
        throw new Error(`unknown command ${m.cmd}`);
    }
  } catch (e) {
    console.error(`worker: ${e.stack ?? e}`);
    process.exit(1);
  }
});

process.send({ ev: 'ready' });
