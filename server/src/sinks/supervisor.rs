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

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::runner::SinkRunner;
use crate::delivery::session::SessionContext;
use crate::domain::{Consumer, ConsumerSpec, Sink};
use crate::store::StoreError;

/// Whether a sink may run on its creator's authority: the edge answers from the auth file in
/// force, and says when that may have changed. A sink whose creator is gone from the file, or
/// no longer holds `sink:NAME` and `tail:` on each of its topics, stops, and starts again if
/// the permission comes back.
pub trait SinkOwners: Send + Sync {
    /// `Err(why)` when the sink of `spec`, created by principal `owner`, may not run.
    fn may_run(&self, owner: &str, spec: &ConsumerSpec) -> Result<(), String>;
    /// Changes whenever the answer may have (the auth file was reloaded).
    fn changed(&self) -> watch::Receiver<u64>;
}

/// `Err(why)` when `owners` says the sink consumer `c` may not run now (sinks without a
/// recorded creator run: created without an auth file, or before creators were recorded).
pub fn refused(owners: Option<&dyn SinkOwners>, c: &Consumer) -> Option<String> {
    let owner = c.spec.sink.as_ref()?.created_by.as_deref()?;
    owners?.may_run(owner, &c.spec).err()
}

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
    owners: Option<Arc<dyn SinkOwners>>,
    key: Option<Arc<super::sealed::SinkKey>>,
    /// Sinks stopped because their creator may no longer run them, with why (logged once).
    suspended: HashMap<String, String>,
}

impl SinkSupervisor {
    pub fn new(ctx: SessionContext, interval: Duration, destinations: super::destination::Destinations) -> Self {
        Self {
            ctx,
            interval,
            destinations,
            running: HashMap::new(),
            owners: None,
            key: None,
            suspended: HashMap::new(),
        }
    }

    /// Opens sealed sinks with `key` (`--sink-key-file`).
    pub fn with_key(mut self, key: Option<Arc<super::sealed::SinkKey>>) -> Self {
        self.key = key;
        self
    }

    /// Runs a sink only while its creator may (see [`SinkOwners`]).
    pub fn with_owners(mut self, owners: Arc<dyn SinkOwners>) -> Self {
        self.owners = Some(owners);
        self
    }

    /// Starts a runner for each sink consumer without one, restarts one whose sink changed
    /// (deleted and created again), and stops those whose consumer is gone.
    pub async fn run_once(&mut self) -> Result<(), StoreError> {
        let consumers = self.ctx.store.consumer_list().await?;
        let mut wanted = HashMap::new();
        let mut suspended = HashMap::new();
        for c in consumers {
            let Some(sink) = c.spec.sink.clone() else { continue };
            let name = c.spec.name.to_string();
            let opened = super::sealed::open(self.key.as_deref(), &sink).map_err(|e| e.to_string());
            if let Some(why) = refused(self.owners.as_deref(), &c).or_else(|| opened.as_ref().err().cloned()) {
                if self.suspended.get(&name) != Some(&why) {
                    tracing::warn!(consumer = %name, reason = %why, "sink stopped: it may not run");
                }
                suspended.insert(name, why);
                continue;
            }
            if self.suspended.contains_key(&name) {
                tracing::info!(consumer = %name, "sink runs again: its creator may run it");
            }
            // Compared as stored (sealed), connected as opened.
            let Ok(opened) = opened else { continue };
            let mut c = c;
            c.spec.sink = Some(opened.clone());
            wanted.insert(name, (sink, opened, c));
        }
        for name in self.suspended.keys().filter(|n| !suspended.contains_key(*n)) {
            metrics::gauge!(crate::metrics::SINK_SUSPENDED, "consumer" => name.clone()).set(0.0);
            crate::metrics::sink_state(name, None);
        }
        for name in suspended.keys() {
            metrics::gauge!(crate::metrics::SINK_SUSPENDED, "consumer" => name.clone()).set(1.0);
            crate::metrics::sink_state(name, Some(crate::metrics::SinkState::Suspended));
        }
        self.suspended = suspended;
        let gone: Vec<String> = self
            .running
            .iter()
            .filter(|(name, r)| r.task.is_finished() || wanted.get(*name).is_none_or(|(sink, _, _)| *sink != r.sink))
            .map(|(name, _)| name.clone())
            .collect();
        for name in gone {
            if let Some(r) = self.running.remove(&name) {
                r.stop.cancel();
                let _ = r.task.await;
            }
            if !self.suspended.contains_key(&name) {
                crate::metrics::sink_state(&name, None);
            }
        }
        for (name, (sink, opened, consumer)) in wanted {
            if self.running.contains_key(&name) {
                continue;
            }
            let target: Arc<dyn super::Target> = super::connect(&opened.target, self.destinations.clone()).into();
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
        // Without owners to ask, a sender kept here so that the receiver never ends.
        let (_unchanging, never) = watch::channel(0u64);
        let mut owners_changed = self.owners.as_ref().map_or(never, |o| o.changed());
        loop {
            if let Err(e) = self.run_once().await {
                tracing::warn!(error = %e, "sink supervisor could not list consumers");
            }
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = changed.changed() => {}
                _ = owners_changed.changed() => {}
                _ = tokio::time::sleep(self.interval) => {}
            }
        }
        for (_, r) in self.running.drain() {
            r.stop.cancel();
            let _ = r.task.await;
        }
    }
}
