use std::sync::Arc;

use sha2::{Digest as _, Sha256};

use super::identity::{cert_identities, shown_identity, subject_key};
use super::*;
use crate::domain::TopicPattern;

fn pat(s: &str) -> TopicPattern {
    TopicPattern::parse("t", s).unwrap()
}

#[test]
fn globs_match_runs_of_characters() {
    let g = |p: &str, s: &str| NameGlob(p.into()).matches(s);
    assert!(g("inventory-*", "inventory-eu"));
    assert!(g("inventory-*", "inventory-"));
    assert!(!g("inventory-*", "inventory"));
    assert!(g("*", "anything"));
    assert!(g("a*b*c", "aXXbYYc"));
    assert!(!g("a*b*c", "aXXbYY"));
    assert!(g("billing", "billing"));
    assert!(!g("billing", "billing2"));
    assert!(g("*-eu", "x-eu"));
}

#[test]
fn a_tail_permission_covers_only_patterns_whose_topics_it_matches() {
    let c = |mine: &str, theirs: &str| pat(mine).covers(&pat(theirs));
    assert!(c(">", ">"));
    assert!(c(">", "orders.*"));
    assert!(c("orders.>", "orders.>"));
    assert!(c("orders.>", "orders.eu.*"));
    assert!(c("orders.>", "orders.created"));
    assert!(!c("orders.>", "orders"));
    assert!(!c("orders.>", ">"));
    assert!(c("orders.*", "orders.created"));
    assert!(c("orders.*", "orders.*"));
    assert!(!c("orders.*", "orders.>"));
    assert!(!c("orders.*", "orders.a.b"));
    assert!(!c("orders.created", "orders.*"));
    assert!(c("*.created", "orders.created"));
    assert!(!c("*", "*.x"));
}

#[test]
fn permissions_parse_and_reject_what_they_do_not_know() {
    assert_eq!(Permission::parse("*"), Ok(Permission::All));
    assert_eq!(Permission::parse("admin:read"), Ok(Permission::AdminRead));
    assert_eq!(Permission::parse("produce:orders.>"), Ok(Permission::Produce(pat("orders.>"))));
    assert!(Permission::parse("admin").is_err());
    assert!(Permission::parse("admin:*").is_err());
    assert!(Permission::parse("produce:orders.>.x").is_err());
    assert!(Permission::parse("consume:").is_err());
    assert!(Permission::parse("consume:a b").is_err());
    assert!(Permission::parse("delete:x").is_err());
}

const FILE: &str = r#"
[[principal]]
name = "orders-service"
tokens = ["sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"]
permissions = ["produce:orders.>", "consume:billing", "admin:read"]

[[principal]]
name = "inventory"
subjects = ["CN=inventory", "spiffe://example.org/inventory"]
permissions = ["consume:inventory-*"]
"#;

#[test]
fn the_issue_example_parses_and_its_token_is_the_hash_of_test() {
    let t = AuthTable::parse(FILE).unwrap();
    assert_eq!(t.principals, 2);
    assert_eq!(token_hash_line("test"), "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08");
    let hash: [u8; 32] = Sha256::digest(b"test").into();
    let p = &t.by_token[&hash];
    assert_eq!(p.name, "orders-service");
    assert!(p.allows(&Need::Produce("orders.eu.created")));
    assert!(!p.allows(&Need::Produce("payments.created")));
    assert!(p.allows(&Need::AdminRead));
    assert!(!p.allows(&Need::AdminWrite));
    assert!(p.allows(&Need::Consume("billing")));
    assert!(!p.allows(&Need::Consume("billing-2")));
    let inv = &t.by_subject["uri:spiffe://example.org/inventory"];
    assert!(inv.allows(&Need::Consume("inventory-eu")));
    assert!(!inv.allows(&Need::Replay("inventory-eu")));
}

#[test]
fn identities_have_kinds_so_that_one_kind_cannot_pose_as_another() {
    assert_eq!(subject_key("CN=admincn").as_deref(), Some("cn:admincn"));
    assert_eq!(subject_key("cn:admincn").as_deref(), Some("cn:admincn"));
    assert_eq!(subject_key("spiffe://example.org/a").as_deref(), Some("uri:spiffe://example.org/a"));
    assert_eq!(subject_key("uri:urn:x").as_deref(), Some("uri:urn:x"));
    assert_eq!(subject_key("dns:billing.svc").as_deref(), Some("dns:billing.svc"));
    for bad in ["CN=", "admincn", "=x:y", ":x", "dns:", "1a:b"] {
        assert_eq!(subject_key(bad), None, "{bad}");
    }
    // A certificate whose SAN URI reads "CN=admincn" (its CN is someone else).
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.distinguished_name.push(rcgen::DnType::CommonName, "someone");
    params.subject_alt_names = vec![
        rcgen::SanType::URI("CN=admincn".try_into().unwrap()),
        rcgen::SanType::DnsName("a.svc".try_into().unwrap()),
    ];
    let cert = params.self_signed(&key).unwrap();
    let ids = cert_identities(cert.der());
    assert_eq!(ids, ["uri:CN=admincn", "dns:a.svc", "cn:someone"]);
    let table =
        AuthTable::parse("[[principal]]\nname = \"admin\"\nsubjects = [\"CN=admincn\"]\npermissions = [\"*\"]\n")
            .unwrap();
    assert!(ids.iter().all(|id| !table.by_subject.contains_key(id)), "the SAN URI does not pose as the CN");
    assert_eq!(shown_identity("cn:someone"), "CN=someone");
    assert_eq!(shown_identity("uri:spiffe://x/y"), "spiffe://x/y");
}

#[test]
fn bad_files_say_what_is_wrong_without_repeating_tokens() {
    let err = |s: &str| AuthTable::parse(s).unwrap_err();
    assert!(err("[[principal]]\nname = \"a\"\ntokens = [\"sha256:ABC\"]\n").contains("tokens[0]"));
    assert!(err("[[principal]]\nname = \"a\"\ntokens = [\"secret\"]\n").contains("tokens[0]"));
    assert!(!err("[[principal]]\nname = \"a\"\ntokens = [\"secret\"]\n").contains("secret"));
    assert!(
        err("[[principal]]\nname = \"a\"\nsubjects = [\"CN=a\"]\npermissions = [\"root\"]\n")
            .contains("permissions[0]")
    );
    assert!(err("[[principal]]\nname = \"a\"\npermissions = [\"*\"]\n").contains("neither tokens nor subjects"));
    assert!(err("[[principal]]\nname = \"a\"\nsubjects = [\"CN=a\"]\npermission = [\"*\"]\n").contains("permission"));
    let dup = format!("{FILE}\n[[principal]]\nname = \"x\"\nsubjects = [\"CN=inventory\"]\n");
    assert!(err(&dup).contains("also a subject of \"inventory\""));
    assert!(err("[principal]\nname = 1").len() > 5);
    // A syntax error names the line, never its text (a raw token pasted by mistake).
    let e = err("[[principal]]\nname = \"a\"\ntokens = [\"tok-very-secret\"\npermissions = [\"*\"]\n");
    assert!(!e.contains("very-secret"), "{e}");
    assert!(e.contains("line"), "{e}");
    let e = err("[[principal]]\nname = \"a\"\ntokens = \"tok-very-secret\"\n");
    assert!(!e.contains("very-secret"), "{e}");
}

#[test]
fn a_caller_is_refused_a_method_from_its_kind_alone_when_it_holds_no_permission_of_it() {
    let caller = |perms: &[&str]| Caller {
        name: "p".into(),
        principal: Some(Arc::new(Principal {
            name: "p".into(),
            permissions: perms.iter().map(|s| Permission::parse(s).unwrap()).collect(),
        })),
        credential: None,
    };
    let nobody = caller(&[]);
    for kind in [Kind::Produce, Kind::Consume, Kind::Tail, Kind::Replay] {
        let err = nobody.check_kind(kind).unwrap_err();
        assert_eq!(err.code(), tonic::Code::PermissionDenied);
        assert!(err.message().contains(kind.written()), "{err:?}");
        assert!(caller(&["*"]).check_kind(kind).is_ok());
    }
    let producer = caller(&["produce:orders.>", "admin:read"]);
    assert!(producer.check_kind(Kind::Produce).is_ok(), "any topic of the kind passes the layer");
    assert!(producer.check_kind(Kind::Consume).is_err());
    assert!(caller(&["sink:to-*"]).check_kind(Kind::Tail).is_err(), "sink: is not tail:");
    assert!(Caller::unrestricted("anonymous").check_kind(Kind::Replay).is_ok());
    assert_eq!(route("/outbox.v1.Outbox/Enqueue"), Route::ByService(Kind::Produce));
    assert_eq!(route("/outbox.v1.Outbox/Subscribe"), Route::ByService(Kind::Consume));
    assert_eq!(route("/outbox.v1.OutboxAdmin/Tail"), Route::ByService(Kind::Tail));
    assert_eq!(route("/outbox.v1.OutboxAdmin/ReplayStream"), Route::ByService(Kind::Replay));
    assert_eq!(route("/outbox.v1.OutboxAdmin/ReleaseKey"), Route::ByService(Kind::Replay));
    assert_eq!(route("/outbox.v1.OutboxAdmin/ListHeldKeys"), Route::Checked(Need::AdminRead));
}

#[test]
fn a_sink_permission_names_consumers_and_allows_nothing_else() {
    let p = Permission::parse("sink:to-*").unwrap();
    assert_eq!(p, Permission::Sink(NameGlob("to-*".into())));
    assert!(p.allows(&Need::Sink("to-partner")));
    assert!(!p.allows(&Need::Sink("exfil")));
    assert!(!p.allows(&Need::AdminWrite));
    assert!(!p.allows(&Need::Consume("to-partner")));
    assert_eq!(Need::Sink("x").to_string(), "sink:x");
    assert!(Permission::parse("sink:").is_err());
}

#[test]
fn a_consumer_takes_its_creators_topics_and_is_deleted_by_its_creator_or_a_consumer() {
    use crate::domain::Consumer;
    let caller = |name: &str, perms: &[&str]| Caller {
        name: name.into(),
        principal: Some(Arc::new(Principal {
            name: name.into(),
            permissions: perms.iter().map(|s| Permission::parse(s).unwrap()).collect(),
        })),
        credential: None,
    };
    let spec = |name: &str, topics: &[&str]| crate::store::tests::spec(name, topics, 5);
    let made_by = |name: &str, by: Option<&str>| Consumer {
        spec: spec(name, &["payments.>"]),
        paused: false,
        start_seq: 0,
        created_at: chrono::Utc::now(),
        created_by: by.map(str::to_owned),
    };
    let team = caller("team", &["admin:write", "consume:team-*"]);
    let err = team.check_consumer(ConsumerChange::Create(&spec("team-x", &["payments.>"]))).unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied);
    assert!(err.message().contains("tail:payments.>"), "{err:?}");
    let orders = caller("orders", &["admin:write", "tail:orders.>"]);
    assert!(orders.check_consumer(ConsumerChange::Create(&spec("o", &["orders.*", "orders.eu.>"]))).is_ok());
    assert!(orders.check_consumer(ConsumerChange::Create(&spec("o", &["orders.*", ">"]))).is_err());

    let billing = made_by("billing", Some("payments"));
    let err = orders.check_consumer(ConsumerChange::Delete(&billing)).unwrap_err();
    assert!(err.message().contains("created by principal \"payments\""), "{err:?}");
    assert!(caller("payments", &["admin:write"]).check_consumer(ConsumerChange::Delete(&billing)).is_ok());
    assert!(caller("root", &["*"]).check_consumer(ConsumerChange::Delete(&billing)).is_ok());
    // consume: (a pattern above all) does not delete another's consumer: it would redirect
    // that application's stream.
    assert!(caller("app", &["consume:bill*"]).check_consumer(ConsumerChange::Delete(&billing)).is_err());
    assert!(caller("app", &["consume:billing"]).check_consumer(ConsumerChange::Delete(&billing)).is_err());
    let unowned = made_by("billing", None);
    assert!(
        caller("app", &["consume:bill*"]).check_consumer(ConsumerChange::Delete(&unowned)).is_err(),
        "a pattern does not delete a consumer without a creator"
    );
    assert!(
        caller("app", &["consume:billing"]).check_consumer(ConsumerChange::Delete(&made_by("billing", None))).is_ok()
    );
    assert!(caller("root", &["*"]).check_consumer(ConsumerChange::Delete(&made_by("x", None))).is_ok());
    assert!(orders.check_consumer(ConsumerChange::Delete(&made_by("billing", None))).is_err(), "no creator");
    let anyone = Caller::unrestricted("anonymous");
    assert!(anyone.check_consumer(ConsumerChange::Delete(&billing)).is_ok(), "no auth file");
    assert!(anyone.check_consumer(ConsumerChange::Create(&spec("x", &[">"]))).is_ok());
}

#[test]
fn every_method_of_both_services_has_a_route_and_none_is_open() {
    use prost::Message as _;
    let fds = prost_types::FileDescriptorSet::decode(outbox_proto::FILE_DESCRIPTOR_SET).unwrap();
    let mut n = 0;
    for file in fds.file {
        for svc in &file.service {
            for m in &svc.method {
                let path = format!("/{}.{}/{}", file.package(), svc.name(), m.name());
                let r = route(&path);
                assert!(
                    !matches!(r, Route::Open | Route::AnyCredential | Route::Checked(Need::Everything)),
                    "{path} is routed as {r:?}"
                );
                n += 1;
            }
        }
    }
    assert_eq!(n, 18, "methods of outbox.v1");
    assert_eq!(route("/outbox.v1.OutboxAdmin/Unknown"), Route::Checked(Need::Everything));
    assert_eq!(route("/grpc.health.v1.Health/Check"), Route::Open);
}
