//! The REST routes of learned skills (GET /skills, GET and POST /skills/proposals, POST /skills/proposals/:id/promote and /reject), each a thin translation onto an `AgentService` call.

use super::state::{body, body_at, reply, AppState, Query};
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
        .route("/skills", get(list))
        .route("/skills/proposals", get(proposals).post(propose))
        .route("/skills/proposals/{id}/promote", post(promote))
        .route("/skills/proposals/{id}/reject", post(reject))
}

async fn list(State(st): State<AppState>, q: Query) -> Response {
    let req = pb::ListSkillsRequest {
        session_id: q.get("session_id").cloned(),
    };
    reply(StatusCode::OK, st.api.list_skills(Request::new(req)).await)
}

async fn proposals(State(st): State<AppState>) -> Response {
    let req = pb::ListSkillProposalsRequest {};
    reply(
        StatusCode::OK,
        st.api.list_skill_proposals(Request::new(req)).await,
    )
}

async fn propose(State(st): State<AppState>, b: Body) -> Response {
    match body::<pb::CreateSkillProposalRequest>(&st, b).await {
        Ok(req) => reply(
            StatusCode::CREATED,
            st.api.create_skill_proposal(Request::new(req)).await,
        ),
        Err(e) => e,
    }
}

async fn promote(State(st): State<AppState>, Path(id): Path<String>, b: Body) -> Response {
    match body_at(&st, b, ("id", &id), |r: &mut pb::PromoteSkillProposalRequest| {
        &mut r.id
    })
    .await
    {
        Ok(req) => reply(
            StatusCode::OK,
            st.api.promote_skill_proposal(Request::new(req)).await,
        ),
        Err(e) => e,
    }
}

async fn reject(State(st): State<AppState>, Path(id): Path<String>, b: Body) -> Response {
    match body_at(&st, b, ("id", &id), |r: &mut pb::RejectSkillProposalRequest| {
        &mut r.id
    })
    .await
    {
        Ok(req) => reply(
            StatusCode::OK,
            st.api.reject_skill_proposal(Request::new(req)).await,
        ),
        Err(e) => e,
    }
}
