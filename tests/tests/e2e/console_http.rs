//! The web console over plain HTTP, as an attacker and an operator without a browser see it: a
//! real outboxd with `--console-listen`, its pages, sign-in, cookies, CSRF, permissions and a
//! replay of a group of dead letters. (The browser's view is `console.rs`.)
use anyhow::{Context as _, Result, ensure};
use outbox_client::Message;
use outbox_client::grpc::admin_with;
use outbox_proto::v1 as pb;
use outbox_tests::{Backend, Outboxd, RawStream, TestStore, consumer, create_consumer, eventually};

use crate::security::{Scratch, auth_file, s, start, tok};
use crate::{WAIT, conformance, setup, stats};

conformance!(
    an_operator_replays_a_group_of_dead_letters_from_the_console,
    an_operators_day_lists_deliveries_replays_one_message_skips_a_held_key_and_searches_patterns,
);

/// The console's base URL, from the line outboxd logs when it binds `--console-listen`.
pub(crate) fn console_url(srv: &Outboxd) -> Result<String> {
    let line = srv.log_lines(&["console served"]).into_iter().next().context("no `console served` line")?;
    let addr = line.split("addr=").nth(1).context("no addr")?.split_whitespace().next().context("no addr")?;
    Ok(format!("http://{addr}"))
}

pub(crate) fn client() -> Result<reqwest::Client> {
    // reqwest is built without a TLS provider of its own (plain HTTP here anyway).
    let _ = rustls::crypto::ring::default_provider().install_default();
    Ok(reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build()?)
}

/// The `outboxd_console` cookie a response sets, with its attributes.
pub(crate) fn set_cookie(r: &reqwest::Response) -> Option<String> {
    r.headers()
        .get_all(reqwest::header::SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|v| v.starts_with("outboxd_console=") || v.starts_with("__Host-outboxd_console="))
        .map(str::to_owned)
}

/// The session's CSRF token, from a page's `<meta name="csrf-token">`.
fn csrf(page: &str) -> Result<String> {
    let at = page.find(r#"name="csrf-token" content=""#).context("no csrf meta")?;
    let rest = &page[at + r#"name="csrf-token" content=""#.len()..];
    Ok(rest[..rest.find('"').context("unterminated")?].to_owned())
}

struct Session {
    http: reqwest::Client,
    base: String,
    cookie: String,
}

impl Session {
    async fn get(&self, path: &str) -> Result<reqwest::Response> {
        Ok(self.http.get(format!("{}{path}", self.base)).header("cookie", &self.cookie).send().await?)
    }

    async fn page(&self, path: &str) -> Result<String> {
        let r = self.get(path).await?;
        ensure!(r.status() == 200, "GET {path}: {}", r.status());
        Ok(r.text().await?)
    }

    async fn post(&self, path: &str, form: &[(&str, &str)]) -> Result<reqwest::Response> {
        Ok(self.http.post(format!("{}{path}", self.base)).header("cookie", &self.cookie).form(form).send().await?)
    }
}

async fn sign_in(base: &str, token: &str) -> Result<Session> {
    let http = client()?;
    let r = http.post(format!("{base}/login")).form(&[("token", token)]).send().await?;
    ensure!(r.status() == 303, "sign-in as {token}: {}", r.status());
    let cookie = set_cookie(&r).context("no session cookie")?;
    let cookie = cookie.split(';').next().unwrap_or_default().to_owned();
    Ok(Session { http, base: base.to_owned(), cookie })
}

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

async fn paused(admin: &mut outbox_client::grpc::AdminClient) -> Result<bool> {
    let r = admin.get_consumer(pb::GetConsumerRequest { consumer: "billing".into() }).await?.into_inner();
    Ok(r.consumer.context("a consumer")?.paused)
}

fn client_anonymous() -> Result<reqwest::Client> {
    client()
}

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

/// A client whose connections come from the loopback address `from`.
fn client_from(from: &str) -> Result<reqwest::Client> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    Ok(reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .local_address(from.parse::<std::net::IpAddr>()?)
        .build()?)
}

/// A raw connection to the console from the loopback address `from` that sends `bytes` and
/// then nothing more.
async fn stalled_from(from: &str, to: std::net::SocketAddr, bytes: &str) -> Result<tokio::net::TcpStream> {
    use tokio::io::AsyncWriteExt as _;
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(std::net::SocketAddr::new(from.parse()?, 0))?;
    let mut c = socket.connect(to).await?;
    c.write_all(bytes.as_bytes()).await?;
    Ok(c)
}

/// Issue 47, item 5: stalled sign-in bodies and slowloris connections from one address take
/// only that address's share of the places of those who have not signed in: a signed-in
/// operator's requests are all served meanwhile, and another client still gets the sign-in page.
#[tokio::test]
async fn stalled_sign_ins_and_slowloris_do_not_lock_signed_in_operators_out() -> Result<()> {
    let store = TestStore::create(Backend::Sqlite).await?;
    let scratch = Scratch::new()?;
    let file = scratch.write("auth.toml", &auth_file(&[("root", &["*"])]))?;
    let srv = start(&store, &["--auth-file", s(&file), "--console-listen", "127.0.0.1:0"]).await?;
    let base = console_url(&srv)?;
    let addr: std::net::SocketAddr = base.trim_start_matches("http://").parse()?;
    let operator = sign_in(&base, "tok-root").await?;

    let mut held = Vec::new();
    for _ in 0..8 {
        let head = format!(
            "POST /login HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/x-www-form-urlencoded\r\n\
             Content-Length: 1000\r\n\r\ntoken=x"
        );
        held.push(stalled_from("127.0.0.2", addr, &head).await?);
    }
    // A body is read before its request takes a place: the stalled ones hold their
    // connections only, and even the same address's next request is answered.
    let attacker = client_from("127.0.0.2")?;
    let r = attacker.get(format!("{base}/login")).send().await?;
    assert_eq!(r.status(), 200, "stalled bodies hold no place");
    for _ in 0..40 {
        if let Ok(c) = stalled_from("127.0.0.2", addr, &format!("GET / HTTP/1.1\r\nHost: {addr}\r\n")).await {
            held.push(c);
        }
    }
    for i in 0..40 {
        let r = operator.get("/").await?;
        ensure!(r.status() == 200, "signed-in request {i}: {}", r.status());
    }
    let r = client()?.get(format!("{base}/login")).send().await?;
    assert_eq!(r.status(), 200, "another client's sign-in page");
    drop(held);
    Ok(())
}

/// Issue 47, item 7: failed sign-ins are limited per client address (429 with Retry-After, while
/// other addresses still sign in) and logged once per address and minute, not once per guess.
#[tokio::test]
async fn failed_sign_ins_are_rate_limited_per_address_and_logged_in_aggregate() -> Result<()> {
    let store = TestStore::create(Backend::Sqlite).await?;
    let scratch = Scratch::new()?;
    let file = scratch.write("auth.toml", &auth_file(&[("root", &["*"])]))?;
    let srv = start(&store, &["--auth-file", s(&file), "--console-listen", "127.0.0.1:0"]).await?;
    let base = console_url(&srv)?;
    let guesser = client_from("127.0.0.3")?;
    for i in 0..10 {
        let r = guesser.post(format!("{base}/login")).form(&[("token", format!("guess-{i}"))]).send().await?;
        assert_eq!(r.status(), 401, "guess {i}");
    }
    let r = guesser.post(format!("{base}/login")).form(&[("token", "guess-10")]).send().await?;
    assert_eq!(r.status(), 429, "the eleventh guess");
    let wait: u64 = r.headers()["retry-after"].to_str()?.parse()?;
    assert!((1..=60).contains(&wait), "Retry-After {wait}");
    // Another address signs in all the same.
    sign_in(&base, "tok-root").await?;
    let lines = srv.log_lines(&["console sign-in", "refused", "127.0.0.3"]);
    assert_eq!(lines.len(), 1, "one line for the address's refusals so far: {lines:#?}");
    Ok(())
}

/// The `location` of a redirect.
fn location(r: &reqwest::Response) -> String {
    r.headers().get("location").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned()
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

fn urlencode(s: &str) -> String {
    s.bytes().map(|b| format!("%{b:02X}")).collect()
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

/// A GET of `path` with `cookie` on a kept-alive raw HTTP/1.1 connection: its status (the
/// body read to its end, so that the connection can carry the next request).
async fn kept_alive_get(c: &mut tokio::net::TcpStream, host: &str, path: &str, cookie: &str) -> Result<u16> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    c.write_all(format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nCookie: {cookie}\r\n\r\n").as_bytes()).await?;
    let mut got = Vec::new();
    let mut buf = [0u8; 8192];
    let head_end = loop {
        if let Some(at) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        let n = c.read(&mut buf).await?;
        ensure!(n > 0, "the connection was closed");
        got.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8_lossy(&got[..head_end]).to_ascii_lowercase();
    let status: u16 = head.split_whitespace().nth(1).context("no status")?.parse()?;
    let length: usize =
        head.lines().find_map(|l| l.strip_prefix("content-length:")).context("no content-length")?.trim().parse()?;
    while got.len() < head_end + length {
        let n = c.read(&mut buf).await?;
        ensure!(n > 0, "the connection was closed mid-body");
        got.extend_from_slice(&buf[..n]);
    }
    Ok(status)
}

/// Issue 47, item 5 (the review of ADR 0075): connections from many client addresses that send
/// half a request fill every connection place of the console; a signed-in operator's new
/// connection still gets in, because the connection that has waited longest without a
/// signed-in request gives its place up (ADR 0079), and the operator's connection in use keeps
/// its place. A principal without `admin:read` (which every page needs) is not signed in.
#[tokio::test]
async fn idle_console_connections_from_many_addresses_give_their_places_to_signed_in_operators() -> Result<()> {
    let store = TestStore::create(Backend::Sqlite).await?;
    let scratch = Scratch::new()?;
    let file = scratch.write("auth.toml", &auth_file(&[("root", &["*"]), ("nobody", &["produce:x.*"])]))?;
    let srv = start(
        &store,
        &[
            "--auth-file",
            s(&file),
            "--console-listen",
            "127.0.0.1:0",
            "--max-client-connections",
            "8",
            "--max-connections-per-peer",
            "3",
        ],
    )
    .await?;
    let base = console_url(&srv)?;
    let addr: std::net::SocketAddr = base.trim_start_matches("http://").parse()?;
    let host = addr.to_string();

    // A token that holds no admin:read opens no session.
    let r = client()?.post(format!("{base}/login")).form(&[("token", "tok-nobody")]).send().await?;
    assert_eq!(r.status(), 403, "a sign-in without admin:read");
    assert!(set_cookie(&r).is_none(), "a session cookie was set");
    assert!(r.text().await?.contains("admin:read"), "the refusal names the permission");

    let operator = sign_in(&base, "tok-root").await?;
    let mut used = stalled_from("127.0.0.9", addr, "").await?;
    assert_eq!(kept_alive_get(&mut used, &host, "/", &operator.cookie).await?, 200);
    // Five addresses, three half-sent requests each: 15 connections for the 7 places left.
    let mut idle = Vec::new();
    for a in 2..=6 {
        for _ in 0..3 {
            idle.push(
                stalled_from(&format!("127.0.0.{a}"), addr, &format!("GET / HTTP/1.1\r\nHost: {host}\r\n")).await?,
            );
        }
    }
    // The oldest have given their places up and are closed.
    for (i, c) in idle.iter_mut().take(8).enumerate() {
        let mut buf = [0u8; 64];
        let n = tokio::time::timeout(std::time::Duration::from_secs(2), tokio::io::AsyncReadExt::read(c, &mut buf))
            .await
            .with_context(|| format!("idle connection {i} was kept"))?
            .unwrap_or(0);
        ensure!(n == 0, "idle connection {i} was answered");
    }
    // A signed-in operator's new connections are served, and so is the sign-in page.
    let fresh = client()?;
    for i in 0..3 {
        let r = fresh.get(format!("{base}/")).header("cookie", &operator.cookie).send().await?;
        ensure!(r.status() == 200, "a new connection's signed-in request {i}: {}", r.status());
    }
    let r = client()?.get(format!("{base}/login")).send().await?;
    assert_eq!(r.status(), 200, "another client's sign-in page");
    // The operator's connection in use kept its place.
    assert_eq!(kept_alive_get(&mut used, &host, "/", &operator.cookie).await?, 200);
    drop(idle);
    Ok(())
}
