//! An operator's work on each store: a group of dead letters replayed, deliveries listed, one
//! message replayed, a held key skipped, messages searched.
use anyhow::{Context as _, Result, ensure};
use outbox_client::Message;
use outbox_proto::v1 as pb;
use outbox_tests::{Backend, RawStream, consumer, create_consumer, eventually};

use crate::{WAIT, conformance, setup, stats};

use super::{Session, client, console_url, csrf, location, set_cookie};

conformance!(
    an_operator_replays_a_group_of_dead_letters_from_the_console,
    an_operators_day_lists_deliveries_replays_one_message_skips_a_held_key_and_searches_patterns,
);

/// Without an auth file (loopback): a first visit gets a session cookie for its CSRF token;
/// then the dead letters of a consumer, grouped by last error, are dry-run, replayed at a
/// pace with progress, and delivered again, each with a fresh count.
async fn an_operator_replays_a_group_of_dead_letters_from_the_console(backend: Backend) -> Result<()> {
    let (_store, srv, db) = setup(backend, &["--console-listen", "127.0.0.1:0"]).await?;
    let base = console_url(&srv)?;
    let mut admin = srv.admin().await?;
    let mut c = consumer("shipping", &["orders.*"]);
    c.max_deliveries = 1;
    create_consumer(&mut admin, c).await?;
    let mut ids = Vec::new();
    for i in 0..3 {
        ids.push(
            db.sql_enqueue("orders.created", "OrderCreated", format!("{{\"id\":{i}}}").as_bytes()).await?.to_string(),
        );
    }
    let mut s = RawStream::open(&srv.endpoint, "shipping", 10).await?;
    for d in s.take(3, WAIT).await? {
        let error = if d.message_id == ids[2] { "address unknown" } else { "carrier down" };
        s.nack(&d.message_id, error).await;
    }
    eventually("dead", WAIT, || async { Ok((stats(&srv, "shipping").await?.dead == 3).then_some(())) }).await?;

    let http = client()?;
    // Without authentication, only requests addressed to this machine: a web page that
    // rebinds its own name to 127.0.0.1 is refused.
    let port = base.rsplit(':').next().context("a port")?;
    let r = http.get(format!("{base}/")).header("host", format!("rebind.attacker.example:{port}")).send().await?;
    assert_eq!(r.status(), 421, "DNS rebinding");
    let r = http.get(format!("{base}/")).header("host", format!("localhost:{port}")).send().await?;
    assert_eq!(r.status(), 303, "localhost is this machine");
    let r = http.get(format!("{base}/")).send().await?;
    assert_eq!(r.status(), 303, "a first visit gets its session");
    let cookie = set_cookie(&r).context("a session cookie")?;
    assert!(cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"), "{cookie}");
    let session = Session { http, base: base.clone(), cookie: cookie.split(';').next().unwrap_or_default().to_owned() };
    let page = session.page("/consumers/shipping").await?;
    let token = csrf(&page)?;
    let groups: Vec<&str> = page.match_indices(r#"<tr class="dead-group">"#).map(|(i, _)| &page[i..]).collect();
    assert_eq!(groups.len(), 2, "two errors: {page}");
    assert!(
        groups[0].contains("carrier down") && groups[0].contains(r#"<td class="num count">2</td>"#),
        "largest first"
    );

    let dry = session
        .post("/consumers/shipping/replay", &[("csrf", &token), ("last_error", "carrier down"), ("dry_run", "true")])
        .await?;
    assert_eq!(dry.status(), 200);
    let dry = dry.text().await?;
    assert!(dry.contains(r#"<strong class="selected">2</strong>"#), "{dry}");
    assert_eq!(stats(&srv, "shipping").await?.dead, 3, "a dry run changes nothing");
    let r = session
        .post(
            "/consumers/shipping/replay",
            &[("csrf", &token), ("last_error", "carrier down"), ("dry_run", "false"), ("max_per_second", "50")],
        )
        .await?;
    assert_eq!(r.status(), 303);
    let job = r.headers()["location"].to_str()?.to_owned();
    eventually("replayed", WAIT, || async {
        let p = session.page(&job).await?;
        Ok(p.contains(r#"<strong class="state">done</strong>"#).then_some(p))
    })
    .await
    .map(|p| assert!(p.contains(r#"<strong class="replayed">2</strong>"#), "{p}"))?;
    let mut again: Vec<_> = s.take(2, WAIT).await?.into_iter().map(|d| (d.message_id, d.delivery_count)).collect();
    again.sort();
    let mut want = vec![(ids[0].clone(), 1), (ids[1].clone(), 1)];
    want.sort();
    assert_eq!(again, want, "the group, delivered again from count 1");
    assert_eq!(stats(&srv, "shipping").await?.dead, 1, "the other group stays dead");
    let replays = session.page("/replays").await?;
    assert!(replays.contains(r#"<td class="principal">anonymous</td>"#), "{replays}");
    Ok(())
}

/// Issue 48 item 6, the rest of an operator's day, on each store: a consumer's pending,
/// retrying and in-flight deliveries listed and paged; a held key skipped only after a
/// confirmation, with a message after; one message replayed from its page (a dry run first);
/// error texts shown alike on every screen (quotes and all); a payload's keys in their order;
/// search by topic pattern; acked figures and dashes on the overview; and, without sign-in,
/// a deep link kept through the first visit's redirect.
async fn an_operators_day_lists_deliveries_replays_one_message_skips_a_held_key_and_searches_patterns(
    backend: Backend,
) -> Result<()> {
    let (_store, srv, db) = setup(backend, &["--console-listen", "127.0.0.1:0"]).await?;
    let base = console_url(&srv)?;
    let mut admin = srv.admin().await?;
    let mut shipping = consumer("shipping", &["orders.*"]);
    shipping.max_deliveries = 1;
    shipping.dead_key_policy = pb::DeadKeyPolicy::Hold as i32;
    create_consumer(&mut admin, shipping).await?;
    let mut billing = consumer("billing", &["invoices.*"]);
    billing.backoff_base = Some(outbox_tests::dur(std::time::Duration::from_secs(600)));
    billing.backoff_max = billing.backoff_base;
    create_consumer(&mut admin, billing).await?;

    // Without sign-in, a first visit's redirect (which sets the cookie) keeps the deep link.
    let http = client()?;
    let k1a = db.enqueue(&Message::new("orders.created", "OrderCreated", b"{}".to_vec()).ordering_key("k1")).await?;
    let r = http.get(format!("{base}/messages/{}", k1a.message_id)).send().await?;
    assert_eq!((r.status().as_u16(), location(&r)), (303, format!("/messages/{}", k1a.message_id)));
    let cookie = set_cookie(&r).context("a session cookie")?.split(';').next().unwrap_or_default().to_owned();
    let session = Session { http, base: base.clone(), cookie };
    let token = csrf(&session.page(&format!("/messages/{}", k1a.message_id)).await?)?;

    // Shipping: a key held by its dead message, and a dead message to replay by itself.
    let k1b = db.enqueue(&Message::new("orders.created", "OrderCreated", b"{}".to_vec()).ordering_key("k1")).await?;
    let payload = br#"{"zeta":1,"alpha":[1.50,2],"mid":"x"}"#;
    let u0 = db.enqueue(&Message::new("orders.charged", "OrderCharged", payload.to_vec())).await?;
    let mut s = RawStream::open(&srv.endpoint, "shipping", 10).await?;
    let first = s.take(2, WAIT).await?;
    let quoted = r#"card "declined" by \bank"#;
    for d in &first {
        s.nack(&d.message_id, if d.message_id == k1a.message_id.to_string() { quoted } else { "carrier down" }).await;
    }
    eventually("shipping: 2 dead, k1 held", WAIT, || async {
        let st = stats(&srv, "shipping").await?;
        Ok((st.dead == 2 && st.held_keys == 1).then_some(()))
    })
    .await?;

    // Billing: one retrying (its retry 10 minutes away), one in flight, 55 pending behind.
    let mut invoices = Vec::new();
    for i in 0..57 {
        invoices.push(db.sql_enqueue("invoices.created", "InvoiceCreated", format!("{{\"n\":{i}}}").as_bytes()).await?);
    }
    let mut b = RawStream::open(&srv.endpoint, "billing", 1).await?;
    let i0 = b.take(1, WAIT).await?.remove(0);
    assert_eq!(i0.message_id, invoices[0].to_string());
    b.nack(&i0.message_id, r#"timeout: "upstream" took 30s"#).await;
    let i1 = b.take(1, WAIT).await?.remove(0);
    eventually("billing: 1 retrying, 1 in flight", WAIT, || async {
        let st = stats(&srv, "billing").await?;
        Ok((st.retrying == 1 && st.in_flight == 1 && st.backlog == 56).then_some(()))
    })
    .await?;
    let rows = |page: &str| -> Vec<String> {
        page.match_indices("<tr data-message-id=\"")
            .map(|(i, m)| page[i + m.len()..].split('"').next().unwrap_or_default().to_owned())
            .collect()
    };
    let in_flight = session.page("/consumers/billing/deliveries?kind=in-flight").await?;
    assert_eq!(rows(&in_flight), std::slice::from_ref(&i1.message_id), "{in_flight}");
    let retrying = session.page("/consumers/billing/deliveries?kind=retrying").await?;
    assert_eq!(rows(&retrying), std::slice::from_ref(&i0.message_id));
    assert!(
        retrying.contains(r#"<span class="error-text">timeout: &quot;upstream&quot; took 30s</span>"#),
        "{retrying}"
    );
    let mut pending = Vec::new();
    let mut next = Some("/consumers/billing/deliveries?kind=pending".to_owned());
    let mut pages = 0;
    while let Some(path) = next.take() {
        let page = session.page(&path).await?;
        pending.extend(rows(&page));
        next =
            page.split(r#"id="next" href=""#).nth(1).and_then(|r| r.split('"').next()).map(|h| h.replace("&amp;", "&"));
        pages += 1;
        ensure!(pages < 5, "pending pages do not end");
    }
    let mut want: Vec<String> = invoices.iter().map(|u| u.to_string()).filter(|u| *u != i1.message_id).collect();
    want.sort();
    let mut got = pending.clone();
    got.sort();
    assert_eq!((pages, got), (2, want), "56 pending (the retrying one too) in two pages of at most 50");
    assert_eq!(pending[0], i0.message_id, "oldest first");
    let consumer_page = session.page("/consumers/billing").await?;
    for kind in ["pending", "retrying", "in-flight"] {
        assert!(consumer_page.contains(&format!(r#"id="list-{kind}""#)), "a link to the {kind} list");
    }
    assert_eq!(session.get("/consumers/billing/deliveries?kind=acked").await?.status(), 400);
    assert_eq!(session.get("/consumers/nobody/deliveries").await?.status(), 404);

    // The held key: "Skip it" asks first, and changes nothing until confirmed.
    let page = session.page("/consumers/shipping").await?;
    assert!(page.contains(r#"<span class="error-text">card &quot;declined&quot; by \bank</span>"#), "{page}");
    let ask = session
        .post("/consumers/shipping/keys/release", &[("csrf", &token), ("ordering_key", "k1"), ("skip_dead", "true")])
        .await?;
    assert_eq!(ask.status(), 200);
    let ask = ask.text().await?;
    assert!(ask.contains(r#"id="skip-confirm""#) && ask.contains(&k1a.message_id.to_string()), "{ask}");
    assert_eq!(stats(&srv, "shipping").await?.held_keys, 1, "not released before it is confirmed");
    assert!(s.next(std::time::Duration::from_millis(300)).await?.is_none(), "k1b still waits");
    let done = session
        .post(
            "/consumers/shipping/keys/release",
            &[("csrf", &token), ("ordering_key", "k1"), ("skip_dead", "true"), ("confirmed", "true")],
        )
        .await?;
    assert_eq!(done.status(), 303);
    let after = location(&done);
    assert!(after.starts_with("/consumers/shipping?"), "{after}");
    let next_of_key = s.take(1, WAIT).await?.remove(0);
    assert_eq!(next_of_key.message_id, k1b.message_id.to_string(), "the waiting one goes");
    s.ack(&[&next_of_key.message_id]).await;
    let notice = session.page(&after).await?;
    assert!(
        notice.contains(r#"id="notice""#) && notice.contains("Skipped the dead message of ordering key k1"),
        "{notice}"
    );
    assert_eq!(stats(&srv, "shipping").await?.dead, 2, "the skipped one stays dead");

    // A group replay by that error: its screens show the error as every other screen does.
    let r = session
        .post(
            "/consumers/shipping/replay",
            &[("csrf", &token), ("last_error", quoted), ("dry_run", "false"), ("max_per_second", "50")],
        )
        .await?;
    assert_eq!(r.status(), 303);
    let job = location(&r);
    eventually("the group replayed", WAIT, || async {
        Ok(session.page(&job).await?.contains(r#"<strong class="state">done</strong>"#).then_some(()))
    })
    .await?;
    for screen in [job.as_str(), "/replays"] {
        let p = session.page(screen).await?;
        assert!(p.contains(r#"last error <span class="error-text">card &quot;declined&quot; by \bank</span>"#), "{p}");
        assert!(!p.contains(r#"\&quot;"#), "no backslashed quotes on {screen}: {p}");
    }
    let again = s.take(1, WAIT).await?.remove(0);
    assert_eq!(again.message_id, k1a.message_id.to_string());
    s.ack(&[&again.message_id]).await;

    // One message replayed from its page: a dry run first, then the replay, then a message.
    let u0_page = format!("/messages/{}", u0.message_id);
    let m = session.page(&u0_page).await?;
    assert!(m.contains(r#"class="replay-message inline""#), "a replay form for shipping: {m}");
    // The payload as it was written: keys in their order, numbers as they are.
    assert!(
        m.contains("{\n  &quot;zeta&quot;: 1,\n  &quot;alpha&quot;: [\n    1.50,\n    2\n  ],\n  &quot;mid&quot;: &quot;x&quot;\n}"),
        "{m}"
    );
    let dry = session.post(&format!("{u0_page}/replay"), &[("csrf", &token), ("consumer", "shipping")]).await?;
    assert_eq!(dry.status(), 200);
    let dry = dry.text().await?;
    assert!(dry.contains(r#"id="replay-message-confirm""#) && dry.contains(">DEAD<"), "{dry}");
    assert_eq!(stats(&srv, "shipping").await?.dead, 1, "a dry run changes nothing");
    let r = session
        .post(&format!("{u0_page}/replay"), &[("csrf", &token), ("consumer", "shipping"), ("confirmed", "true")])
        .await?;
    assert_eq!((r.status().as_u16(), location(&r)), (303, format!("{u0_page}?replayed=shipping&count=1")));
    let d = s.take(1, WAIT).await?.remove(0);
    assert_eq!((d.message_id.as_str(), d.delivery_count), (u0.message_id.to_string().as_str(), 1));
    s.ack(&[&d.message_id]).await;
    let shown = session.page(&location(&r)).await?;
    assert!(shown.contains(r#"id="notice""#) && shown.contains("Replayed to shipping"), "{shown}");
    let r = session.post(&format!("{u0_page}/replay"), &[("consumer", "shipping"), ("confirmed", "true")]).await?;
    assert_eq!(r.status(), 403, "without the CSRF token");

    // Search by topic pattern.
    let found = session.page("/search?topic=orders.*").await?;
    let mut ids = rows(&found);
    ids.sort();
    let mut orders = vec![k1a.message_id.to_string(), k1b.message_id.to_string(), u0.message_id.to_string()];
    orders.sort();
    assert_eq!(ids, orders, "orders.* and no invoice");
    assert_eq!(rows(&session.page("/search?topic=invoices.%3E").await?).len(), 50, "invoices.> (a page of 50)");
    let bad = session.page("/search?topic=orders.%3E.x").await?;
    assert!(bad.contains("search-error") && bad.contains("final"), "{bad}");

    // The overview: acks of the last hour, and dashes until a rate can be drawn. (A stream's ack
    // is applied after it is sent: the figure is waited for.)
    let acked = |overview: &str, name: &str| {
        overview
            .split(&format!(r#"data-consumer="{name}""#))
            .nth(1)
            .and_then(|r| r.split(r#"<td class="num acked">"#).nth(1))
            .and_then(|r| r.split('<').next())
            .map(str::to_owned)
    };
    let overview = eventually("the overview's acks of shipping to reach 3 (k1b, k1a, u0)", WAIT, || async {
        let page = session.page("/").await?;
        Ok((acked(&page, "shipping").as_deref() == Some("3")).then_some(page))
    })
    .await?;
    assert_eq!(acked(&overview, "billing").as_deref(), Some("0"));
    assert!(overview.contains(r#"<span class="dash""#), "no rate yet: a dash: {overview}");
    Ok(())
}
