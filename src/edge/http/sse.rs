//! SSE framing of a session's event stream: `id: <seq>`, `event: <kind>`, `data: <json>`, cursors from Last-Event-ID or `?after=`.

use super::json::to_json;
use super::routes::AppState;
use crate::core::bus::{Delivery, End, Subscription};
use crate::core::session::PresenceGuard;
use crate::edge::errors::{json_error, status_response};
use crate::edge::grpc::convert;
use crate::edge::grpc::convert::presentation_kind_name;
use crate::edge::grpc::service::Opened;
use crate::edge::grpc::service::Surface;
use crate::edge::limits::StreamPermit;
use crate::edge::listener::PeerAddr;
use crate::proto::v1 as pb;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use pb::agent_service_server::AgentService;
use std::collections::HashMap;
use std::convert::Infallible;
use std::time::Duration;

pub const KEEPALIVE: Duration = Duration::from_secs(15);
/// How soon an EventSource should reconnect after a cut (the SSE `retry:` field).
pub const RETRY: &[u8] = b"retry: 1000\n";

/// Parses a cursor (a seq): decimal digits only, within u64.
pub fn parse_cursor(raw: &str) -> Result<u64, String> {
    let s = raw.trim();
    if s.is_empty() || s.len() > 20 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "malformed cursor {:?}: expected a decimal seq",
            raw.chars().take(40).collect::<String>()
        ));
    }
    s.parse::<u64>()
        .map_err(|_| format!("malformed cursor {s:?}: out of range"))
}

/// One SSE frame: `id:` (when given), `event:`, and the JSON as `data:`.
pub fn sse_frame(name: &str, id: Option<String>, json: Vec<u8>) -> SseEvent {
    let ev = SseEvent::default()
        .event(name)
        .data(String::from_utf8(json).expect("JSON is UTF-8"));
    match id {
        Some(id) => ev.id(id),
        None => ev,
    }
}

/// A gRPC server stream as an SSE response: frames until the stream ends or
/// fails (a lagged subscriber: the client reconnects with its last id),
/// keepalive comments, and no caching or proxy buffering.
pub fn respond<T, S>(stream: S, to_frame: fn(T) -> SseEvent) -> Response
where
    T: Send + 'static,
    S: futures_util::Stream<Item = Result<T, tonic::Status>> + Send + 'static,
{
    let frames = stream
        .take_while(|r| std::future::ready(r.is_ok()))
        .filter_map(move |r| std::future::ready(r.ok().map(|m| Ok::<_, Infallible>(to_frame(m)))));
    let mut resp = Sse::new(frames)
        .keep_alive(KeepAlive::new().interval(KEEPALIVE).text("keepalive"))
        .into_response();
    let h = resp.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    resp
}

fn presentation_frame(e: pb::PresentationEvent) -> SseEvent {
    let name = e.kind.as_ref().map_or("unknown", presentation_kind_name);
    sse_frame(name, None, to_json(&e))
}

/// A service request made on behalf of an SSE client: it keeps the client's
/// address (stream caps) and is marked "sse" (coworking frames).
pub fn sse_request<T>(msg: T, peer: Option<Extension<PeerAddr>>) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    req.extensions_mut().insert(Surface("sse"));
    if let Some(Extension(p)) = peer {
        req.extensions_mut().insert(p);
    }
    req
}

/// GET /sessions/:id/presentation/events: a snapshot, then semantic deltas.
pub async fn presentation_events(
    State(st): State<AppState>,
    Path(id): Path<String>,
    peer: Option<Extension<PeerAddr>>,
) -> Response {
    let req = sse_request(pb::GetPresentationRequest { session_id: id }, peer);
    match st.api.presentation_events(req).await {
        Ok(r) => respond(r.into_inner(), presentation_frame),
        Err(s) => status_response(&s),
    }
}

pub async fn events(
    State(st): State<AppState>,
    Path(id): Path<String>,
    query: Result<Query<HashMap<String, String>>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
    peer: Option<Extension<PeerAddr>>,
) -> Response {
    let bad = |m: String| json_error(StatusCode::BAD_REQUEST, "invalid_argument", &m);
    let query = match query {
        Ok(Query(q)) => q,
        Err(e) => return bad(format!("malformed query: {e}")),
    };
    // A browser's reconnect sends Last-Event-ID while its URL keeps the
    // original ?after=, so the header is the fresher cursor.
    let raw = match headers.get("last-event-id") {
        Some(v) => match v.to_str() {
            Ok(s) => Some(s.to_string()),
            Err(_) => return bad("malformed Last-Event-ID header".into()),
        },
        None => query.get("after").cloned(),
    };
    let after = match raw.map(|r| parse_cursor(&r)).transpose() {
        Ok(a) => a,
        Err(m) => return bad(m),
    };
    let req = sse_request(
        pb::SubscribeRequest {
            session_id: id,
            after,
        },
        peer,
    );
    match st.api.open_subscription(req).await {
        Ok(opened) => event_stream(opened),
        Err(s) => status_response(&s),
    }
}

/// Appends one SSE frame: `id:` when given, `event:`, and the JSON as one `data:` line
/// (compact JSON never contains a raw newline).
fn write_frame(out: &mut BytesMut, name: &str, id: Option<u64>, json: &[u8]) {
    if let Some(id) = id {
        out.extend_from_slice(b"id: ");
        out.extend_from_slice(id.to_string().as_bytes());
        out.extend_from_slice(b"\n");
    }
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\ndata: ");
    out.extend_from_slice(json);
    out.extend_from_slice(b"\n\n");
}

/// Frames taken from the subscription per write.
const BATCH: usize = 256;

/// The per-session event stream as SSE. Each frame's JSON is made once and
/// shared by every subscriber (`Frame::encoded`); whatever is queued goes out
/// as one chunk, so a busy stream costs one write per batch, not per frame.
fn event_stream(opened: Opened) -> Response {
    let Opened {
        session_id,
        latest_seq,
        subscription,
        hold,
        ..
    } = opened;
    let mut first = BytesMut::new();
    // EventSource waits ~3 s before reconnecting unless told otherwise.
    first.extend_from_slice(RETRY);
    write_frame(
        &mut first,
        "stream_opened",
        None,
        &to_json(&convert::stream_opened(&session_id, latest_seq)),
    );
    struct State {
        sid: String,
        sub: Subscription,
        first: Option<Bytes>,
        done: bool,
        _hold: (PresenceGuard, StreamPermit),
    }
    let state = State {
        sid: session_id,
        sub: subscription,
        first: Some(first.freeze()),
        done: false,
        _hold: hold,
    };
    let body = futures_util::stream::unfold(state, |mut st| async move {
        if let Some(first) = st.first.take() {
            return Some((Ok::<_, Infallible>(first), st));
        }
        if st.done {
            return None;
        }
        let batch = tokio::select! {
            b = st.sub.recv_many(BATCH) => b,
            _ = tokio::time::sleep(KEEPALIVE) => return Some((Ok(Bytes::from_static(b": keepalive\n\n")), st)),
        };
        if batch.is_empty() {
            return None;
        }
        let mut out = BytesMut::new();
        for d in batch {
            match d {
                Delivery::Frame(f) => {
                    let json = f.encoded_json(|f| Bytes::from(to_json(&convert::frame(f))));
                    write_frame(&mut out, f.event.kind(), Some(f.seq), &json);
                }
                Delivery::Resync { reason, latest_seq } => {
                    write_frame(
                        &mut out,
                        "resync",
                        None,
                        &to_json(&convert::resync(&st.sid, reason, latest_seq)),
                    );
                }
                Delivery::End(End::Closed(reason)) => {
                    let closed = convert::session_closed(&st.sid, reason);
                    write_frame(&mut out, "session_closed", None, &to_json(&closed));
                    st.done = true;
                }
            }
        }
        Some((Ok(out.freeze()), st))
    });
    let mut resp = Body::from_stream(body).into_response();
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors() {
        assert_eq!(parse_cursor("0"), Ok(0));
        assert_eq!(parse_cursor(" 42 "), Ok(42));
        assert_eq!(parse_cursor("18446744073709551615"), Ok(u64::MAX));
        for bad in [
            "",
            "-1",
            "1.5",
            "abc",
            "18446744073709551616",
            "1 2",
            "0x10",
            "+3",
        ] {
            assert!(parse_cursor(bad).is_err(), "{bad}");
        }
    }

    proptest::proptest! {
        #[test]
        fn any_last_event_id_parses_or_errs_without_panicking(s in ".{0,64}") {
            let _ = parse_cursor(&s);
        }

        #[test]
        fn every_seq_round_trips(n in proptest::prelude::any::<u64>()) {
            proptest::prop_assert_eq!(parse_cursor(&n.to_string()), Ok(n));
        }
    }
}
