//! What every HTTP handler shares (`AppState`) and the two helpers every JSON route uses
//! (`json`, `body`), below the routes, the SSE and stream handlers and the app's assets.

use super::assets::Bundle;
use crate::errors::json_error;
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
