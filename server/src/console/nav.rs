//! Where the console sends a browser: the pages a sign-in may lead back to (never another
//! site), the page a request came from, and the encoding of names in links.
use axum::http::{HeaderMap, header};

/// The longest path a sign-in leads back to.
const MAX_NEXT_BYTES: usize = 2048;

/// `next` if it is a page of this console that a browser may be sent to: a path of this origin
/// (`/` and not `//` or `/\`), in printable ASCII without `\` (a browser reads `\` as `/`, and
/// drops tabs and line breaks, either of which can turn a path into `//host`), at most
/// [`MAX_NEXT_BYTES`], and not the sign-in or sign-out itself. Anything else — `//host`,
/// `/\host`, `https://host`, `javascript:` — would make the console an open redirect: a link
/// to it could send a browser that has just signed in to another site.
pub fn safe_next(next: &str) -> Option<&str> {
    let b = next.as_bytes();
    let ok = b.first() == Some(&b'/')
        && !matches!(b.get(1), Some(b'/' | b'\\'))
        && b.len() <= MAX_NEXT_BYTES
        && b.iter().all(|c| c.is_ascii_graphic() && *c != b'\\');
    let path = next.split(['?', '#']).next().unwrap_or(next);
    (ok && !matches!(path, "/login" | "/logout")).then_some(next)
}

/// The page a request that must first sign in was going to: a page (GET or HEAD) with its
/// query, not a fragment a page refreshes itself with (the page reloads when it gets the
/// sign-in page instead), not an asset, not the overview (the default).
pub fn return_path(parts: &axum::http::request::Parts) -> Option<String> {
    if !matches!(parts.method, axum::http::Method::GET | axum::http::Method::HEAD) {
        return None;
    }
    let path = parts.uri.path();
    if path == "/" || path.starts_with("/fragments/") || path.starts_with("/assets/") {
        return None;
    }
    let full = parts.uri.path_and_query().map_or(path, |p| p.as_str());
    safe_next(full).map(str::to_owned)
}

/// Where a request that must sign in is sent: the sign-in page, with the page to come back to.
pub fn sign_in_location(next: Option<&str>) -> String {
    match next.and_then(safe_next) {
        Some(n) => format!("/login?next={}", urlencode(n)),
        None => "/login".to_owned(),
    }
}

/// The page of this console a request was sent from (its `Referer`, which browsers send to the
/// same origin under this console's referrer policy), as a page to go back to: a form's action
/// leads back to the page that showed the form.
pub fn referring_page(headers: &HeaderMap) -> Option<String> {
    let referer = headers.get(header::REFERER)?.to_str().ok()?;
    let host = headers.get(header::HOST)?.to_str().ok()?;
    let rest = referer.strip_prefix("http://").or_else(|| referer.strip_prefix("https://"))?;
    let path = rest.strip_prefix(host)?.split('#').next()?;
    let page = safe_next(path)?;
    let bare = page.split('?').next().unwrap_or(page);
    let segments: Vec<&str> = bare.split('/').collect();
    // ["", "consumers", NAME, ACTION, ...] and ["", "messages", ID, "replay"]: the page of the form.
    Some(match segments.as_slice() {
        ["", "consumers", name, "pause" | "resume" | "replay" | "keys", ..] => format!("/consumers/{name}"),
        ["", "messages", id, "replay"] => format!("/messages/{id}"),
        _ => page.to_owned(),
    })
}

/// `s` percent-encoded for a path segment or a query value: all but RFC 3986's unreserved
/// characters (so that `console-demo` stays as it is, in the address bar too).
pub fn urlencode(s: &str) -> String {
    const RESERVED: &percent_encoding::AsciiSet =
        &percent_encoding::NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.').remove(b'~');
    percent_encoding::utf8_percent_encode(s, RESERVED).to_string()
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    /// A sign-in leads back only to a page of this console: never to another host, however the
    /// path is spelt to look like one to a browser.
    #[test]
    fn a_sign_in_leads_back_to_a_path_of_this_console_only() {
        for ok in
            ["/messages/0190a6a0-0000-7000-8000-000000000000", "/consumers/billing?x=1#dead", "/search?topic=orders.*"]
        {
            assert_eq!(safe_next(ok), Some(ok));
        }
        for bad in [
            "",
            "//evil.example/",
            "/\\evil.example",
            "\\\\evil.example",
            "/\t/evil.example",
            "/\n/evil.example",
            "/ /evil.example",
            "https://evil.example/",
            "http:/evil.example",
            "javascript:alert(1)",
            "evil.example",
            "/consumers\\..\\x",
            "/login",
            "/login?next=/",
            "/logout",
            "/caf\u{e9}",
        ] {
            assert_eq!(safe_next(bad), None, "{bad:?}");
        }
        assert_eq!(safe_next(&format!("/{}", "a".repeat(MAX_NEXT_BYTES))), None, "too long");
        assert_eq!(sign_in_location(Some("/consumers/a b")), "/login");
        assert_eq!(sign_in_location(Some("/consumers/x?y=1")), "/login?next=%2Fconsumers%2Fx%3Fy%3D1");
        assert_eq!(sign_in_location(Some("//evil.example")), "/login");
        assert_eq!(sign_in_location(None), "/login");
    }

    fn parts(method: &str, uri: &str) -> axum::http::request::Parts {
        let r = axum::http::Request::builder().method(method).uri(uri).body(()).unwrap_or_default();
        r.into_parts().0
    }

    /// The page a refused request was going to: pages asked for, not the polling of a page, its
    /// assets, its forms or the overview.
    #[test]
    fn only_a_page_asked_for_is_returned_to_after_signing_in() {
        assert_eq!(return_path(&parts("GET", "/messages/abc?x=1")).as_deref(), Some("/messages/abc?x=1"));
        assert_eq!(return_path(&parts("HEAD", "/replays")).as_deref(), Some("/replays"));
        for (method, uri) in [
            ("GET", "/"),
            ("GET", "/fragments/overview"),
            ("GET", "/assets/console.css"),
            ("POST", "/consumers/x/pause"),
            ("GET", "//evil.example/x"),
            ("GET", "/login?next=/x"),
        ] {
            assert_eq!(return_path(&parts(method, uri)), None, "{method} {uri}");
        }
    }

    fn headers(pairs: &[(header::HeaderName, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(k, HeaderValue::from_str(v).unwrap_or_else(|_| HeaderValue::from_static("")));
        }
        h
    }

    /// A refused form leads back to the page that showed it, on this host only.
    #[test]
    fn a_refused_change_leads_back_to_the_page_of_its_form_on_this_host() {
        let back =
            |referer: &str| referring_page(&headers(&[(header::HOST, "127.0.0.1:8080"), (header::REFERER, referer)]));
        assert_eq!(back("http://127.0.0.1:8080/consumers/billing").as_deref(), Some("/consumers/billing"));
        assert_eq!(back("https://127.0.0.1:8080/consumers/billing/replay").as_deref(), Some("/consumers/billing"));
        assert_eq!(back("http://127.0.0.1:8080/consumers/replay").as_deref(), Some("/consumers/replay"));
        assert_eq!(back("http://127.0.0.1:8080/consumers/b/keys/release").as_deref(), Some("/consumers/b"));
        assert_eq!(back("http://127.0.0.1:8080/messages/m/replay").as_deref(), Some("/messages/m"));
        assert_eq!(back("http://127.0.0.1:8080/search?topic=a#x").as_deref(), Some("/search?topic=a"));
        for foreign in [
            "http://evil.example/consumers/billing",
            "http://127.0.0.1:8080.evil.example/x",
            "http://127.0.0.1:8080@evil.example/x",
            "http://127.0.0.1:8080//evil.example/x",
            "ftp://127.0.0.1:8080/x",
        ] {
            assert_eq!(back(foreign), None, "{foreign}");
        }
        assert_eq!(referring_page(&headers(&[(header::REFERER, "http://127.0.0.1:8080/x")])), None, "no Host");
    }
}
