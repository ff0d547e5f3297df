//! Managed replays: their list and each one's progress.
use std::sync::Arc;

use axum::extract::{Path, State as Ctx};
use tonic::Status;

use super::{Page, html};
use crate::console::State;
use crate::console::viewer::{Refusal, Viewer};
use crate::console::views::{self};
use crate::grpc::auth::Need;

pub(super) async fn replays(Ctx(state): Ctx<Arc<State>>, viewer: Viewer) -> Page {
    viewer.caller.check(Need::AdminRead)?;
    Ok(html(views::replays(&viewer, &state.admin.replayer.jobs().list())))
}

fn job(state: &State, viewer: &Viewer, id: &str) -> Result<crate::maintenance::replay::ReplayJob, Refusal> {
    viewer.caller.check(Need::AdminRead)?;
    id.parse::<u64>()
        .ok()
        .and_then(|id| state.admin.replayer.jobs().get(id))
        .ok_or_else(|| Refusal::Status(Status::not_found(format!("no replay {id:?} on this process"))))
}

pub(super) async fn replay_job(Ctx(state): Ctx<Arc<State>>, viewer: Viewer, Path(id): Path<String>) -> Page {
    let j = job(&state, &viewer, &id)?;
    Ok(html(views::job(&viewer, &j)))
}

pub(super) async fn replay_job_fragment(Ctx(state): Ctx<Arc<State>>, viewer: Viewer, Path(id): Path<String>) -> Page {
    let j = job(&state, &viewer, &id)?;
    Ok(html(views::job_progress(&j)))
}
