//! The real `outboxd` process exports its spans over OTLP/gRPC when the standard `OTEL_*`
//! variables ask for it, continuing the trace that a message's `traceparent` names. A small
//! OTLP collector in the test receives them.
use std::sync::{Arc, Mutex};

use anyhow::Result;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::trace::v1::Span;
use outbox_tests::{Backend, Db, Outboxd, RawStream, TestStore, consumer, create_consumer, eventually, outboxd_path};
use tokio_stream::wrappers::TcpListenerStream;

use crate::WAIT;

#[derive(Default, Clone)]
struct Collector {
    spans: Arc<Mutex<Vec<(String, Span)>>>,
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.spans.lock().unwrap();
        for rs in request.into_inner().resource_spans {
            let service = rs
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|a| a.key == "service.name")
                .and_then(|a| a.value.as_ref())
                .map(|v| format!("{:?}", v.value))
                .unwrap_or_default();
            for ss in rs.scope_spans {
                spans.extend(ss.spans.into_iter().map(|s| (service.clone(), s)));
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse { partial_success: None }))
    }
}

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PRODUCER_SPAN: &str = "00f067aa0ba902b7";

#[tokio::test]
async fn outboxd_exports_relay_and_delivery_spans_that_continue_the_producers_trace() -> Result<()> {
    let collector = Collector::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(collector.clone()))
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );

    let store = TestStore::create(Backend::Postgres).await?;
    let endpoint = format!("http://{addr}");
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ("OTEL_SERVICE_NAME", "outboxd-under-test"),
    ];
    let args: Vec<&str> = outbox_tests::FAST.to_vec();
    let srv = Outboxd::start_with_env(&outboxd_path(), store.url(), &args, &env).await?;
    let mut admin = srv.admin().await?;
    create_consumer(&mut admin, consumer("billing", &["orders.*"])).await?;
    let db = Db::connect(store.url()).await?;
    let traceparent = format!("00-{TRACE_ID}-{PRODUCER_SPAN}-01");
    let msg = outbox_client::Message::new("orders.created", "OrderCreated", b"{}".to_vec())
        .header("traceparent", traceparent.clone());
    db.enqueue(&msg).await?;

    // The delivery carries outboxd's span as the parent for the consumer.
    let mut stream = RawStream::open(&srv.endpoint, "billing", 10).await?;
    let d = stream.take(1, WAIT).await?.remove(0);
    let delivered = d.headers.get("traceparent").cloned().unwrap_or_default();
    assert!(delivered.starts_with(&format!("00-{TRACE_ID}-")), "same trace: {delivered}");
    assert_ne!(delivered, traceparent, "the consumer's parent is outboxd's delivery span");
    stream.ack(&[&d.message_id]).await;

    let trace_id = hex(TRACE_ID);
    let spans = eventually("relay and delivery spans at the collector", WAIT, || async {
        let spans: Vec<(String, Span)> =
            collector.spans.lock().unwrap().iter().filter(|(_, s)| s.trace_id == trace_id).cloned().collect();
        let names: Vec<&str> = spans.iter().map(|(_, s)| s.name.as_str()).collect();
        Ok((names.contains(&"outboxd.relay") && names.contains(&"outboxd.deliver")).then_some(spans))
    })
    .await?;
    for (service, span) in &spans {
        assert_eq!(span.parent_span_id, hex(PRODUCER_SPAN), "{} is a child of the producer's span", span.name);
        assert!(service.contains("outboxd-under-test"), "OTEL_SERVICE_NAME names the service: {service}");
    }
    let deliver = spans.iter().find(|(_, s)| s.name == "outboxd.deliver").unwrap();
    let deliver_id: String = deliver.1.span_id.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(delivered, format!("00-{TRACE_ID}-{deliver_id}-01"));

    assert!(srv.terminate(WAIT).await?, "outboxd stops cleanly with export on");
    server.abort();
    Ok(())
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}
