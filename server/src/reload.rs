//! Re-reading configuration files: every interval, and at once on SIGHUP. Used by the TLS
//! certificates and the auth file, which each keep what they had when a new read fails.
use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// Runs `reload` every `interval` (the first time one interval after the start: the files were
/// read then) and on each SIGHUP, off the runtime's worker threads, until `cancel`.
pub async fn every_interval_and_sighup<F>(interval: Duration, cancel: CancellationToken, reload: F)
where
    F: Fn() + Clone + Send + 'static,
{
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .inspect_err(|e| tracing::warn!(error = %e, "cannot listen for SIGHUP"))
        .ok();
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick() => {}
            _ = next_signal(&mut hup) => {}
        }
        let reload = reload.clone();
        let _ = tokio::task::spawn_blocking(reload).await;
    }
}

/// The next signal; never, without a listener.
async fn next_signal(s: &mut Option<tokio::signal::unix::Signal>) {
    match s {
        Some(s) => {
            if s.recv().await.is_none() {
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending().await,
    }
}
