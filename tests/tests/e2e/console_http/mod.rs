//! The web console over plain HTTP, as an attacker and an operator without a browser see it: a
//! real outboxd with `--console-listen`, its pages, sign-in, cookies, CSRF, permissions and a
//! replay of a group of dead letters. (The browser's view is `console.rs`.)
//!
//! One file per subject; the client, sign-in and session they share are here.
mod operators;
mod places;
mod sign_in;

use anyhow::{Context as _, Result, ensure};
use outbox_proto::v1 as pb;
use outbox_tests::Outboxd;

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

fn client_anonymous() -> Result<reqwest::Client> {
    client()
}

/// The `location` of a redirect.
fn location(r: &reqwest::Response) -> String {
    r.headers().get("location").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned()
}

fn urlencode(s: &str) -> String {
    s.bytes().map(|b| format!("%{b:02X}")).collect()
}

async fn paused(admin: &mut outbox_client::grpc::AdminClient) -> Result<bool> {
    let r = admin.get_consumer(pb::GetConsumerRequest { consumer: "billing".into() }).await?.into_inner();
    Ok(r.consumer.context("a consumer")?.paused)
}
