//! The REST routes of commitments (GET /commitments, GET /commitments/:id, POST /commitments/:id/close) and intent (GET /intent/explain, GET /intent/policy), each a thin translation onto an `AgentService` call.

use super::state::{body_at, reply, AppState, Query};
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
        .route("/intent/explain", get(explain))
        .route("/intent/policy", get(policy))
}

/// A query value as an enum's JSON name; else why not, naming the parameter and the names it takes.
fn named<T>(q: &Query, key: &str, parse: fn(&str) -> Option<T>, names: &str) -> Result<Option<T>, String> {
    match q.get(key) {
        None => Ok(None),
        Some(v) => parse(v)
            .map(Some)
            .ok_or_else(|| format!("{key} {v:?} is not one of {names}")),
    }
}

/// GET /intent/explain's query as the RPC's request; else why not.
fn explain_request(q: &Query) -> Result<pb::ExplainIntentRequest, String> {
    let surface = named(
        q,
        "surface",
        pb::IntentSurface::from_json_name,
        "api, app, term, ide, task",
    )?;
    let act = named(
        q,
        "act",
        pb::Act::from_json_name,
        "ask, change, run, plan, review",
    )?;
    let horizon = named(
        q,
        "horizon",
        pb::Horizon::from_json_name,
        "now, session, scheduled",
    )?;
    let stakes = named(q, "stakes", pb::Stakes::from_json_name, "low, medium, high")?;
    // `evidence=` (empty) is "none"; absent is "read it from the prompt".
    let evidence = match q.get("evidence") {
        None => None,
        Some(list) => Some(pb::EvidenceKinds {
            kinds: list
                .split(',')
                .map(str::trim)
                .filter(|k| !k.is_empty())
                .map(|k| {
                    pb::RequirementKind::from_json_name(k)
                        .filter(|k| *k != pb::RequirementKind::Unspecified)
                        .map(|k| k as i32)
                        .ok_or_else(|| {
                            format!("evidence {k:?} is not one of tool_ok, file_changed, approval")
                        })
                })
                .collect::<Result<Vec<_>, String>>()?,
        }),
    };
    Ok(pb::ExplainIntentRequest {
        prompt: q.get("prompt").cloned().unwrap_or_default(),
        surface: surface.map_or(0, |s| s as i32),
        act: act.map_or(0, |a| a as i32),
        horizon: horizon.map_or(0, |h| h as i32),
        stakes: stakes.map_or(0, |s| s as i32),
        evidence,
    })
}

async fn explain(State(st): State<AppState>, q: Query) -> Response {
    match explain_request(&q) {
        Ok(req) => reply(StatusCode::OK, st.api.explain_intent(Request::new(req)).await),
        Err(why) => json_error(StatusCode::BAD_REQUEST, "invalid_argument", &why),
    }
}

async fn policy(State(st): State<AppState>) -> Response {
    reply(
        StatusCode::OK,
        st.api
            .get_intent_policy(Request::new(pb::GetIntentPolicyRequest {}))
            .await,
    )
}

async fn list(State(st): State<AppState>, q: Query) -> Response {
    let all = match super::state::all_flag(&q) {
        Ok(a) => a,
        Err(e) => return *e,
    };
    let req = pb::ListCommitmentsRequest { all };
    reply(StatusCode::OK, st.api.list_commitments(Request::new(req)).await)
}

async fn detail(State(st): State<AppState>, Path(id): Path<String>) -> Response {
    let req = pb::GetCommitmentRequest { id };
    reply(StatusCode::OK, st.api.get_commitment(Request::new(req)).await)
}

async fn close(State(st): State<AppState>, Path(id): Path<String>, b: Body) -> Response {
    match body_at(&st, b, ("id", &id), |r: &mut pb::CloseCommitmentRequest| {
        &mut r.id
    })
    .await
    {
        Ok(req) => reply(StatusCode::OK, st.api.close_commitment(Request::new(req)).await),
        Err(e) => e,
    }
}
