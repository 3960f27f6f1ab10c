//! The REST routes of commitments (GET /commitments, GET /commitments/:id, POST /commitments/:id/close), each a thin translation onto an `AgentService` call.

use super::state::{body, path_mismatch, reply, AppState, Query};
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
        .route("/commitments", get(list))
        .route("/commitments/{id}", get(detail))
        .route("/commitments/{id}/close", post(close))
}

async fn list(State(st): State<AppState>, q: Query) -> Response {
    let all = match q.get("all").map(String::as_str) {
        None | Some("false") => false,
        Some("true") => true,
        Some(_) => {
            return json_error(
                StatusCode::BAD_REQUEST,
                "invalid_argument",
                "all must be true or false",
            )
        }
    };
    let req = pb::ListCommitmentsRequest { all };
    reply(StatusCode::OK, st.api.list_commitments(Request::new(req)).await)
}

async fn detail(State(st): State<AppState>, Path(id): Path<String>) -> Response {
    let req = pb::GetCommitmentRequest { id };
    reply(StatusCode::OK, st.api.get_commitment(Request::new(req)).await)
}

async fn close(State(st): State<AppState>, Path(id): Path<String>, b: Body) -> Response {
    let mut req: pb::CloseCommitmentRequest = match body(&st, b).await {
        Ok(r) => r,
        Err(e) => return e,
    };
    if let Some(e) = path_mismatch("id", &id, &mut req.id) {
        return e;
    }
    reply(StatusCode::OK, st.api.close_commitment(Request::new(req)).await)
}
