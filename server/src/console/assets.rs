//! The console's static files, compiled into the binary: its stylesheet, script and icon, and
//! the vendored chart library (uPlot 1.6.32, MIT, from npm as published; see `assets/vendor/`).
//! Served with their content type and a long cache: their names change with their versions.
use axum::extract::Path;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

/// (name, content type, bytes).
const FILES: &[(&str, &str, &[u8])] = &[
    ("console.css", "text/css; charset=utf-8", include_bytes!("assets/console.css")),
    ("console.js", "text/javascript; charset=utf-8", include_bytes!("assets/console.js")),
    ("favicon.svg", "image/svg+xml", include_bytes!("assets/favicon.svg")),
    (
        "uplot-1.6.32.iife.min.js",
        "text/javascript; charset=utf-8",
        include_bytes!("assets/vendor/uplot-1.6.32.iife.min.js"),
    ),
    ("uplot-1.6.32.min.css", "text/css; charset=utf-8", include_bytes!("assets/vendor/uplot-1.6.32.min.css")),
];

/// `/assets/NAME`.
pub async fn asset(Path(name): Path<String>) -> Response {
    file(&name)
}

/// `/favicon.ico`, which browsers ask for by itself (on pages that are not HTML, such as a
/// plain-text refusal): the icon the pages name.
pub async fn favicon() -> Response {
    file("favicon.svg")
}

fn file(name: &str) -> Response {
    match FILES.iter().find(|(n, _, _)| *n == name) {
        Some((_, kind, bytes)) => {
            ([(header::CONTENT_TYPE, *kind), (header::CACHE_CONTROL, "public, max-age=3600")], *bytes).into_response()
        }
        None => (StatusCode::NOT_FOUND, "no such file").into_response(),
    }
}
