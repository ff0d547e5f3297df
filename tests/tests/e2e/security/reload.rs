//! The auth file reloaded on change and on SIGHUP.
use std::time::Duration;

use anyhow::Result;
use outbox_client::grpc::admin_with;
use outbox_proto::v1 as pb;
use outbox_tests::{Backend, TestStore, eventually};
use tonic::Code;

use super::{Scratch, auth_file, code, s, start, tok};
use crate::WAIT;

#[tokio::test]
async fn the_auth_file_is_reloaded_on_change_and_a_bad_one_keeps_the_previous() -> Result<()> {
    let store = TestStore::create(Backend::Sqlite).await?;
    let scratch = Scratch::new()?;
    let file = scratch.write("auth.toml", &auth_file(&[("alpha", &["admin:read"])]))?;
    let srv = start(&store, &["--auth-file", s(&file), "--reload-interval", "100ms"]).await?;
    let list = |name: &'static str| {
        let endpoint = srv.endpoint.clone();
        async move {
            code(admin_with(&endpoint, &tok(name)).await.unwrap().list_consumers(pb::ListConsumersRequest {}).await)
        }
    };
    assert_eq!(list("alpha").await, Code::Ok);
    assert_eq!(list("beta").await, Code::Unauthenticated);

    // alpha leaves, beta comes.
    scratch.write("auth.toml", &auth_file(&[("beta", &["admin:read"])]))?;
    eventually("beta known, alpha gone", WAIT, || async {
        Ok((list("beta").await == Code::Ok && list("alpha").await == Code::Unauthenticated).then_some(()))
    })
    .await?;

    // A file that does not parse: logged, and beta still gets in.
    scratch.write("auth.toml", "[[principal]]\nname = \"gamma\"\ntokens = [\"not-a-hash\"]\n")?;
    eventually("the bad file logged", WAIT, || async {
        Ok((!srv.log_lines(&["auth file does not parse", "tokens[0]"]).is_empty()).then_some(()))
    })
    .await?;
    assert_eq!(list("beta").await, Code::Ok);
    assert!(srv.log_lines(&["not-a-hash"]).is_empty(), "the log repeats no token entry");

    // Permissions change with the file too.
    scratch.write("auth.toml", &auth_file(&[("beta", &["admin:write"])]))?;
    eventually("beta may no longer read", WAIT, || async {
        Ok((list("beta").await == Code::PermissionDenied).then_some(()))
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn sighup_rereads_the_auth_file() -> Result<()> {
    let store = TestStore::create(Backend::Sqlite).await?;
    let scratch = Scratch::new()?;
    let file = scratch.write("auth.toml", &auth_file(&[("alpha", &["admin:read"])]))?;
    // No timely poll: only the signal makes it look.
    let srv = start(&store, &["--auth-file", s(&file), "--reload-interval", "1h"]).await?;
    scratch.write("auth.toml", &auth_file(&[("beta", &["admin:read"])]))?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let list = |name: &'static str| {
        let endpoint = srv.endpoint.clone();
        async move {
            code(admin_with(&endpoint, &tok(name)).await.unwrap().list_consumers(pb::ListConsumersRequest {}).await)
        }
    };
    assert_eq!(list("beta").await, Code::Unauthenticated, "not re-read without a signal");
    let ok = std::process::Command::new("kill").args(["-HUP", &srv.pid().to_string()]).status()?;
    assert!(ok.success());
    eventually("beta known after SIGHUP", WAIT, || async { Ok((list("beta").await == Code::Ok).then_some(())) })
        .await?;
    Ok(())
}
