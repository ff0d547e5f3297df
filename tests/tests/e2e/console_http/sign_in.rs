//! Signing in: the cookie is a stored session, never the token; forged changes refused; each
//! principal shown only its own; TLS and client certificates; deep links kept, to this console
//! only.
use anyhow::{Context as _, Result};
use outbox_client::grpc::admin_with;
use outbox_proto::v1 as pb;
use outbox_tests::{Backend, TestStore, consumer, create_consumer, eventually};

use crate::WAIT;
use crate::security::{Scratch, auth_file, s, start, tok};

use super::{client, client_anonymous, console_url, csrf, location, paused, set_cookie, sign_in, urlencode};

/// With an auth file: every page wants a signed-in principal; a wrong token, or a sign-in
/// posted from another site, is refused; the cookie is HttpOnly and SameSite=Strict; a change
/// without the session's CSRF token, or from another site, is refused and changes nothing; a
/// principal sees actions only where it holds their permission and a payload only under
/// `tail:`; and every answer carries the security headers.
#[tokio::test]
async fn the_console_signs_in_refuses_forged_changes_and_shows_each_principal_only_its_own() -> Result<()> {
    let store = TestStore::create(Backend::Sqlite).await?;
    let scratch = Scratch::new()?;
    let file = scratch.write(
        "auth.toml",
        &auth_file(&[
            ("root", &["*"]),
            ("reader", &["admin:read"]),
            ("operator", &["admin:read", "admin:write", "replay:*"]),
        ]),
    )?;
    let srv = start(&store, &["--auth-file", s(&file), "--console-listen", "127.0.0.1:0"]).await?;
    let base = console_url(&srv)?;
    let mut admin = admin_with(&srv.endpoint, &tok("root")).await?;
    create_consumer(&mut admin, consumer("billing", &["orders.*"])).await?;
    let mut client = outbox_client::grpc::outbox_with(&srv.endpoint, &tok("root")).await?;
    let id = client
        .enqueue(pb::EnqueueRequest {
            topic: "orders.created".into(),
            r#type: "OrderCreated".into(),
            payload: br#"{"card":"4242"}"#.to_vec(),
            ..Default::default()
        })
        .await?
        .into_inner()
        .message_id;

    let http = client_anonymous()?;
    let r = http.get(format!("{base}/")).send().await?;
    assert_eq!((r.status().as_u16(), r.headers()["location"].to_str()?), (303, "/login"));
    let r = http.get(format!("{base}/login")).send().await?;
    let h = r.headers();
    assert!(h["content-security-policy"].to_str()?.contains("script-src 'self'"), "{h:?}");
    assert_eq!((h["x-frame-options"].to_str()?, h["x-content-type-options"].to_str()?), ("DENY", "nosniff"));
    assert_eq!(h["cache-control"], "no-store");
    let r = http.post(format!("{base}/login")).form(&[("token", "tok-nobody")]).send().await?;
    assert_eq!(r.status(), 401);
    assert!(set_cookie(&r).is_none(), "no cookie for a wrong token");
    assert!(r.text().await?.contains("login-error"));
    let r = http
        .post(format!("{base}/login"))
        .header("sec-fetch-site", "cross-site")
        .form(&[("token", "tok-root")])
        .send()
        .await?;
    assert_eq!(r.status(), 401, "a sign-in from another site");
    let r = http.post(format!("{base}/login")).form(&[("token", "tok-operator")]).send().await?;
    let cookie = set_cookie(&r).context("a session cookie")?;
    for attr in ["HttpOnly", "SameSite=Strict", "Path=/"] {
        assert!(cookie.contains(attr), "{cookie}");
    }
    assert!(!cookie.contains("Secure"), "plaintext: not Secure: {cookie}");

    let operator = sign_in(&base, "tok-operator").await?;
    let overview = operator.page("/").await?;
    assert!(overview.contains(r#"data-consumer="billing""#), "{overview}");
    let page = operator.page("/consumers/billing").await?;
    assert!(page.contains(r#"id="pause""#), "the operator may pause");
    let token = csrf(&page)?;
    for (form, headers, why) in [
        (vec![], vec![], "no CSRF token"),
        (vec![("csrf", "forged")], vec![], "a wrong one"),
        (vec![("csrf", token.as_str())], vec![("sec-fetch-site", "cross-site")], "from another site"),
    ] {
        let mut req = operator.http.post(format!("{base}/consumers/billing/pause")).header("cookie", &operator.cookie);
        for (k, v) in headers {
            req = req.header(k, v);
        }
        let r = req.form(&form).send().await?;
        assert_eq!(r.status(), 403, "{why}");
        assert!(!paused(&mut admin).await?, "{why}: nothing changed");
    }
    // A change that says it comes from another origin is refused, whatever it carries.
    let r = operator
        .http
        .post(format!("{base}/consumers/billing/pause"))
        .header("cookie", &operator.cookie)
        .header("origin", "https://evil.example")
        .form(&[("csrf", token.as_str())])
        .send()
        .await?;
    assert_eq!(r.status(), 403, "from another origin");
    assert!(!paused(&mut admin).await?);
    let r = operator
        .http
        .post(format!("{base}/consumers/billing/pause"))
        .header("cookie", &operator.cookie)
        .header("origin", &base)
        .form(&[("csrf", token.as_str())])
        .send()
        .await?;
    assert_eq!(r.status(), 303, "from its own pages");
    assert!(paused(&mut admin).await?, "paused with the token");
    assert!(srv.log_lines(&["outboxd::audit", "pause_consumer", "operator"]).len() == 1, "audited as the RPC");
    // The operator has no tail: permission: no payload.
    let msg = operator.page(&format!("/messages/{id}")).await?;
    assert!(msg.contains("payload-hidden") && !msg.contains("4242"), "{msg}");
    let root = sign_in(&base, "tok-root").await?;
    let msg = root.page(&format!("/messages/{id}")).await?;
    assert!(msg.contains(r#"id="payload""#) && msg.contains("4242"), "root may tail");

    // A reader sees, and may do nothing: no actions shown, and its own valid token refused by
    // the permission.
    let reader = sign_in(&base, "tok-reader").await?;
    let page = reader.page("/consumers/billing").await?;
    assert!(!page.contains(r#"id="resume""#) && !page.contains("dry-run"), "{page}");
    let r = reader.post("/consumers/billing/resume", &[("csrf", &csrf(&page)?)]).await?;
    assert_eq!(r.status(), 403);
    assert!(paused(&mut admin).await?, "still paused");
    // A session's token is its own: the reader's is refused with the operator's cookie.
    let r = operator.post("/consumers/billing/resume", &[("csrf", &csrf(&page)?)]).await?;
    assert_eq!(r.status(), 403);

    // Bad input: clear answers, no server error.
    assert_eq!(root.get("/messages/not-a-uuid").await?.status(), 400);
    assert_eq!(root.get("/consumers/nobody").await?.status(), 404);
    let bad = root.get("/search?after=yesterday").await?;
    assert_eq!(bad.status(), 200);
    assert!(bad.text().await?.contains("is not a time"));
    let r = operator.post("/logout", &[("csrf", &token)]).await?;
    assert!(set_cookie(&r).is_some_and(|c| c.contains("Max-Age=0")), "signed out");
    Ok(())
}

/// Over TLS (the gRPC listener's certificate, HTTP/1.1 offered in the handshake): with mutual
/// TLS a client certificate the auth file names is signed in without a token, and a token's
/// session cookie is `Secure`.
#[tokio::test]
async fn the_console_over_tls_signs_in_a_client_certificate_and_keeps_cookies_secure() -> Result<()> {
    let store = TestStore::create(Backend::Sqlite).await?;
    let pki = outbox_tests::pki::Pki::new("console")?;
    let server = pki.server("server")?;
    let ops = pki.client("ops", "ops", &[])?;
    let auth = pki.dir.join("auth.toml");
    std::fs::write(
        &auth,
        format!(
            "{}[[principal]]\nname = \"ops\"\nsubjects = [\"CN=ops\"]\npermissions = [\"admin:read\"]\n",
            auth_file(&[("root", &["*"])])
        ),
    )?;
    let srv = start(
        &store,
        &[
            "--tls-cert",
            s(&server.cert),
            "--tls-key",
            s(&server.key),
            "--tls-client-ca",
            s(&pki.ca),
            "--auth-file",
            s(&auth),
            "--console-listen",
            "127.0.0.1:0",
        ],
    )
    .await?;
    let port = console_url(&srv)?.rsplit(':').next().context("a port")?.to_owned();
    let base = format!("https://localhost:{port}");
    let _ = rustls::crypto::ring::default_provider().install_default();
    let ca = reqwest::Certificate::from_pem(&std::fs::read(&pki.ca)?)?;
    let mut pem = std::fs::read(&ops.cert)?;
    pem.extend(std::fs::read(&ops.key)?);
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .tls_certs_only([ca])
        .identity(reqwest::Identity::from_pem(&pem)?)
        .build()?;
    let page = http.get(format!("{base}/")).send().await?;
    assert_eq!(page.status(), 200, "the certificate signs in");
    let page = page.text().await?;
    assert!(page.contains(r#"<span id="principal">ops</span>"#), "{page}");
    assert!(!page.contains(r#"id="sign-out""#), "a certificate has no session to end");
    let r = http.post(format!("{base}/login")).form(&[("token", "tok-root")]).send().await?;
    assert_eq!(r.status(), 303);
    let cookie = set_cookie(&r).context("a session cookie")?;
    assert!(cookie.contains("Secure") && cookie.contains("HttpOnly"), "{cookie}");
    assert!(cookie.starts_with("__Host-"), "kept to this host: {cookie}");
    Ok(())
}

/// The `Cookie` header of a sign-in: the session cookie's name and value.
async fn sign_in_cookie(base: &str, token: &str) -> Result<String> {
    Ok(sign_in(base, token).await?.cookie)
}

/// Where `GET /` with this cookie leads: 200 (signed in) or 303 to `/login`.
async fn home(base: &str, cookie: &str) -> Result<u16> {
    let r = client()?.get(format!("{base}/")).header("cookie", cookie).send().await?;
    Ok(r.status().as_u16())
}

/// Issue 47 item 6: the console's cookie is a random session id kept in the database, never
/// the token: it authenticates no gRPC call, works on every replica of the database, and ends
/// at sign-out (on every replica) and when its principal leaves the auth file (ADR 0073).
#[tokio::test]
async fn the_console_cookie_is_a_stored_session_not_the_token() -> Result<()> {
    let store = TestStore::create(Backend::Postgres).await?;
    let scratch = Scratch::new()?;
    let principals: &[(&str, &[&str])] = &[("root", &["*"]), ("reader", &["admin:read"])];
    let file = scratch.write("auth.toml", &auth_file(principals))?;
    let args = ["--auth-file", s(&file), "--console-listen", "127.0.0.1:0", "--reload-interval", "100ms"];
    let one = start(&store, &args).await?;
    let two = start(&store, &args).await?;
    let (base1, base2) = (console_url(&one)?, console_url(&two)?);

    let cookie = sign_in_cookie(&base1, "tok-root").await?;
    let value = cookie.split_once('=').context("name=value")?.1.to_owned();
    assert!(!value.contains("tok-root") && value.len() == 43, "a random id, not the token: {cookie}");
    // Worth nothing outside the console: not a bearer token of the gRPC API.
    let err = admin_with(&one.endpoint, &outbox_client::Credentials::token(value.clone()))
        .await?
        .list_consumers(pb::ListConsumersRequest {})
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated, "{err:?}");
    // Valid on the other replica, with the same CSRF token.
    assert_eq!((home(&base1, &cookie).await?, home(&base2, &cookie).await?), (200, 200));
    let http = client()?;
    let page = |base: &str| {
        let (http, url, cookie) = (http.clone(), format!("{base}/"), cookie.clone());
        async move { anyhow::Ok(http.get(url).header("cookie", cookie).send().await?.text().await?) }
    };
    let token = csrf(&page(&base1).await?)?;
    assert_eq!(token, csrf(&page(&base2).await?)?, "one session, one CSRF token on every replica");

    // Signing out on one replica ends the session on both: a copy of the cookie opens nothing.
    let r = http.post(format!("{base2}/logout")).header("cookie", &cookie).form(&[("csrf", &token)]).send().await?;
    assert_eq!(r.status(), 303);
    assert_eq!((home(&base1, &cookie).await?, home(&base2, &cookie).await?), (303, 303), "signed out");

    // A principal taken out of the auth file loses its session.
    let reader = sign_in_cookie(&base1, "tok-reader").await?;
    assert_eq!(home(&base2, &reader).await?, 200);
    scratch.write("auth.toml", &auth_file(&principals[..1]))?;
    eventually("the reader's session ends with its principal", WAIT, || async {
        Ok((home(&base1, &reader).await? == 303 && home(&base2, &reader).await? == 303).then_some(()))
    })
    .await?;
    // And signing in again with its token fails: the file no longer names it.
    let r = client()?.post(format!("{base1}/login")).form(&[("token", "tok-reader")]).send().await?;
    assert_eq!(r.status(), 401);
    Ok(())
}

/// A session ends at `--console-session-max` however active it is.
#[tokio::test]
async fn an_expired_console_session_is_refused() -> Result<()> {
    let store = TestStore::create(Backend::Sqlite).await?;
    let scratch = Scratch::new()?;
    let file = scratch.write("auth.toml", &auth_file(&[("root", &["*"])]))?;
    let srv =
        start(&store, &["--auth-file", s(&file), "--console-listen", "127.0.0.1:0", "--console-session-max", "3s"])
            .await?;
    let base = console_url(&srv)?;
    let started = std::time::Instant::now();
    let cookie = sign_in_cookie(&base, "tok-root").await?;
    assert_eq!(home(&base, &cookie).await?, 200, "signed in");
    eventually("the session expires", WAIT, || async { Ok((home(&base, &cookie).await? == 303).then_some(())) })
        .await?;
    assert!(started.elapsed() >= std::time::Duration::from_secs(3), "not before --console-session-max");
    let r = client()?.get(format!("{base}/")).header("cookie", &cookie).send().await?;
    assert_eq!(r.headers()["location"].to_str()?, "/login");
    Ok(())
}

/// Issue 48 item 6: a deep link survives the sign-in (the sign-in page leads back to it), and
/// never leads anywhere but a page of this console (no open redirect); a refused change is a
/// page with a way back to the form's page; a principal without `replay:` cannot replay one
/// message; the pages have an icon.
#[tokio::test]
async fn a_deep_link_survives_the_sign_in_and_leads_to_no_other_site() -> Result<()> {
    let store = TestStore::create(Backend::Sqlite).await?;
    let scratch = Scratch::new()?;
    let file = scratch.write(
        "auth.toml",
        &auth_file(&[("root", &["*"]), ("reader", &["admin:read"]), ("other", &["admin:read", "replay:other"])]),
    )?;
    let srv = start(&store, &["--auth-file", s(&file), "--console-listen", "127.0.0.1:0"]).await?;
    let base = console_url(&srv)?;
    let host = base.trim_start_matches("http://").to_owned();
    let mut admin = admin_with(&srv.endpoint, &tok("root")).await?;
    create_consumer(&mut admin, consumer("billing", &["orders.*"])).await?;
    let mut producer = outbox_client::grpc::outbox_with(&srv.endpoint, &tok("root")).await?;
    let id = producer
        .enqueue(pb::EnqueueRequest {
            topic: "orders.created".into(),
            r#type: "OrderCreated".into(),
            payload: b"{}".to_vec(),
            ..Default::default()
        })
        .await?
        .into_inner()
        .message_id;
    let page = format!("/messages/{id}");
    let http = client()?;

    // A fresh browser opening the message is sent to sign in, and from there back to it.
    let r = http.get(format!("{base}{page}?from=mail")).send().await?;
    assert_eq!(r.status(), 303);
    let to_sign_in = location(&r);
    let url = reqwest::Url::parse(&format!("{base}{to_sign_in}"))?;
    let next: Vec<(String, String)> = url.query_pairs().map(|(k, v)| (k.into_owned(), v.into_owned())).collect();
    assert_eq!((url.path(), next), ("/login", vec![("next".to_owned(), format!("{page}?from=mail"))]));
    let form = http.get(format!("{base}{to_sign_in}")).send().await?.text().await?;
    assert!(form.contains(&format!(r#"name="next" value="/messages/{id}?from=mail""#)), "{form}");
    let r = http
        .post(format!("{base}/login"))
        .form(&[("token", "tok-root"), ("next", &format!("{page}?from=mail"))])
        .send()
        .await?;
    assert_eq!((r.status().as_u16(), location(&r)), (303, format!("{page}?from=mail")), "back to the deep link");
    let cookie = set_cookie(&r).context("a session")?.split(';').next().unwrap_or_default().to_owned();
    let shown = http.get(format!("{base}{page}")).header("cookie", &cookie).send().await?;
    assert_eq!(shown.status(), 200);
    // A wrong token keeps the page to go back to.
    let r = http.post(format!("{base}/login")).form(&[("token", "tok-nobody"), ("next", &page)]).send().await?;
    assert_eq!(r.status(), 401);
    assert!(r.text().await?.contains(&format!(r#"name="next" value="{page}""#)));
    // The overview, and a page's own refresh, need no way back.
    let r = http.get(format!("{base}/")).send().await?;
    assert_eq!(location(&r), "/login");
    let r = http.get(format!("{base}/fragments/overview")).send().await?;
    assert_eq!(location(&r), "/login");

    // Never to another site, however `next` is spelt: the overview instead.
    for evil in [
        "//evil.example/x",
        "/\\evil.example/x",
        "\\\\evil.example",
        "https://evil.example/",
        "/\t/evil.example",
        "javascript:alert(1)",
        "evil.example",
        "/login",
    ] {
        let r = http.post(format!("{base}/login")).form(&[("token", "tok-root"), ("next", evil)]).send().await?;
        assert_eq!((r.status().as_u16(), location(&r)), (303, "/".to_owned()), "next={evil:?}");
        let form = http.get(format!("{base}/login?next={}", urlencode(evil))).send().await?.text().await?;
        assert!(!form.contains(r#"name="next""#), "next={evil:?} is not kept: {form}");
    }

    // A change without this session's token: a page that says nothing changed and leads back
    // to the form's page (from the browser's Referer, on this host only).
    let reader = sign_in(&base, "tok-reader").await?;
    for (referer, back) in [
        (format!("http://{host}/consumers/billing"), "/consumers/billing"),
        (format!("http://{host}/consumers/billing/replay"), "/consumers/billing"),
        ("http://evil.example/consumers/billing".to_owned(), "/"),
    ] {
        let r = reader
            .http
            .post(format!("{base}/consumers/billing/pause"))
            .header("cookie", &reader.cookie)
            .header("referer", &referer)
            .form(&[("csrf", "left-open-before-a-restart")])
            .send()
            .await?;
        assert_eq!(r.status(), 403);
        assert!(r.headers()["content-type"].to_str()?.starts_with("text/html"), "a page, not a line of text");
        let body = r.text().await?;
        assert!(body.contains(r#"href="/assets/console.css""#) && body.contains("nothing was changed"), "{body}");
        assert!(body.contains(&format!(r#"class="button primary" id="back" href="{back}""#)), "{referer}: {body}");
    }
    // The reader sees no replay of a message, and its POST is refused with its own token too.
    let msg = reader.page(&page).await?;
    assert!(!msg.contains("replay-message"), "no replay: for a reader");
    let token = csrf(&msg)?;
    let r = reader.post(&format!("{page}/replay"), &[("csrf", &token), ("consumer", "billing")]).await?;
    assert_eq!(r.status(), 403);
    let r = reader.post(&format!("{page}/replay"), &[("consumer", "billing"), ("confirmed", "true")]).await?;
    assert_eq!(r.status(), 403);
    let st = admin.get_stats(pb::GetStatsRequest { consumer: "billing".into() }).await?.into_inner();
    assert_eq!(st.consumers[0].backlog, 1, "nothing replayed");
    // Skipping a held key asks first only those who may release it: replay: of another
    // consumer is refused before anything about billing's keys is shown.
    let other = sign_in(&base, "tok-other").await?;
    let token = csrf(&other.page("/consumers/billing").await?)?;
    let r = other
        .post("/consumers/billing/keys/release", &[("csrf", &token), ("ordering_key", "k"), ("skip_dead", "true")])
        .await?;
    assert_eq!(r.status(), 403, "replay:other may not skip billing's keys");

    // An icon, at the address browsers ask for too.
    for path in ["/favicon.ico", "/assets/favicon.svg"] {
        let r = http.get(format!("{base}{path}")).send().await?;
        assert_eq!(r.status(), 200, "{path}");
        assert_eq!(r.headers()["content-type"], "image/svg+xml");
        assert!(r.text().await?.starts_with("<svg"), "{path}");
    }
    assert!(form.contains(r#"<link rel="icon" type="image/svg+xml" href="/assets/favicon.svg">"#), "{form}");
    Ok(())
}
