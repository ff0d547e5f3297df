//! A test hook that holds a step in flight, so that a test can kill the service there.
//!
//! With `CHECKOUT_TEST_PAUSE_DIR=<dir>` and `CHECKOUT_TEST_PAUSE=<step>` set, the step of that
//! name (`place`: the transaction of a new order; `handle`: the transaction of a saga message
//! that changes something), once it has written everything and before it commits, creates the
//! file `<dir>/<step>.<order id>` and waits until `<dir>/<step>.<order id>.go` exists. With
//! `CHECKOUT_TEST_PAUSE_AT=after-commit` it waits just after the commit instead, before the
//! delivery's ack goes back over the stream (or before the HTTP answer). The end-to-end test
//! waits for the file and SIGKILLs the process. Off unless both of the first two variables are
//! set; the other two services read the same variables (ADR 0038).
use std::path::PathBuf;
use std::time::Duration;

use uuid::Uuid;

#[derive(Debug, Clone)]
pub struct Pause {
    dir: PathBuf,
    step: String,
    after_commit: bool,
}

impl Pause {
    pub fn from_env() -> Option<Self> {
        let dir = std::env::var_os("CHECKOUT_TEST_PAUSE_DIR")?;
        let step = std::env::var("CHECKOUT_TEST_PAUSE").ok().filter(|s| !s.is_empty())?;
        let after_commit = std::env::var("CHECKOUT_TEST_PAUSE_AT").is_ok_and(|v| v == "after-commit");
        Some(Self { dir: dir.into(), step, after_commit })
    }

    pub fn step(&self) -> &str {
        &self.step
    }

    pub fn phase(&self) -> &'static str {
        if self.after_commit { "after-commit" } else { "before-commit" }
    }

    /// Waits at `step` for `order_id` if this is the step to pause at, before its commit.
    pub async fn before_commit(this: Option<&Self>, step: &str, order_id: Uuid) -> std::io::Result<()> {
        Self::wait(this.filter(|p| !p.after_commit), step, order_id).await
    }

    /// Waits at `step` for `order_id` if this is the step to pause at, after its commit.
    pub async fn after_commit(this: Option<&Self>, step: &str, order_id: Uuid) -> std::io::Result<()> {
        Self::wait(this.filter(|p| p.after_commit), step, order_id).await
    }

    async fn wait(this: Option<&Self>, step: &str, order_id: Uuid) -> std::io::Result<()> {
        let Some(p) = this.filter(|p| p.step == step) else { return Ok(()) };
        let marker = p.dir.join(format!("{step}.{order_id}"));
        let go = p.dir.join(format!("{step}.{order_id}.go"));
        tokio::fs::write(&marker, b"").await?;
        tracing::warn!(step, phase = p.phase(), %order_id, "test pause: holding the step in flight until {} exists", go.display());
        while !tokio::fs::try_exists(&go).await? {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(())
    }
}
