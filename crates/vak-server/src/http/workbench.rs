//! The REST routes of a session's children and surroundings (workers, best-of-N, dev servers, the PR view), each a thin translation onto an `AgentService` call.

use super::state::{body, for_session, path_mismatch, reply, AppState, Query};
use crate::errors::json_error;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;
use pb::agent_service_server::AgentService;
use tonic::Request;
use vak_proto::v1 as pb;

pub(super) fn routes() -> Router<AppState> {
    Router::new()
        .route("/sessions/{id}/workers", get(list_workers))
        .route("/sessions/{id}/workers/{child}/steer", post(steer_worker))
        .route("/sessions/{id}/workers/{child}/stop", post(stop_worker))
        .route("/sessions/{id}/bestofn", post(start_bestofn))
        .route("/sessions/{id}/keep", post(keep))
        .route("/sessions/{id}/discard", post(discard))
        .route("/sessions/{id}/launch", get(list_launch))
        .route("/sessions/{id}/launch/start", post(start_launch))
        .route("/sessions/{id}/launch/stop", post(stop_launch))
        .route("/sessions/{id}/launch/logs", get(launch_logs))
        .route("/sessions/{id}/pr", get(get_pr))
        .route("/sessions/{id}/pr/merge", post(merge_pr))
}

async fn list_workers(State(st): State<AppState>, Path(id): Path<String>) -> Response {
    let req = pb::ListWorkersRequest { session_id: id };
    reply(StatusCode::OK, st.api.list_workers(Request::new(req)).await)
}

/// A body for the child the path names, of the session the path names.
async fn for_child<M: prost::Message + prost::Name + Default>(
    st: &AppState,
    (id, child): (String, String),
    b: Body,
    fields: fn(&mut M) -> (&mut String, &mut String),
) -> Result<M, Response> {
    let mut req: M = body(st, b).await?;
    let (session, child_id) = fields(&mut req);
    if let Some(e) = path_mismatch("session_id", &id, session) {
        return Err(e);
    }
    if let Some(e) = path_mismatch("child_id", &child, child_id) {
        return Err(e);
    }
    Ok(req)
}

async fn steer_worker(State(st): State<AppState>, Path(p): Path<(String, String)>, b: Body) -> Response {
    match for_child(&st, p, b, |r: &mut pb::SteerWorkerRequest| {
        (&mut r.session_id, &mut r.child_id)
    })
    .await
    {
        Ok(req) => reply(StatusCode::OK, st.api.steer_worker(Request::new(req)).await),
        Err(e) => e,
    }
}

async fn stop_worker(State(st): State<AppState>, Path(p): Path<(String, String)>, b: Body) -> Response {
    match for_child(&st, p, b, |r: &mut pb::StopWorkerRequest| {
        (&mut r.session_id, &mut r.child_id)
    })
    .await
    {
        Ok(req) => reply(StatusCode::OK, st.api.stop_worker(Request::new(req)).await),
        Err(e) => e,
    }
}

async fn start_bestofn(State(st): State<AppState>, Path(id): Path<String>, b: Body) -> Response {
    match for_session(&st, &id, b, |r: &mut pb::StartBestOfNRequest| &mut r.session_id).await {
        Ok(req) => reply(
            StatusCode::ACCEPTED,
            st.api.start_best_of_n(Request::new(req)).await,
        ),
        Err(e) => e,
    }
}

async fn keep(State(st): State<AppState>, Path(id): Path<String>, b: Body) -> Response {
    match for_session(&st, &id, b, |r: &mut pb::KeepCandidateRequest| &mut r.session_id).await {
        Ok(req) => reply(StatusCode::OK, st.api.keep_candidate(Request::new(req)).await),
        Err(e) => e,
    }
}

async fn discard(State(st): State<AppState>, Path(id): Path<String>, b: Body) -> Response {
    match for_session(&st, &id, b, |r: &mut pb::DiscardCandidateRequest| {
        &mut r.session_id
    })
    .await
    {
        Ok(req) => reply(StatusCode::OK, st.api.discard_candidate(Request::new(req)).await),
        Err(e) => e,
    }
}

async fn list_launch(State(st): State<AppState>, Path(id): Path<String>) -> Response {
    let req = pb::ListLaunchRequest { session_id: id };
    reply(StatusCode::OK, st.api.list_launch(Request::new(req)).await)
}

async fn start_launch(State(st): State<AppState>, Path(id): Path<String>, b: Body) -> Response {
    match for_session(&st, &id, b, |r: &mut pb::StartLaunchRequest| &mut r.session_id).await {
        Ok(req) => reply(StatusCode::OK, st.api.start_launch(Request::new(req)).await),
        Err(e) => e,
    }
}

async fn stop_launch(State(st): State<AppState>, Path(id): Path<String>, b: Body) -> Response {
    match for_session(&st, &id, b, |r: &mut pb::StopLaunchRequest| &mut r.session_id).await {
        Ok(req) => reply(StatusCode::OK, st.api.stop_launch(Request::new(req)).await),
        Err(e) => e,
    }
}

/// `?name=` (required) and `?tail=` (a whole number; absent: all the ring holds).
async fn launch_logs(State(st): State<AppState>, Path(id): Path<String>, q: Query) -> Response {
    let tail = match q.get("tail").map(|t| t.parse::<u32>()) {
        None => 0,
        Some(Ok(n)) => n,
        Some(Err(_)) => {
            return json_error(
                StatusCode::BAD_REQUEST,
                "invalid_argument",
                "tail must be a whole number of lines",
            )
        }
    };
    let req = pb::GetLaunchLogsRequest {
        session_id: id,
        name: q.get("name").cloned().unwrap_or_default(),
        tail,
    };
    reply(StatusCode::OK, st.api.get_launch_logs(Request::new(req)).await)
}

async fn get_pr(State(st): State<AppState>, Path(id): Path<String>) -> Response {
    let req = pb::GetPrRequest { session_id: id };
    reply(StatusCode::OK, st.api.get_pr(Request::new(req)).await)
}

async fn merge_pr(State(st): State<AppState>, Path(id): Path<String>, b: Body) -> Response {
    match for_session(&st, &id, b, |r: &mut pb::MergePrRequest| &mut r.session_id).await {
        Ok(req) => reply(StatusCode::OK, st.api.merge_pr(Request::new(req)).await),
        Err(e) => e,
    }
}
