//! The console's places under attack: stalled sign-ins, slowloris and idle connections leave
//! signed-in operators served, and failed sign-ins are limited per address.
use anyhow::{Context as _, Result, ensure};
use outbox_tests::{Backend, TestStore};

use crate::security::{Scratch, auth_file, s, start};

use super::{client, console_url, set_cookie, sign_in};

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
