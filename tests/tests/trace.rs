//! One trace shows producer → outboxd → consumer: the producer's enqueue span, outboxd's relay
//! and delivery spans, and the Subscriber's handler span, linked parent to child through the
//! message's `traceparent` header. outboxd runs in this process (its library's `App`), so that
//! one in-memory exporter sees the spans of all three.
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::{Context as _, Result};
use opentelemetry::trace::{SpanId, TraceContextExt as _, TraceId, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use outbox_client::{Message, Subscriber, SubscriberConfig};
use outbox_proto::v1 as pb;
use outbox_server::app::App;
use outbox_server::clock::SystemClock;
use outbox_server::config::ServeConfig;
use outbox_tests::{Backend, Db, TestStore, consumer, create_consumer, eventually};
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

const WAIT: Duration = Duration::from_secs(20);

/// The process-wide subscriber: an OpenTelemetry layer exporting into memory.
fn exporter() -> &'static InMemorySpanExporter {
    static EXPORTER: OnceLock<(InMemorySpanExporter, SdkTracerProvider)> = OnceLock::new();
    &EXPORTER
        .get_or_init(|| {
            let exporter = InMemorySpanExporter::default();
            let provider = SdkTracerProvider::builder().with_simple_exporter(exporter.clone()).build();
            tracing_subscriber::registry()
                .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("outbox-tests")))
                .init();
            (exporter, provider)
        })
        .0
}

fn spans_of(trace: TraceId) -> Result<Vec<SpanData>> {
    let all = exporter().get_finished_spans().context("reading the in-memory exporter")?;
    Ok(all.into_iter().filter(|s| s.span_context.trace_id() == trace).collect())
}

fn one<'a>(spans: &'a [SpanData], name: &str) -> Result<&'a SpanData> {
    let mut found = spans.iter().filter(|s| s.name == name);
    let span = found.next().with_context(|| format!("no span {name:?} in the trace"))?;
    anyhow::ensure!(found.next().is_none(), "more than one span {name:?} in the trace");
    Ok(span)
}

async fn stored_message(admin: &mut outbox_client::grpc::AdminClient, id: uuid::Uuid) -> Result<pb::Message> {
    let resp = admin.get_message(pb::GetMessageRequest { message_id: id.to_string() }).await?.into_inner();
    resp.message.context("GetMessage returns the message")
}

async fn producer_to_consumer_is_one_trace(backend: Backend) -> Result<()> {
    exporter();
    let store = TestStore::create(backend).await?;
    let mut config = ServeConfig::new(store.url());
    config.listen = SocketAddr::from(([127, 0, 0, 1], 0));
    config.stream_poll = Duration::from_millis(100);
    config.relay_poll_max = Duration::from_millis(50);
    let app = App::build(config, Arc::new(SystemClock)).await?;
    let endpoint = format!("http://{}", app.local_addr());
    let mut admin = outbox_client::grpc::admin(&endpoint).await?;
    create_consumer(&mut admin, consumer("billing", &["orders.*"])).await?;

    // The producer: a request span, and the enqueue inside the application's transaction.
    let db = Db::connect(store.url()).await?;
    let request = tracing::info_span!("checkout");
    let trace = request.context().span().span_context().trace_id();
    anyhow::ensure!(trace != TraceId::INVALID, "the test subscriber records OpenTelemetry contexts");
    let enqueued =
        db.enqueue(&Message::new("orders.created", "OrderCreated", b"{}".to_vec())).instrument(request).await?;

    // The consumer.
    let stop = CancellationToken::new();
    let sub = tokio::spawn(Subscriber::new(SubscriberConfig::new(endpoint.clone(), "billing")).run(
        |_d| async {
            tracing::info!("charging the card");
            Ok(())
        },
        stop.clone(),
    ));
    let spans = eventually("the handler span", WAIT, || async {
        let spans = spans_of(trace)?;
        Ok(spans.iter().any(|s| s.name == "outbox.handle").then_some(spans))
    })
    .await?;
    stop.cancel();
    sub.await??;

    let root = one(&spans, "checkout")?;
    let enqueue = one(&spans, "outbox.enqueue")?;
    let relay = one(&spans, "outboxd.relay")?;
    let deliver = one(&spans, "outboxd.deliver")?;
    let handle = one(&spans, "outbox.handle")?;
    assert_eq!(root.parent_span_id, SpanId::INVALID, "checkout is the root");
    assert_eq!(enqueue.parent_span_id, root.span_context.span_id(), "enqueue runs inside the request");
    assert_eq!(relay.parent_span_id, enqueue.span_context.span_id(), "the relay continues the producer's trace");
    assert_eq!(deliver.parent_span_id, enqueue.span_context.span_id(), "delivery continues the producer's trace");
    assert_eq!(handle.parent_span_id, deliver.span_context.span_id(), "the handler is a child of the delivery");
    assert!(handle.parent_span_is_remote, "the handler's parent came over the wire");

    // What is stored is the producer's context, in the W3C format.
    let stored = stored_message(&mut admin, enqueued.message_id).await?;
    let expected = format!("00-{}-{}-01", trace, enqueue.span_context.span_id());
    assert_eq!(stored.headers.get("traceparent"), Some(&expected));

    app.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producer_to_consumer_is_one_trace_on_postgres() -> Result<()> {
    producer_to_consumer_is_one_trace(Backend::Postgres).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producer_to_consumer_is_one_trace_on_sqlite() -> Result<()> {
    producer_to_consumer_is_one_trace(Backend::Sqlite).await
}

/// A producer that sets `traceparent` itself keeps it: outboxd continues that trace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_explicit_traceparent_is_kept() -> Result<()> {
    exporter();
    let store = TestStore::create(Backend::Sqlite).await?;
    let mut config = ServeConfig::new(store.url());
    config.listen = SocketAddr::from(([127, 0, 0, 1], 0));
    let app = App::build(config, Arc::new(SystemClock)).await?;
    let mut admin = outbox_client::grpc::admin(&format!("http://{}", app.local_addr())).await?;
    let db = Db::connect(store.url()).await?;
    let theirs = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let msg = Message::new("orders.created", "OrderCreated", b"{}".to_vec()).header("traceparent", theirs);
    let enqueued = db.enqueue(&msg).instrument(tracing::info_span!("other")).await?;
    let stored = stored_message(&mut admin, enqueued.message_id).await?;
    assert_eq!(stored.headers.get("traceparent").map(String::as_str), Some(theirs));
    app.shutdown().await;
    Ok(())
}
