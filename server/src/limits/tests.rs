use std::sync::Arc;

use tonic::Status;
use tower::{Layer as _, ServiceExt as _};

use super::*;

#[test]
fn bytes_that_come_back_after_a_refusal_are_announced_and_no_others() {
    let budget = ByteBudget::new(250);
    let mut returned = budget.returned();
    assert_eq!(budget.take_units(2, 100), 2);
    budget.give(100);
    assert!(!returned.has_changed().unwrap(), "no one was refused: a give says nothing");
    assert_eq!(budget.take_units(3, 100), 1, "150 free: one unit");
    assert!(!returned.has_changed().unwrap(), "nothing came back yet");
    budget.give(100);
    assert!(returned.has_changed().unwrap(), "a refused taker is told");
    returned.borrow_and_update();
    budget.give(100);
    assert!(!returned.has_changed().unwrap(), "once per refusal");
    assert_eq!(budget.available(), 250);
    // A refusal while too little is free announces nothing; the next give does. (A give
    // that races with a refusal, between its take and its flag, is announced by the
    // refusal itself, which looks at what is free once more: `take_units`.)
    assert_eq!(budget.take_units(1, 300), 0);
    assert!(!returned.has_changed().unwrap(), "250 free is no unit of 300");
    assert_eq!(budget.take_units(5, 50), 5);
    assert_eq!(budget.take_units(1, 50), 0);
    budget.give(50);
    assert!(returned.has_changed().unwrap());
}

#[test]
fn a_principals_streams_are_bounded_apart_from_the_process_and_given_back() {
    let limits = Limits { max_streams_per_principal: 2, ..Limits::DEFAULT };
    let l = StreamLimiter::new(limits);
    let (a, b) = (QuotaKey("a".into()), QuotaKey("b".into()));
    let first = l.acquire_principal(Some(&a)).unwrap();
    let _second = l.acquire_principal(Some(&a)).unwrap();
    let err = l.acquire_principal(Some(&a)).unwrap_err();
    assert_eq!(err.code(), tonic::Code::ResourceExhausted);
    assert!(err.message().contains("--max-streams-per-principal") && err.message().contains("\"a\""), "{err:?}");
    assert!(l.acquire_principal(Some(&b)).is_ok(), "another principal is not affected");
    assert_eq!(l.open(), 0, "waiting streams take no place of the process");
    drop(first);
    assert!(l.acquire_principal(Some(&a)).is_ok(), "given back when dropped");
    let unrestricted: Vec<_> = (0..10).map(|_| l.acquire_principal(None).unwrap()).collect();
    assert_eq!(unrestricted.len(), 10, "no auth file: no per-principal quota");
    let shared = unrestricted.iter().map(|p| p.in_flight_bytes().expect("a byte budget without an auth file"));
    assert!(shared.clone().all(|b| Arc::ptr_eq(&b, &unrestricted[0].in_flight_bytes().unwrap())), "one budget");
    assert_eq!(shared.map(|b| b.limit()).max(), Some(Limits::DEFAULT.max_in_flight_bytes_per_principal));
}

fn peer(port: u16) -> Option<SocketAddr> {
    Some(SocketAddr::from(([127, 0, 0, 1], port)))
}

#[test]
fn streams_are_counted_per_connection_and_per_process_and_given_back() {
    let limiter = StreamLimiter::new(Limits { max_streams: 3, max_streams_per_connection: 2, ..Limits::DEFAULT });
    let a1 = limiter.acquire(peer(1)).unwrap();
    let _a2 = limiter.acquire(peer(1)).unwrap();
    let e = limiter.acquire(peer(1)).unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted);
    assert!(e.message().contains("--max-streams-per-connection") && e.message().contains("2"), "{e:?}");
    let _b1 = limiter.acquire(peer(2)).unwrap();
    let e = limiter.acquire(peer(3)).unwrap_err();
    assert!(e.message().contains("(--max-streams)") && e.message().contains("3"), "{e:?}");
    assert_eq!(limiter.open(), 3);
    drop(a1);
    assert_eq!(limiter.open(), 2);
    let _c1 = limiter.acquire(peer(3)).unwrap();
    let _a3 = limiter.acquire(None).unwrap_err();
}

#[test]
fn only_outboxd_unary_calls_are_shed() {
    assert!(is_limited_unary("/outbox.v1.Outbox/Enqueue"));
    assert!(is_limited_unary("/outbox.v1.OutboxAdmin/GetStats"));
    assert!(!is_limited_unary("/outbox.v1.Outbox/Subscribe"));
    assert!(!is_limited_unary("/outbox.v1.OutboxAdmin/Tail"));
    assert!(!is_limited_unary("/outbox.v1.OutboxAdmin/ReplayStream"));
    assert!(!is_limited_unary("/grpc.health.v1.Health/Check"));
    assert!(!is_limited_unary("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"));
}

/// A call in progress holds its place until it is answered; the next one is refused at once
/// with UNAVAILABLE naming the flag; streams pass while the limit is reached.
#[tokio::test]
async fn unary_calls_beyond_the_limit_are_shed_and_streams_pass() {
    let (release, released) = tokio::sync::watch::channel(false);
    let inner = tower::service_fn(move |req: http::Request<()>| {
        let mut released = released.clone();
        async move {
            if req.uri().path().ends_with("/Slow") {
                let _ = released.wait_for(|r| *r).await;
            }
            Ok::<_, std::convert::Infallible>(req.uri().path().to_owned())
        }
    });
    let svc = UnaryLimitLayer::new(1, 1).layer(inner);
    let call = |path: &str| {
        let req = http::Request::builder().uri(path).body(()).unwrap();
        svc.clone().oneshot(req)
    };
    let slow = tokio::spawn(call("/outbox.v1.OutboxAdmin/Slow"));
    // The slow call holds the only place once it is in progress.
    let mut shed = None;
    for _ in 0..1000 {
        match call("/outbox.v1.Outbox/Enqueue").await {
            Err(e) => {
                shed = Some(e);
                break;
            }
            Ok(_) => tokio::task::yield_now().await,
        }
    }
    let shed = shed.expect("no call was shed while the slow one was in progress");
    let status = shed.downcast::<Status>().unwrap();
    assert_eq!(status.code(), tonic::Code::Unavailable);
    assert!(status.message().contains("limit of 1") && status.message().contains("--max-concurrent-requests"));
    assert!(call("/outbox.v1.Outbox/Subscribe").await.is_ok());
    assert!(call("/grpc.health.v1.Health/Check").await.is_ok());
    release.send_replace(true);
    assert_eq!(slow.await.unwrap().unwrap(), "/outbox.v1.OutboxAdmin/Slow");
    assert!(call("/outbox.v1.Outbox/Enqueue").await.is_ok(), "the place was not given back");
}

#[test]
fn flags_are_validated_and_size_http2() {
    assert!(Limits::DEFAULT.validate().is_ok());
    let e = Limits { max_streams: 0, ..Limits::DEFAULT }.validate().unwrap_err();
    assert!(e.contains("--max-streams"), "{e}");
    let e = Limits { request_body_timeout: Duration::ZERO, ..Limits::DEFAULT }.validate().unwrap_err();
    assert!(e.contains("--request-body-timeout"), "{e}");
    let e = Limits { max_requests_per_principal: 0, ..Limits::DEFAULT }.validate().unwrap_err();
    assert!(e.contains("--max-requests-per-principal"), "{e}");
    assert_eq!(Limits::DEFAULT.http2_max_concurrent_streams(), 356);
}
