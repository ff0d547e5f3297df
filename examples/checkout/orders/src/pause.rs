//! A test hook that holds a step in flight, so that a test can kill the service there.
//!
//! With `CHECKOUT_TEST_PAUSE_DIR=<dir>` and `CHECKOUT_TEST_PAUSE=<step>` set, the step of that
//! name (`place`: the transaction of a new order; `handle`: the transaction of a saga
//! message), once it has written everything and before it commits, creates the file
//! `<dir>/<step>.<order id>` and waits until `<dir>/<step>.<order id>.go` exists. The end-to-end
//! test waits for the first file and SIGKILLs the process: the step is then truly in flight,
//! its effect and its outgoing message written in a transaction that never commits. Off unless
//! both variables are set; the other two services read the same variables (ADR 0038).
use std::path::PathBuf;
use std::time::Duration;

use uuid::Uuid;

#[derive(Debug, Clone)]
pub struct Pause {
    dir: PathBuf,
    step: String,
}

impl Pause {
    pub fn from_env() -> Option<Self> {
        let dir = std::env::var_os("CHECKOUT_TEST_PAUSE_DIR")?;
        let step = std::env::var("CHECKOUT_TEST_PAUSE").ok().filter(|s| !s.is_empty())?;
        Some(Self { dir: dir.into(), step })
    }

    pub fn step(&self) -> &str {
        &self.step
    }

    /// Waits at `step` for `order_id` if this is the step to pause at.
    pub async fn at(this: Option<&Self>, step: &str, order_id: Uuid) -> std::io::Result<()> {
        let Some(p) = this.filter(|p| p.step == step) else { return Ok(()) };
        let marker = p.dir.join(format!("{step}.{order_id}"));
        let go = p.dir.join(format!("{step}.{order_id}.go"));
        tokio::fs::write(&marker, b"").await?;
        tracing::warn!(step, %order_id, "test pause: holding the step in flight until {} exists", go.display());
        while !tokio::fs::try_exists(&go).await? {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(())
    }
}
