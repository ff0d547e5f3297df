//! Logs and traces: the `tracing` subscriber, OTLP export configured by the standard `OTEL_*`
//! variables, and the W3C trace context that messages carry in their `traceparent` header.
//!
//! Export is off unless `OTEL_TRACES_EXPORTER=otlp` or an `OTEL_EXPORTER_OTLP_ENDPOINT` /
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set (and `OTEL_SDK_DISABLED` is not `true`). Spans go
//! over OTLP/gRPC; endpoint, headers, timeout and the batch processor's limits come from the
//! standard variables, the service name from `OTEL_SERVICE_NAME` (default `outboxd`).
use std::collections::{BTreeMap, HashMap};

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator as _};
use opentelemetry::trace::{TraceContextExt as _, TracerProvider as _};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer as _};

/// Log targets held at `info` whatever the filter asks: they print secrets at debug level.
const QUIET_SECRETS: [&str; 2] = ["async_nats=info", "lapin=info"];

/// How logs are written (`--log-format`).
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// The header that carries the W3C trace context.
pub const TRACEPARENT: &str = "traceparent";

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("OTLP span exporter: {0}")]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
    #[error("installing the tracing subscriber: {0}")]
    Subscriber(#[from] tracing_subscriber::util::TryInitError),
}

/// Flushes and stops span export when dropped (or on [`Telemetry::shutdown`]).
#[derive(Debug)]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Whether spans are exported.
    pub fn exporting(&self) -> bool {
        self.provider.is_some()
    }

    /// Sends what is buffered and stops the exporter.
    pub fn shutdown(&mut self) {
        if let Some(provider) = self.provider.take()
            && let Err(e) = provider.shutdown()
        {
            tracing::warn!(error = %e, "flushing spans at shutdown");
        }
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Whether the `OTEL_*` variables ask for trace export.
pub fn otlp_requested(env: impl Fn(&str) -> Option<String>) -> bool {
    let set = |k: &str| env(k).is_some_and(|v| !v.trim().is_empty());
    if env("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
        return false;
    }
    match env("OTEL_TRACES_EXPORTER").map(|v| v.trim().to_ascii_lowercase()) {
        Some(v) if v == "none" => false,
        Some(v) if v.split(',').any(|e| e.trim() == "otlp") => true,
        _ => set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
    }
}

/// Installs the global subscriber: logs to stderr as text or JSON, filtered by `RUST_LOG`
/// (default `info`), plus OTLP span export when the environment asks for it. Call inside the
/// Tokio runtime (the gRPC exporter needs it).
pub fn init(format: LogFormat) -> Result<Telemetry, TelemetryError> {
    // The sink clients' own debug logs print their connect options, a URL's password or token
    // included: they are held at info whatever RUST_LOG asks (a directive added last wins).
    let filter = || {
        EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn"))
            .add_directive(QUIET_SECRETS[0].parse().unwrap_or_default())
            .add_directive(QUIET_SECRETS[1].parse().unwrap_or_default())
    };
    let fmt = tracing_subscriber::fmt::layer()
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    let fmt = match format {
        LogFormat::Text => fmt.with_filter(filter()).boxed(),
        LogFormat::Json => fmt.json().with_filter(filter()).boxed(),
    };
    let provider = if otlp_requested(|k| std::env::var(k).ok()) {
        let exporter = opentelemetry_otlp::SpanExporter::builder().with_tonic().build()?;
        let mut resource = opentelemetry_sdk::Resource::builder();
        if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
            resource = resource.with_service_name("outboxd");
        }
        Some(SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource.build()).build())
    } else {
        None
    };
    let otel = provider.as_ref().map(|p| {
        // Only outboxd's own spans: relay and delivery of traced messages, and RPC handling.
        tracing_opentelemetry::layer()
            .with_tracer(p.tracer("outboxd"))
            .with_filter(EnvFilter::new("outbox_server=info,outboxd=info,off"))
    });
    tracing_subscriber::registry().with(fmt).with(otel).try_init()?;
    if provider.is_some() {
        tracing::info!("exporting spans over OTLP");
    }
    Ok(Telemetry { provider })
}

struct MapInjector<'a>(&'a mut BTreeMap<String, String>);

impl Injector for MapInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        self.0.insert(key.to_owned(), value);
    }
}

struct MapExtractor<'a>(&'a HashMap<&'a str, &'a str>);

impl Extractor for MapExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).copied()
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().copied().collect()
    }
}

/// Makes the trace context `traceparent` (and `tracestate`, if any) the parent of `span`, which
/// must not have been entered yet. Nothing happens without a valid context or an OpenTelemetry
/// layer.
pub fn continue_trace(span: &tracing::Span, traceparent: &str, tracestate: Option<&str>) {
    let mut carrier = HashMap::from([(TRACEPARENT, traceparent)]);
    if let Some(state) = tracestate {
        carrier.insert("tracestate", state);
    }
    let cx = TraceContextPropagator::new().extract(&MapExtractor(&carrier));
    if cx.span().span_context().is_valid() {
        let _ = span.set_parent(cx);
    }
}

/// Replaces the trace context in `headers` with `span`'s, when `span` is being recorded: the
/// consumer's span then becomes a child of outboxd's delivery span.
pub fn inject(span: &tracing::Span, headers: &mut BTreeMap<String, String>) {
    let cx = span.context();
    if cx.span().span_context().is_valid() {
        TraceContextPropagator::new().inject_context(&cx, &mut MapInjector(headers));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| (*v).to_owned())
    }

    #[test]
    fn export_is_off_by_default_and_follows_the_standard_variables() {
        assert!(!otlp_requested(env(&[])));
        assert!(otlp_requested(env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317")])));
        assert!(otlp_requested(env(&[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://c:4317")])));
        assert!(otlp_requested(env(&[("OTEL_TRACES_EXPORTER", "otlp")])));
        assert!(!otlp_requested(env(&[("OTEL_TRACES_EXPORTER", "none"), ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c")])));
        assert!(!otlp_requested(env(&[("OTEL_SDK_DISABLED", "true"), ("OTEL_TRACES_EXPORTER", "otlp")])));
        assert!(!otlp_requested(env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", " ")])));
    }
}
