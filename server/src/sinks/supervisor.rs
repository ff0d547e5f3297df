//! Keeps one [`SinkRunner`] per sink consumer running in this process.
//!
//! Every replica runs every sink: their sessions compete for the consumer's deliveries like
//! streams of one consumer on several replicas do, so sink work is split between replicas and
//! an ordering key still goes one message at a time. The supervisor looks at the consumers
//! when this process changed one, and otherwise every `interval` (a sink created on another
//! replica starts here within that).
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::runner::SinkRunner;
use crate::delivery::session::SessionContext;
use crate::domain::Sink;
use crate::store::StoreError;

struct Running {
    sink: Sink,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

pub struct SinkSupervisor {
    ctx: SessionContext,
    interval: Duration,
    destinations: super::destination::Destinations,
    running: HashMap<String, Running>,
}

impl SinkSupervisor {
    pub fn new(ctx: SessionContext, interval: Duration, destinations: super::destination::Destinations) -> Self {
        Self { ctx, interval, destinations, running: HashMap::new() }
    }

    /// Starts a runner for each sink consumer without one, restarts one whose sink changed
    /// (deleted and created again), and stops those whose consumer is gone.
    pub async fn run_once(&mut self) -> Result<(), StoreError> {
        let consumers = self.ctx.store.consumer_list().await?;
        let mut wanted = HashMap::new();
        for c in consumers {
            if let Some(sink) = c.spec.sink.clone() {
                wanted.insert(c.spec.name.to_string(), (sink, c));
            }
        }
        let gone: Vec<String> = self
            .running
            .iter()
            .filter(|(name, r)| r.task.is_finished() || wanted.get(*name).is_none_or(|(sink, _)| *sink != r.sink))
            .map(|(name, _)| name.clone())
            .collect();
        for name in gone {
            if let Some(r) = self.running.remove(&name) {
                r.stop.cancel();
                let _ = r.task.await;
            }
        }
        for (name, (sink, consumer)) in wanted {
            if self.running.contains_key(&name) {
                continue;
            }
            let target: Arc<dyn super::Target> = super::connect(&sink.target, self.destinations.clone()).into();
            let stop = CancellationToken::new();
            let runner = SinkRunner::new(self.ctx.clone(), consumer, target);
            let task = tokio::spawn(runner.run(stop.clone()));
            self.running.insert(name, Running { sink, stop, task });
        }
        Ok(())
    }

    /// Runs until `cancel`; then stops every runner (each one drains like a stream does).
    pub async fn run(mut self, cancel: CancellationToken) {
        let mut changed = self.ctx.hub.consumers_changed().subscribe();
        loop {
            if let Err(e) = self.run_once().await {
                tracing::warn!(error = %e, "sink supervisor could not list consumers");
            }
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = changed.changed() => {}
                _ = tokio::time::sleep(self.interval) => {}
            }
        }
        for (_, r) in self.running.drain() {
            r.stop.cancel();
            let _ = r.task.await;
        }
    }
}
