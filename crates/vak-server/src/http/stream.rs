//! `GET /stream`, the multiplexed SSE stream (one connection, one cursor vector, every followed session), and its follow/unfollow routes.

use super::sse::{respond, sse_request};
use super::sse_encode;
use super::state::{body, json, AppState};
use crate::errors::{json_error, status_response};
use crate::grpc::convert::mux_kind_name;
use crate::listener::PeerAddr;
use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::Extension;
use pb::agent_service_server::AgentService;
use pb::stream_message::Frame as F;
use vak_proto::json::to_json;
use vak_proto::v1 as pb;

/// The most `session=` parameters one request may carry.
const MAX_QUERY_SESSIONS: usize = vak_core::stream::cursor::MAX_SESSIONS;

/// A boolean query parameter; anything but these words is refused, so
/// `host=null` or a typo never silently means "off".
fn flag(name: &str, v: &str) -> Result<bool, String> {
    match v {
        "1" | "true" | "yes" | "on" => Ok(true),
        "" | "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(format!(
            "{name} is a boolean (true or false), not {:?}",
            v.chars().take(64).collect::<String>()
        )),
    }
}

/// The query parameters `/stream` reads (besides the loopback `token`).
pub(crate) const PARAMS: &[&str] = &["session", "host", "config", "cursor"];

/// Parses `session=A&session=B&host=1&config=1&cursor=V`; the `query`
/// middleware has already refused any other parameter but `token`.
pub(crate) fn parse_query(raw: &str) -> Result<pb::StreamRequest, String> {
    let pairs: Vec<(String, String)> =
        serde_urlencoded::from_str(raw).map_err(|e| format!("malformed query string: {e}"))?;
    let mut req = pb::StreamRequest::default();
    for (k, v) in pairs {
        match k.as_str() {
            "session" if !req.sessions.contains(&v) => req.sessions.push(v),
            "session" => {}
            "host" => req.host = flag("host", &v)?,
            "config" => req.config = flag("config", &v)?,
            "cursor" => req.cursor = v,
            _ => {}
        }
        if req.sessions.len() > MAX_QUERY_SESSIONS {
            return Err(format!("a stream follows at most {MAX_QUERY_SESSIONS} sessions"));
        }
    }
    Ok(req)
}

fn mux_frame(m: pb::StreamMessage) -> bytes::Bytes {
    let Some(frame) = m.frame else {
        return sse_encode::frame("unknown", None, b"{}");
    };
    let name = mux_kind_name(&frame);
    let id = (!m.id.is_empty()).then_some(m.id.as_str());
    let data = match &frame {
        F::StreamOpened(o) => to_json(o),
        F::Agent(e) | F::Resync(e) | F::SessionClosed(e) | F::Side(e) => to_json(e),
        F::Presentation(p) => to_json(p),
        F::Coworking(c) => to_json(c),
        F::Host(h) => to_json(h),
        F::Config(c) => to_json(c),
    };
    sse_encode::frame(name, id, &data)
}

pub(crate) async fn stream(
    State(st): State<AppState>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    peer: Option<Extension<PeerAddr>>,
) -> Response {
    let bad = |m: String| json_error(StatusCode::BAD_REQUEST, "invalid_argument", &m);
    let mut req = match parse_query(query.as_deref().unwrap_or("")) {
        Ok(r) => r,
        Err(m) => return bad(m),
    };
    // EventSource resends the last id it saw; it wins over the URL's ?cursor=.
    if let Some(v) = headers.get("last-event-id") {
        match v.to_str() {
            Ok(s) => req.cursor = s.to_string(),
            Err(_) => return bad("malformed Last-Event-ID header".into()),
        }
    }
    let req = sse_request(req, peer);
    match st.api.stream(req).await {
        Ok(r) => respond(r.into_inner(), mux_frame, &st.keepalive),
        Err(s) => status_response(&s),
    }
}

pub(crate) async fn follow(State(st): State<AppState>, Path(stream_id): Path<String>, b: Body) -> Response {
    let mut req: pb::FollowRequest = match body(&st, b).await {
        Ok(r) => r,
        Err(e) => return e,
    };
    req.stream_id = stream_id;
    match st.api.follow(tonic::Request::new(req)).await {
        Ok(r) => json(StatusCode::OK, r.get_ref()),
        Err(s) => status_response(&s),
    }
}

pub(crate) async fn unfollow(State(st): State<AppState>, Path(stream_id): Path<String>, b: Body) -> Response {
    let mut req: pb::UnfollowRequest = match body(&st, b).await {
        Ok(r) => r,
        Err(e) => return e,
    };
    req.stream_id = stream_id;
    match st.api.unfollow(tonic::Request::new(req)).await {
        Ok(r) => json(StatusCode::OK, r.get_ref()),
        Err(s) => status_response(&s),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn queries() {
        let r = parse_query("session=a&session=b&session=a&host=1&config=true&cursor=a%3A3").unwrap();
        assert_eq!(r.sessions, ["a", "b"]);
        assert!(r.host && r.config);
        assert_eq!(r.cursor, "a:3");
        assert!(!parse_query("host=0").unwrap().host);
        let err = parse_query("host=null").unwrap_err();
        assert!(err.contains("host is a boolean"), "{err}");
        assert!(parse_query("config=maybe").is_err());
        let many: Vec<String> = (0..=MAX_QUERY_SESSIONS)
            .map(|i| format!("session=s{i}"))
            .collect();
        assert!(parse_query(&many.join("&")).is_err());
    }

    proptest! {
        #[test]
        fn any_query_parses_or_errs_without_panicking(q in ".{0,200}") {
            let _ = parse_query(&q);
        }
    }
}
