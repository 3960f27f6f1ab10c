//! What every HTTP handler shares (`AppState`) and the two helpers every JSON route uses
//! (`json`, `body`), below the routes, the SSE and stream handlers and the app's assets.

use super::assets::Bundle;
use crate::errors::{json_error, status_response};
use crate::grpc::AgentApi;
use axum::body::Body;
use axum::extract::FromRef;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;
use prost::{Message, Name};
use std::sync::Arc;
use vak_proto::json::{from_json, to_json};

#[derive(Clone)]
pub struct AppState {
    pub api: AgentApi,
    /// The largest request body accepted (413 beyond).
    pub max_body: usize,
    /// The browser app and console served at /app and /admin.
    pub app: Arc<Bundle>,
    /// The live browser terminals (`GET /pty`), bounded.
    pub terminals: vak_core::host::terminal::Terminals,
    /// The one keepalive clock of this server's event streams.
    pub keepalive: super::sse_encode::Keepalive,
}

/// The app's handlers (`assets.rs`) take only the bundle.
impl FromRef<AppState> for Arc<Bundle> {
    fn from_ref(st: &AppState) -> Arc<Bundle> {
        st.app.clone()
    }
}

pub(crate) fn json<M: Message + Name>(status: StatusCode, msg: &M) -> Response {
    let mut resp = (status, to_json(msg)).into_response();
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

/// Reads and parses a JSON body, answering 413 past the limit and 400 when malformed.
pub(crate) async fn body<M: Message + Name + Default>(st: &AppState, body: Body) -> Result<M, Response> {
    let bytes = match http_body_util::Limited::new(body, st.max_body).collect().await {
        Ok(c) => c.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            return Err(json_error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                &format!("the request body is larger than {} bytes", st.max_body),
            ))
        }
        Err(e) => {
            return Err(json_error(
                StatusCode::BAD_REQUEST,
                "invalid_argument",
                &format!("cannot read the request body: {e}"),
            ))
        }
    };
    from_json(&bytes).map_err(|m| json_error(StatusCode::BAD_REQUEST, "invalid_argument", &m))
}

/// The query parameters of a route, by name (`query.rs` refuses any the route does not read).
pub(super) type Query = axum::extract::Query<std::collections::HashMap<String, String>>;

/// A JSON response in the proto3 mapping.
pub(super) fn reply<M: Message + Name>(
    status: StatusCode,
    result: Result<tonic::Response<M>, tonic::Status>,
) -> Response {
    match result {
        Ok(r) => json(status, r.get_ref()),
        Err(s) => status_response(&s),
    }
}

/// Reads a body for the session the path names (see `session_mismatch`).
pub(super) async fn for_session<M: Message + Name + Default>(
    st: &AppState,
    id: &str,
    b: Body,
    field: fn(&mut M) -> &mut String,
) -> Result<M, Response> {
    let mut req: M = body(st, b).await?;
    match session_mismatch(id, field(&mut req)) {
        Some(e) => Err(e),
        None => Ok(req),
    }
}

/// The path names the session; a body that names another one is refused.
pub(super) fn session_mismatch(path: &str, body: &mut String) -> Option<Response> {
    path_mismatch("session_id", path, body)
}

/// The path names the resource (`field` in the body); a body that names
/// another one is refused, an empty one takes the path's.
/// A `?all=` flag: absent or `false` is false, `true` true, else a 400.
pub(super) fn all_flag(q: &Query) -> Result<bool, Box<Response>> {
    match q.get("all").map(String::as_str) {
        None | Some("false") => Ok(false),
        Some("true") => Ok(true),
        Some(_) => Err(Box::new(json_error(
            StatusCode::BAD_REQUEST,
            "invalid_argument",
            "all must be true or false",
        ))),
    }
}

/// A body for a route whose path names the object (`field`, e.g. a proposal's
/// `id`): the body may leave the field out or repeat the path's value; one
/// naming another object is refused (`path_mismatch`).
pub(super) async fn body_at<M: Message + Name + Default>(
    st: &AppState,
    b: Body,
    (field, path): (&str, &str),
    slot: fn(&mut M) -> &mut String,
) -> Result<M, Response> {
    let mut req: M = body(st, b).await?;
    match path_mismatch(field, path, slot(&mut req)) {
        Some(e) => Err(e),
        None => Ok(req),
    }
}

pub(super) fn path_mismatch(field: &str, path: &str, body: &mut String) -> Option<Response> {
    if !body.is_empty() && body != path {
        return Some(json_error(
            StatusCode::BAD_REQUEST,
            "invalid_argument",
            &format!("{field} in the body does not match the path"),
        ));
    }
    *body = path.to_string();
    None
}
