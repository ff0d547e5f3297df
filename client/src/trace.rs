//! W3C trace context in message headers, so that one trace shows producer → outboxd → consumer.
//!
//! Enqueue records the current span's context as the `traceparent` (and `tracestate`) header;
//! the [`Subscriber`](crate::Subscriber) runs each handler in a span whose parent is the
//! context the delivery carries. Both are no-ops unless the application has installed a
//! `tracing-opentelemetry` layer: without one, spans have no OpenTelemetry context to record.
use std::collections::{BTreeMap, HashMap};

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator as _};
use opentelemetry::trace::TraceContextExt as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// The header that carries the W3C trace context.
pub const TRACEPARENT: &str = "traceparent";

struct MapInjector<'a>(&'a mut BTreeMap<String, String>);

impl Injector for MapInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        self.0.insert(key.to_owned(), value);
    }
}

struct MapExtractor<'a>(&'a HashMap<String, String>);

impl Extractor for MapExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(String::as_str).collect()
    }
}

/// Writes `span`'s trace context into `headers`, unless they carry a `traceparent` already (a
/// producer that set one on purpose keeps it) or the span has no valid context.
pub fn inject(span: &tracing::Span, headers: &mut BTreeMap<String, String>) {
    if headers.contains_key(TRACEPARENT) {
        return;
    }
    let cx = span.context();
    if cx.span().span_context().is_valid() {
        TraceContextPropagator::new().inject_context(&cx, &mut MapInjector(headers));
    }
}

/// Makes the context carried by `headers` (if any) the parent of `span`, which must not have
/// been entered yet.
pub fn continue_from(span: &tracing::Span, headers: &HashMap<String, String>) {
    if !headers.contains_key(TRACEPARENT) {
        return;
    }
    let cx = TraceContextPropagator::new().extract(&MapExtractor(headers));
    if cx.span().span_context().is_valid() {
        // Fails only when no OpenTelemetry layer is installed: nothing to continue then.
        let _ = span.set_parent(cx);
    }
}
