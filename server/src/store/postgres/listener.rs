//! Work announced by other processes: listens on `outbox_work_KEY`, where every relay announces
//! the consumers it just fanned out to, and on `outbox_enqueued_KEY`, where producers'
//! statements wake a relay that backed off (ADR 0051), and passes each on as a [`WorkHint`].
//! KEY is the database's channel key, which only outboxd's roles can read, so a login that may
//! merely connect cannot send them (migration 0028). Notifications are
//! hints: one lost while the connection was down is covered by a [`WorkHint::All`] and a
//! [`WorkHint::Enqueued`] after a reconnect, and by the streams' and the relay's fallback polls.
use std::time::Duration;

use sqlx::postgres::PgListener;
use tokio_util::sync::CancellationToken;

use super::{Channels, ENQUEUED_CHANNEL, PgStore, WORK_CHANNEL, q};
use crate::store::{HintSender, WorkHint};

#[derive(Debug, Clone)]
pub struct WorkListener {
    store: PgStore,
    hints: HintSender,
}

impl WorkListener {
    pub fn new(store: PgStore, hints: HintSender) -> Self {
        Self { store, hints }
    }

    fn dispatch(&self, channels: &Channels, channel: &str, payload: &str) {
        if channel == channels.enqueued {
            self.hint(WorkHint::Enqueued);
        } else if payload.is_empty() {
            self.hint(WorkHint::All);
        } else {
            self.hint(WorkHint::Consumers(payload.split(',').map(str::to_owned).collect()));
        }
    }

    fn hint(&self, hint: WorkHint) {
        // The receiver is gone only at shutdown.
        let _ = self.hints.send(hint);
    }

    pub async fn run(self, cancel: CancellationToken) {
        let mut backoff = Duration::from_millis(100);
        loop {
            let (mut listener, channels) = tokio::select! {
                _ = cancel.cancelled() => return,
                l = self.store.work_listener() => match l {
                    Ok(l) => l,
                    Err(e) => {
                        tracing::warn!(error = %e, retry_in = ?backoff, "cannot listen for relay notifications");
                        tokio::select! {
                            _ = cancel.cancelled() => return,
                            _ = tokio::time::sleep(backoff) => {}
                        }
                        backoff = (backoff * 2).min(Duration::from_secs(10));
                        continue;
                    }
                },
            };
            backoff = Duration::from_millis(100);
            // Anything announced while we were not listening: wake everyone once.
            self.hint(WorkHint::All);
            self.hint(WorkHint::Enqueued);
            loop {
                let next = tokio::select! {
                    _ = cancel.cancelled() => return,
                    n = listener.try_recv() => n,
                };
                match next {
                    Ok(Some(n)) => self.dispatch(&channels, n.channel(), n.payload()),
                    // The connection dropped; the next try_recv reconnects.
                    Ok(None) => {
                        self.hint(WorkHint::All);
                        self.hint(WorkHint::Enqueued);
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "relay notification listener failed; reconnecting");
                        break;
                    }
                }
            }
        }
    }
}

impl PgStore {
    /// This database's notification channels: [`WORK_CHANNEL`] with its channel key and
    /// [`ENQUEUED_CHANNEL`] with its wake key.
    pub async fn channels(&self) -> crate::store::Result<Channels> {
        let (work, wake): (String, String) = sqlx::query_as(q::SETTINGS_CHANNEL_KEYS).fetch_one(&self.pool).await?;
        Ok(Channels { work: format!("{WORK_CHANNEL}{work}"), enqueued: format!("{ENQUEUED_CHANNEL}{wake}") })
    }

    /// A listener on this database's channels, on its own connection, and their names.
    pub async fn work_listener(&self) -> crate::store::Result<(PgListener, Channels)> {
        let channels = self.channels().await?;
        let mut listener = PgListener::connect_with(&self.pool).await?;
        listener.listen_all([channels.work.as_str(), channels.enqueued.as_str()]).await?;
        Ok((listener, channels))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::store::Store as _;
    use crate::store::postgres::WORK_CHANNEL;
    use crate::testing::TestDb;

    async fn next(rx: &mut tokio::sync::mpsc::UnboundedReceiver<WorkHint>) -> WorkHint {
        tokio::time::timeout(Duration::from_secs(10), rx.recv()).await.unwrap().unwrap()
    }

    /// Any login may NOTIFY any channel it can name. A producer's login cannot read the channel
    /// key (migration 0028), so what it sends on the names it can know or guess (the fixed
    /// names of releases before, a made-up key) wakes nothing, while a relay's announcement
    /// still arrives. Notifications arrive in commit order: a spoof that was heard would come
    /// before the announcement that follows it.
    #[tokio::test]
    async fn a_login_that_cannot_read_the_channel_key_cannot_wake_outboxd() {
        let db = TestDb::create().await.unwrap();
        let pg = PgStore::connect(&db.url, 4).await.unwrap();
        pg.migrate().await.unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let cancel = CancellationToken::new();
        let task = tokio::spawn(WorkListener::new(pg.clone(), tx).run(cancel.clone()));
        // A (re)connect wakes everyone once.
        assert_eq!(next(&mut rx).await, WorkHint::All);
        assert_eq!(next(&mut rx).await, WorkHint::Enqueued);

        let stranger = format!("outbox_test_stranger_{}", uuid::Uuid::new_v4().simple());
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "CREATE ROLE {stranger} NOLOGIN; GRANT outbox_producer TO {stranger};"
        )))
        .execute(pg.pool())
        .await
        .unwrap();
        let mut conn = pg.pool().acquire().await.unwrap();
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("SET ROLE {stranger}"))).execute(&mut *conn).await.unwrap();
        let refused = sqlx::query_scalar::<_, String>("SELECT channel_key FROM outbox.settings")
            .fetch_one(&mut *conn)
            .await
            .unwrap_err();
        let code = refused.as_database_error().and_then(|e| e.code()).map(|c| c.into_owned());
        assert_eq!(code.as_deref(), Some("42501"), "a producer's login may not read the key: {refused}");
        for channel in
            ["outbox_work", "outbox_enqueued", "outbox_work_", "outbox_enqueued_0123456789abcdef0123456789abcdef"]
        {
            sqlx::query("SELECT pg_notify($1, '')").bind(channel).execute(&mut *conn).await.unwrap();
        }
        sqlx::raw_sql("RESET ROLE").execute(&mut *conn).await.unwrap();
        drop(conn);

        sqlx::query(super::super::q::RELAY_NOTIFY).bind("marker").execute(pg.pool()).await.unwrap();
        assert_eq!(next(&mut rx).await, WorkHint::Consumers(vec!["marker".to_owned()]), "no spoof was heard first");
        let channels = pg.channels().await.unwrap();
        sqlx::query("SELECT pg_notify($1, '')").bind(&channels.enqueued).execute(pg.pool()).await.unwrap();
        assert_eq!(next(&mut rx).await, WorkHint::Enqueued, "the real channel is heard");
        // A producer's own insert sends on the wake-up channel, in the producer's session: that
        // channel's key is not the work channel's, and the trigger function does not let the
        // session trace the name (`trace_notify`).
        assert_ne!(
            channels.work.trim_start_matches(WORK_CHANNEL),
            channels.enqueued.trim_start_matches(super::super::ENQUEUED_CHANNEL)
        );
        let config: Vec<String> =
            sqlx::query_scalar("SELECT unnest(proconfig) FROM pg_proc WHERE oid = 'outbox.wake_relay'::regproc")
                .fetch_all(pg.pool())
                .await
                .unwrap();
        assert!(config.iter().any(|c| c == "trace_notify=off"), "{config:?}");

        cancel.cancel();
        task.await.unwrap();
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP OWNED BY {stranger}; DROP ROLE {stranger};")))
            .execute(pg.pool())
            .await
            .unwrap();
    }
}
