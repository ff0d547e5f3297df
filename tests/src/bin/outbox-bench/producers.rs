//! Producers: what they commit, paced or flat out, and what was committed when.
use std::sync::Arc;
use std::time::Duration;

use crate::{EVENT_TYPE, WINDOW_LEAD};
use anyhow::{Context as _, Result};
use sqlx::pool::PoolConnection;
use sqlx::postgres::PgPool;
use sqlx::{PgConnection, Postgres};
use tokio::task::JoinSet;
use tokio::time::Instant;
use uuid::Uuid;

/// What one producer commits per transaction.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Work {
    /// One row into the plain table `bench_ceiling`, autocommit: the database's own ceiling.
    PlainInsert,
    /// One message through `outbox_client::enqueue`, autocommit: one message per committed
    /// transaction, the same shape as the ceiling. (Inside an explicit BEGIN … COMMIT both the
    /// ceiling and the enqueue pay two more round trips per commit, about half the rate.)
    Enqueue { topic: &'static str },
    /// `SELECT outbox.enqueue(...)`, autocommit: what a producer in any language calls.
    SqlFunction { topic: &'static str },
    /// A plain `INSERT INTO outbox.messages`, autocommit: the table's own cost, the yardstick
    /// for the SQL function.
    OutboxInsert { topic: &'static str },
}

impl Work {
    pub(crate) async fn commit_one(self, conn: &mut PgConnection, id: Uuid, payload: &[u8]) -> Result<()> {
        match self {
            Work::PlainInsert => {
                sqlx::query(
                    "INSERT INTO bench_ceiling (id, topic, type, payload, headers)
                     VALUES ($1, 'bench.ceiling', $2, $3, '{}')",
                )
                .bind(id)
                .bind(EVENT_TYPE)
                .bind(payload)
                .execute(conn)
                .await?;
            }
            Work::Enqueue { topic } => {
                let msg = outbox_client::Message::new(topic, EVENT_TYPE, payload).message_id(id);
                outbox_client::enqueue(&mut *conn, &msg).await?;
            }
            Work::SqlFunction { topic } => {
                sqlx::query("SELECT outbox.enqueue($1, $2, $3, '{}', $4)")
                    .bind(topic)
                    .bind(EVENT_TYPE)
                    .bind(payload)
                    .bind(id)
                    .execute(conn)
                    .await?;
            }
            Work::OutboxInsert { topic } => {
                sqlx::query("INSERT INTO outbox.messages (message_id, topic, type, payload) VALUES ($1, $2, $3, $4)")
                    .bind(id)
                    .bind(topic)
                    .bind(EVENT_TYPE)
                    .bind(payload)
                    .execute(conn)
                    .await?;
            }
        }
        Ok(())
    }
}

/// A timed window. Producers have their connections in hand before it opens.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Window {
    pub(crate) start: Instant,
    pub(crate) end: Instant,
}

/// Open-loop pacing: producer `i` of `n` commits at `start + (i/n + k) * period`, however long
/// the previous commit took (a late producer catches up at once), so the offered rate holds
/// whatever the latency.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pace {
    pub(crate) period: Duration,
    pub(crate) offset: Duration,
}

#[derive(Debug, Default)]
pub(crate) struct Produced {
    /// Commits that returned inside the window.
    pub(crate) in_window: u64,
    /// Every commit, including the last ones that returned after the window closed.
    pub(crate) total: u64,
    /// When each message's commit returned, when asked for.
    pub(crate) commits: Vec<(Uuid, Instant)>,
}

impl Produced {
    pub(crate) fn merge(&mut self, other: Produced) {
        self.in_window += other.in_window;
        self.total += other.total;
        self.commits.extend(other.commits);
    }
}

pub(crate) async fn producer(
    mut conn: PoolConnection<Postgres>,
    work: Work,
    window: Window,
    pace: Option<Pace>,
    record: bool,
    payload: Arc<[u8]>,
) -> Result<Produced> {
    let mut out = Produced::default();
    let mut due = window.start + pace.map_or(Duration::ZERO, |p| p.offset);
    while due < window.end {
        if due > Instant::now() {
            tokio::time::sleep_until(due).await;
        }
        let id = Uuid::now_v7();
        work.commit_one(&mut conn, id, &payload).await?;
        let at = Instant::now();
        out.total += 1;
        if at <= window.end {
            out.in_window += 1;
        }
        if record {
            out.commits.push((id, at));
        }
        due = match pace {
            Some(p) => due + p.period,
            None => at,
        };
    }
    Ok(out)
}

/// Producers running through one window, each on its own connection.
pub(crate) struct Producers {
    pub(crate) window: Window,
    pub(crate) tasks: JoinSet<Result<Produced>>,
}

impl Producers {
    /// Takes one connection per producer, then starts them all together. `rate` (messages per
    /// second across all producers) paces them; `None` runs them flat out.
    pub(crate) async fn start(
        pool: &PgPool,
        n: u32,
        work: Work,
        len: Duration,
        rate: Option<f64>,
        record: bool,
        payload: &Arc<[u8]>,
    ) -> Result<Self> {
        let mut conns = Vec::with_capacity(n as usize);
        for _ in 0..n {
            conns.push(pool.acquire().await.context("a producer connection")?);
        }
        let start = Instant::now() + WINDOW_LEAD;
        let window = Window { start, end: start + len };
        let period = rate.map(|r| Duration::from_secs_f64(f64::from(n) / r.max(1.0)));
        let mut tasks = JoinSet::new();
        for (i, conn) in (0..n).zip(conns) {
            let pace = period.map(|period| Pace { period, offset: period * i / n });
            tasks.spawn(producer(conn, work, window, pace, record, payload.clone()));
        }
        Ok(Self { window, tasks })
    }

    pub(crate) async fn finish(mut self) -> Result<Produced> {
        let mut all = Produced::default();
        let late = self.window.end + Duration::from_secs(30);
        while let Some(joined) = tokio::time::timeout_at(late, self.tasks.join_next())
            .await
            .context("producers still running 30 s after their window closed")?
        {
            all.merge(joined.context("a producer panicked")??);
        }
        Ok(all)
    }
}
