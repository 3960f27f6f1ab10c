//! The REST routes of the endpoint table, each a thin translation onto an `AgentService` call.

pub(crate) use super::state::{body, json, AppState};
use super::state::{body_at, for_session, path_mismatch, reply, session_mismatch, Query};
use super::{sse, stream};
use crate::errors::{json_error, status_response};
use crate::grpc::convert;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, patch, post, put};
use axum::Router;
use pb::agent_service_server::AgentService;
use tonic::Request;
use vak_core::host::memory;
use vak_proto::v1 as pb;

pub(crate) fn router(state: AppState) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/openapi.json", get(openapi))
        .route("/sessions", post(create_session).get(list_sessions))
        .route("/sessions/{id}/run", post(run))
        .route("/sessions/{id}/steering", post(steering))
        .route("/sessions/{id}/approvals/{rid}", post(approve))
        .route("/sessions/{id}/cancel", post(cancel))
        .route("/sessions/{id}/events", get(sse::events))
        .route("/sessions/{id}/transcript", get(transcript))
        .route("/sessions/{id}/transcript.md", get(transcript_md))
        .route("/sessions/{id}/attach", post(attach))
        .route("/sessions/{id}/presentation", get(presentation))
        .route(
            "/sessions/{id}/presentation/events",
            get(sse::presentation_events),
        )
        .route("/stream", get(stream::stream))
        .route("/stream/{stream_id}/follow", post(stream::follow))
        .route("/stream/{stream_id}/unfollow", post(stream::unfollow))
        .route("/config", get(get_config).patch(update_config))
        .route("/config/mode", post(set_mode))
        .route("/config/key", put(set_key).delete(delete_key))
        .route("/config/mcp", get(get_mcp_config).put(put_mcp_config))
        .route("/permissions/rules", get(list_rules))
        .route("/permissions/rules/{id}", delete(delete_rule))
        .route("/providers", get(list_providers))
        .route("/providers/{name}/models", get(list_models))
        // ---- Workspace files, diff and session lifecycle (issue 15) ----
        .route("/fs/file", get(read_file).put(write_file))
        .route("/fs/tree", get(list_tree))
        .route("/fs/dirs", get(list_dirs))
        .route("/sessions/{id}/diff", get(get_diff))
        .route("/sessions/{id}", delete(delete_session).patch(rename_session))
        .route("/sessions/{id}/fork", post(fork_session))
        .route("/sessions/{id}/clear", post(clear_session))
        .route("/sessions/{id}/undo", post(undo_session))
        .route("/sessions/{id}/compact", post(compact_session))
        // ---- The browser app and console (issue 16) ----
        .route("/admin/status", get(admin_status))
        .route("/host", get(get_host))
        .route("/workspaces", get(list_workspaces))
        .route("/workspaces/open", post(open_workspace))
        .route("/pty", get(super::pty::pty))
        .merge(super::assets::routes())
        // ---- Memory and search (issue 15) ----
        .route("/memory", get(list_memory).post(add_memory))
        .route("/memory/{note_id}", patch(update_memory).delete(delete_memory))
        .route("/search", get(search))
        .route("/sessions/{id}/side", post(side_run).get(list_side))
        .route("/sessions/{id}/side/cancel", post(side_cancel))
        // ---- Scheduled tasks (issue 29) ----
        .route("/tasks", get(list_tasks).post(create_task))
        .route(
            "/tasks/{task_id}",
            get(get_task).patch(update_task).delete(delete_task),
        )
        .route("/tasks/{task_id}/run-now", post(run_task_now))
        // ---- Budget and digest (issue 29) ----
        .route("/digest", get(digest))
        .route("/doctor", get(doctor))
        .route("/sessions/{id}/receipts", get(receipts))
        .route("/backup/export", post(backup_export))
        .route("/backup/import", post(backup_import))
        // ---- Workers, best-of-N, dev servers, the PR view (issue 30) ----
        .merge(super::workbench::routes())
        // ---- Commitments (issue 35) ----
        .merge(super::commitments::routes())
        .merge(super::skills::routes())
        .method_not_allowed_fallback(|| async {
            json_error(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "this method is not allowed on this path",
            )
        })
        .with_state(state)
}

/// `ok`, or `degraded` with the sessions a storage failure stopped (the
/// server still serves every other session).
async fn health(State(st): State<AppState>) -> Response {
    let failures = st.api.storage_failures();
    let body = if failures.is_empty() {
        serde_json::json!({"status": "ok"})
    } else {
        let list: Vec<_> = failures
            .into_iter()
            .map(|(session_id, reason)| serde_json::json!({"session_id": session_id, "reason": reason}))
            .collect();
        serde_json::json!({"status": "degraded", "storage_failures": list})
    };
    let mut resp = body.to_string().into_response();
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

/// The OpenAPI document, generated from the proto at build time.
async fn openapi() -> Response {
    let mut resp = vak_proto::OPENAPI_JSON.into_response();
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

async fn create_session(State(st): State<AppState>, b: Body) -> Response {
    let req: pb::CreateSessionRequest = match body(&st, b).await {
        Ok(r) => r,
        Err(e) => return e,
    };
    reply(
        StatusCode::CREATED,
        st.api.create_session(Request::new(req)).await,
    )
}

async fn list_sessions(State(st): State<AppState>) -> Response {
    reply(
        StatusCode::OK,
        st.api
            .list_sessions(Request::new(pb::ListSessionsRequest {}))
            .await,
    )
}

async fn run(State(st): State<AppState>, Path(id): Path<String>, b: Body) -> Response {
    let mut req: pb::RunRequest = match body(&st, b).await {
        Ok(r) => r,
        Err(e) => return e,
    };
    if let Some(e) = session_mismatch(&id, &mut req.session_id) {
        return e;
    }
    // 200 with the result once a waited-for run settled, else 202.
    match st.api.run(Request::new(req)).await {
        Ok(r) if r.get_ref().result.is_some() => json(StatusCode::OK, r.get_ref()),
        other => reply(StatusCode::ACCEPTED, other),
    }
}

async fn steering(State(st): State<AppState>, Path(id): Path<String>, b: Body) -> Response {
    let mut req: pb::SteerRequest = match body(&st, b).await {
        Ok(r) => r,
        Err(e) => return e,
    };
    if let Some(e) = session_mismatch(&id, &mut req.session_id) {
        return e;
    }
    reply(StatusCode::ACCEPTED, st.api.steer(Request::new(req)).await)
}

async fn approve(State(st): State<AppState>, Path((id, rid)): Path<(String, String)>, b: Body) -> Response {
    let mut req: pb::ApproveRequest = match body(&st, b).await {
        Ok(r) => r,
        Err(e) => return e,
    };
    if let Some(e) = session_mismatch(&id, &mut req.session_id) {
        return e;
    }
    if let Some(e) = path_mismatch("request_id", &rid, &mut req.request_id) {
        return e;
    }
    reply(StatusCode::OK, st.api.approve(Request::new(req)).await)
}

async fn cancel(State(st): State<AppState>, Path(id): Path<String>, b: Body) -> Response {
    let mut req: pb::CancelRequest = match body(&st, b).await {
        Ok(r) => r,
        Err(e) => return e,
    };
    if let Some(e) = session_mismatch(&id, &mut req.session_id) {
        return e;
    }
    reply(StatusCode::OK, st.api.cancel(Request::new(req)).await)
}

async fn attach(State(st): State<AppState>, Path(id): Path<String>, b: Body) -> Response {
    let mut req: pb::AttachSessionRequest = match body(&st, b).await {
        Ok(r) => r,
        Err(e) => return e,
    };
    if let Some(e) = session_mismatch(&id, &mut req.session_id) {
        return e;
    }
    reply(StatusCode::OK, st.api.attach_session(Request::new(req)).await)
}

async fn transcript(State(st): State<AppState>, Path(id): Path<String>) -> Response {
    let req = pb::GetTranscriptRequest { session_id: id };
    reply(StatusCode::OK, st.api.get_transcript(Request::new(req)).await)
}

async fn transcript_md(State(st): State<AppState>, Path(id): Path<String>) -> Response {
    let req = pb::GetTranscriptRequest { session_id: id };
    match st.api.get_transcript_markdown(Request::new(req)).await {
        Ok(r) => {
            let mut resp = r.into_inner().markdown.into_response();
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/markdown; charset=utf-8"),
            );
            resp
        }
        Err(s) => status_response(&s),
    }
}

async fn presentation(State(st): State<AppState>, Path(id): Path<String>) -> Response {
    let req = pb::GetPresentationRequest { session_id: id };
    reply(StatusCode::OK, st.api.get_presentation(Request::new(req)).await)
}

async fn get_config(State(st): State<AppState>) -> Response {
    config_reply(st.api.get_config(Request::new(pb::GetConfigRequest {})).await)
}

/// A configuration answer, with its revision also as the ETag (for `If-Match`).
fn config_reply(result: Result<tonic::Response<pb::ConfigInfo>, tonic::Status>) -> Response {
    let etag = result
        .as_ref()
        .ok()
        .and_then(|r| HeaderValue::from_str(&format!("\"{}\"", r.get_ref().revision)).ok());
    let mut resp = reply(StatusCode::OK, result);
    if let Some(v) = etag {
        resp.headers_mut().insert(header::ETAG, v);
    }
    resp
}

/// `If-Match: <revision>` (quotes and a weak `W/` prefix are tolerated) is the
/// body's `revision`; both at once must agree. `If-Match: *` asks for no check.
async fn update_config(State(st): State<AppState>, headers: axum::http::HeaderMap, b: Body) -> Response {
    let mut req: pb::UpdateConfigRequest = match body(&st, b).await {
        Ok(r) => r,
        Err(e) => return e,
    };
    if let Some(v) = headers.get(header::IF_MATCH) {
        let Ok(v) = v.to_str() else {
            return json_error(
                StatusCode::BAD_REQUEST,
                "invalid_argument",
                "malformed If-Match header",
            );
        };
        let v = v.trim().trim_start_matches("W/").trim_matches('"').to_string();
        match &req.revision {
            _ if v == "*" => {}
            Some(r) if *r != v => {
                return json_error(
                    StatusCode::BAD_REQUEST,
                    "invalid_argument",
                    "If-Match and the body's revision differ",
                )
            }
            _ => req.revision = Some(v),
        }
    }
    config_reply(st.api.update_config(Request::new(req)).await)
}

async fn get_mcp_config(State(st): State<AppState>) -> Response {
    let req = pb::GetMcpConfigRequest {};
    reply(StatusCode::OK, st.api.get_mcp_config(Request::new(req)).await)
}

async fn put_mcp_config(State(st): State<AppState>, b: Body) -> Response {
    let req: pb::PutMcpConfigRequest = match body(&st, b).await {
        Ok(r) => r,
        Err(e) => return e,
    };
    reply(StatusCode::OK, st.api.put_mcp_config(Request::new(req)).await)
}

async fn set_mode(State(st): State<AppState>, b: Body) -> Response {
    let req: pb::SetModeRequest = match body(&st, b).await {
        Ok(r) => r,
        Err(e) => return e,
    };
    reply(StatusCode::OK, st.api.set_mode(Request::new(req)).await)
}

async fn list_rules(State(st): State<AppState>, q: Query) -> Response {
    let req = pb::ListRulesRequest {
        workspace: q.get("workspace").cloned(),
    };
    reply(StatusCode::OK, st.api.list_rules(Request::new(req)).await)
}

async fn delete_rule(State(st): State<AppState>, Path(id): Path<String>, q: Query) -> Response {
    let req = pb::DeleteRuleRequest {
        id,
        workspace: q.get("workspace").cloned(),
    };
    reply(StatusCode::OK, st.api.delete_rule(Request::new(req)).await)
}

async fn set_key(State(st): State<AppState>, b: Body) -> Response {
    let req: pb::SetKeyRequest = match body(&st, b).await {
        Ok(r) => r,
        Err(e) => return e,
    };
    reply(StatusCode::OK, st.api.set_key(Request::new(req)).await)
}

async fn delete_key(State(st): State<AppState>, b: Body) -> Response {
    let req: pb::DeleteKeyRequest = match body(&st, b).await {
        Ok(r) => r,
        Err(e) => return e,
    };
    reply(StatusCode::OK, st.api.delete_key(Request::new(req)).await)
}

async fn admin_status(State(st): State<AppState>) -> Response {
    reply(
        StatusCode::OK,
        st.api
            .get_admin_status(Request::new(pb::GetAdminStatusRequest {}))
            .await,
    )
}

async fn list_providers(State(st): State<AppState>) -> Response {
    reply(
        StatusCode::OK,
        st.api
            .list_providers(Request::new(pb::ListProvidersRequest {}))
            .await,
    )
}

async fn list_models(State(st): State<AppState>, Path(name): Path<String>) -> Response {
    let req = pb::ListModelsRequest { provider: name };
    reply(StatusCode::OK, st.api.list_models(Request::new(req)).await)
}

// ---- Workspace files, diff and session lifecycle (issue 15) ----

async fn read_file(State(st): State<AppState>, q: Query) -> Response {
    let req = pb::ReadFileRequest {
        path: q.get("path").cloned().unwrap_or_default(),
        session_id: q.get("session_id").cloned(),
    };
    reply(StatusCode::OK, st.api.read_file(Request::new(req)).await)
}

/// 201 when the file was created, 200 when it was replaced.
async fn write_file(State(st): State<AppState>, b: Body) -> Response {
    let req: pb::WriteFileRequest = match body(&st, b).await {
        Ok(r) => r,
        Err(e) => return e,
    };
    match st.api.write_file(Request::new(req)).await {
        Ok(r) => {
            let status = if r.get_ref().created {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            json(status, r.get_ref())
        }
        Err(s) => status_response(&s),
    }
}

/// `?limit=`: absent, or a whole number (the service checks its range).
fn limit_param(q: &Query) -> Result<Option<u32>, Box<Response>> {
    match q.get("limit").map(|l| l.parse::<u32>()) {
        None => Ok(None),
        Some(Ok(n)) => Ok(Some(n)),
        Some(Err(_)) => Err(Box::new(json_error(
            StatusCode::BAD_REQUEST,
            "invalid_argument",
            "limit must be a whole number",
        ))),
    }
}

async fn list_tree(State(st): State<AppState>, q: Query) -> Response {
    let limit = match limit_param(&q) {
        Ok(l) => l,
        Err(e) => return *e,
    };
    let req = pb::ListTreeRequest {
        limit,
        session_id: q.get("session_id").cloned(),
    };
    reply(StatusCode::OK, st.api.list_tree(Request::new(req)).await)
}

async fn get_host(State(st): State<AppState>) -> Response {
    reply(
        StatusCode::OK,
        st.api.get_host(Request::new(pb::GetHostRequest {})).await,
    )
}

async fn list_workspaces(State(st): State<AppState>) -> Response {
    let req = pb::ListWorkspacesRequest {};
    reply(StatusCode::OK, st.api.list_workspaces(Request::new(req)).await)
}

async fn open_workspace(State(st): State<AppState>, b: Body) -> Response {
    let req: pb::OpenWorkspaceRequest = match body(&st, b).await {
        Ok(r) => r,
        Err(e) => return e,
    };
    reply(StatusCode::OK, st.api.open_workspace(Request::new(req)).await)
}

async fn list_dirs(State(st): State<AppState>, q: Query) -> Response {
    let req = pb::ListDirsRequest {
        path: q.get("path").cloned().unwrap_or_default(),
    };
    reply(StatusCode::OK, st.api.list_dirs(Request::new(req)).await)
}

async fn get_diff(State(st): State<AppState>, Path(id): Path<String>) -> Response {
    let req = pb::GetDiffRequest { session_id: id };
    reply(StatusCode::OK, st.api.get_diff(Request::new(req)).await)
}

async fn delete_session(State(st): State<AppState>, Path(id): Path<String>) -> Response {
    let req = pb::DeleteSessionRequest { session_id: id };
    reply(StatusCode::OK, st.api.delete_session(Request::new(req)).await)
}

async fn rename_session(State(st): State<AppState>, Path(id): Path<String>, b: Body) -> Response {
    match for_session(&st, &id, b, |r: &mut pb::RenameSessionRequest| &mut r.session_id).await {
        Ok(req) => reply(StatusCode::OK, st.api.rename_session(Request::new(req)).await),
        Err(e) => e,
    }
}

async fn fork_session(State(st): State<AppState>, Path(id): Path<String>, b: Body) -> Response {
    match for_session(&st, &id, b, |r: &mut pb::ForkSessionRequest| &mut r.session_id).await {
        Ok(req) => reply(StatusCode::CREATED, st.api.fork_session(Request::new(req)).await),
        Err(e) => e,
    }
}

async fn clear_session(State(st): State<AppState>, Path(id): Path<String>, b: Body) -> Response {
    match for_session(&st, &id, b, |r: &mut pb::ClearSessionRequest| &mut r.session_id).await {
        Ok(req) => reply(StatusCode::OK, st.api.clear_session(Request::new(req)).await),
        Err(e) => e,
    }
}

async fn undo_session(State(st): State<AppState>, Path(id): Path<String>, b: Body) -> Response {
    match for_session(&st, &id, b, |r: &mut pb::UndoSessionRequest| &mut r.session_id).await {
        Ok(req) => reply(StatusCode::OK, st.api.undo_session(Request::new(req)).await),
        Err(e) => e,
    }
}

async fn compact_session(State(st): State<AppState>, Path(id): Path<String>, b: Body) -> Response {
    match for_session(&st, &id, b, |r: &mut pb::CompactSessionRequest| &mut r.session_id).await {
        Ok(req) => reply(StatusCode::OK, st.api.compact_session(Request::new(req)).await),
        Err(e) => e,
    }
}

// ---- Memory and search (issue 15) ----

async fn list_memory(State(st): State<AppState>) -> Response {
    let req = pb::ListMemoryRequest {};
    reply(StatusCode::OK, st.api.list_memory(Request::new(req)).await)
}

async fn add_memory(State(st): State<AppState>, b: Body) -> Response {
    match body::<pb::AddMemoryRequest>(&st, b).await {
        Ok(req) => reply(StatusCode::CREATED, st.api.add_memory(Request::new(req)).await),
        Err(e) => e,
    }
}

async fn update_memory(State(st): State<AppState>, Path(id): Path<String>, b: Body) -> Response {
    match body_at(&st, b, ("note_id", &id), |r: &mut pb::UpdateMemoryRequest| {
        &mut r.note_id
    })
    .await
    {
        Ok(req) => reply(StatusCode::OK, st.api.update_memory(Request::new(req)).await),
        Err(e) => e,
    }
}

async fn delete_memory(State(st): State<AppState>, Path(id): Path<String>, q: Query) -> Response {
    let scope = match q.get("scope").map(|s| memory::parse_scope(s)) {
        None => None,
        Some(Ok(s)) => Some(convert::memory_scope(s) as i32),
        Some(Err(e)) => return json_error(StatusCode::BAD_REQUEST, "invalid_argument", &e.message),
    };
    let req = pb::DeleteMemoryRequest { note_id: id, scope };
    reply(StatusCode::OK, st.api.delete_memory(Request::new(req)).await)
}

async fn search(State(st): State<AppState>, q: Query) -> Response {
    let limit = match limit_param(&q) {
        Ok(l) => l,
        Err(e) => return *e,
    };
    let all = match super::state::all_flag(&q) {
        Ok(a) => a,
        Err(e) => return *e,
    };
    let req = pb::SearchRequest {
        q: q.get("q").cloned().unwrap_or_default(),
        limit,
        all,
    };
    reply(StatusCode::OK, st.api.search(Request::new(req)).await)
}

async fn side_run(State(st): State<AppState>, Path(id): Path<String>, b: Body) -> Response {
    match for_session(&st, &id, b, |r: &mut pb::SideRunRequest| &mut r.session_id).await {
        Ok(req) => reply(StatusCode::ACCEPTED, st.api.side_run(Request::new(req)).await),
        Err(e) => e,
    }
}

async fn side_cancel(State(st): State<AppState>, Path(id): Path<String>, b: Body) -> Response {
    match for_session(&st, &id, b, |r: &mut pb::SideCancelRequest| &mut r.session_id).await {
        Ok(req) => reply(StatusCode::OK, st.api.side_cancel(Request::new(req)).await),
        Err(e) => e,
    }
}

async fn list_side(State(st): State<AppState>, Path(id): Path<String>) -> Response {
    let req = pb::ListSideRequest { session_id: id };
    reply(StatusCode::OK, st.api.list_side(Request::new(req)).await)
}

// ---- Scheduled tasks (issue 29) ----

async fn list_tasks(State(st): State<AppState>) -> Response {
    reply(
        StatusCode::OK,
        st.api.list_tasks(Request::new(pb::ListTasksRequest {})).await,
    )
}

async fn create_task(State(st): State<AppState>, b: Body) -> Response {
    match body::<pb::CreateTaskRequest>(&st, b).await {
        Ok(req) => reply(StatusCode::CREATED, st.api.create_task(Request::new(req)).await),
        Err(e) => e,
    }
}

async fn get_task(State(st): State<AppState>, Path(task_id): Path<String>) -> Response {
    reply(
        StatusCode::OK,
        st.api
            .get_task(Request::new(pb::GetTaskRequest { task_id }))
            .await,
    )
}

async fn update_task(State(st): State<AppState>, Path(id): Path<String>, b: Body) -> Response {
    match body_at(&st, b, ("task_id", &id), |r: &mut pb::UpdateTaskRequest| {
        &mut r.task_id
    })
    .await
    {
        Ok(req) => reply(StatusCode::OK, st.api.update_task(Request::new(req)).await),
        Err(e) => e,
    }
}

async fn delete_task(State(st): State<AppState>, Path(task_id): Path<String>) -> Response {
    let req = pb::DeleteTaskRequest { task_id };
    reply(StatusCode::OK, st.api.delete_task(Request::new(req)).await)
}

async fn run_task_now(State(st): State<AppState>, Path(task_id): Path<String>) -> Response {
    let req = pb::RunTaskNowRequest { task_id };
    reply(StatusCode::ACCEPTED, st.api.run_task_now(Request::new(req)).await)
}

// ---- Budget and digest (issue 29) ----

/// `?days=`: absent (7), or a whole number the service checks is 1 to 90.
async fn digest(State(st): State<AppState>, q: Query) -> Response {
    let days = match q.get("days").map(|d| d.parse::<u32>()) {
        None => None,
        Some(Ok(n)) => Some(n),
        Some(Err(_)) => {
            return json_error(
                StatusCode::BAD_REQUEST,
                "invalid_argument",
                "days must be a whole number from 1 to 90",
            )
        }
    };
    let req = pb::GetDigestRequest { days };
    reply(StatusCode::OK, st.api.get_digest(Request::new(req)).await)
}

/// `GET /doctor?session=ID`: 200 with the checks (a failed check is a row).
async fn doctor(State(st): State<AppState>, q: Query) -> Response {
    let req = pb::GetDoctorRequest {
        session: q.get("session").cloned(),
    };
    reply(StatusCode::OK, st.api.get_doctor(Request::new(req)).await)
}

/// `GET /sessions/ID/receipts?include=prompt`.
async fn receipts(State(st): State<AppState>, Path(session_id): Path<String>, q: Query) -> Response {
    let req = pb::ListReceiptsRequest {
        session_id,
        include: q.get("include").cloned(),
    };
    reply(StatusCode::OK, st.api.list_receipts(Request::new(req)).await)
}

async fn backup_export(State(st): State<AppState>, b: Body) -> Response {
    match body::<pb::ExportBackupRequest>(&st, b).await {
        Ok(req) => reply(StatusCode::OK, st.api.export_backup(Request::new(req)).await),
        Err(e) => e,
    }
}

async fn backup_import(State(st): State<AppState>, b: Body) -> Response {
    match body::<pb::ImportBackupRequest>(&st, b).await {
        Ok(req) => reply(StatusCode::OK, st.api.import_backup(Request::new(req)).await),
        Err(e) => e,
    }
}
