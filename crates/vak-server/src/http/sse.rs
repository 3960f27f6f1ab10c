//! The per-session SSE routes (events and presentation events): cursors from Last-Event-ID or `?after=`, frames through the one encoder (`sse_encode`).

use super::sse_encode::{self, write_frame, Keepalive};
use super::state::AppState;
use crate::errors::{json_error, status_response};
use crate::grpc::convert;
use crate::grpc::convert::presentation_kind_name;
use crate::grpc::service::Opened;
use crate::grpc::service::Surface;
use crate::limits::StreamPermit;
use crate::listener::PeerAddr;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::Extension;
use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use pb::agent_service_server::AgentService;
use std::collections::HashMap;
use std::io::Write as _;
use vak_core::event::{ClientEvent, Frame};
use vak_core::session::live::PresenceGuard;
use vak_core::stream::bus_config::Charge;
use vak_core::stream::delivery::{Delivery, End};
use vak_core::stream::subscription::Subscription;
use vak_proto::json::to_json;
use vak_proto::v1 as pb;

/// Parses a cursor (a seq): decimal digits only, within u64.
pub(crate) fn parse_cursor(raw: &str) -> Result<u64, String> {
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

/// A gRPC server stream as an SSE response: one frame per message until the
/// stream ends or fails.
pub(crate) fn respond<T, S>(stream: S, to_frame: fn(T) -> Bytes, keepalive: &Keepalive) -> Response
where
    T: Send + 'static,
    S: futures_util::Stream<Item = Result<T, tonic::Status>> + Send + 'static,
{
    let frames = stream
        .take_while(|r| std::future::ready(r.is_ok()))
        .filter_map(move |r| std::future::ready(r.ok().map(to_frame)));
    sse_encode::response(frames, keepalive)
}

/// A frame's `data:` JSON. Deltas, nearly everything a run streams, are
/// written directly, byte for byte what the descriptor-driven mapping writes
/// (a test compares the two): that mapping re-decodes every message into a
/// dynamic one, which was a quarter of the server's CPU with one SSE reader.
fn frame_json(f: &Frame) -> Bytes {
    let (field, text) = match &f.event {
        ClientEvent::TextDelta { text } => ("text_delta", text),
        ClientEvent::ThinkingDelta { text } => ("thinking_delta", text),
        _ => return Bytes::from(to_json(&convert::frame(f))),
    };
    let mut out = Vec::with_capacity(text.len() + f.session_id.len() + 64);
    out.extend_from_slice(b"{\"seq\":");
    write!(out, "{}", f.seq).expect("writing to a Vec cannot fail");
    out.extend_from_slice(b",\"session_id\":");
    json_str(&mut out, &f.session_id);
    out.extend_from_slice(b",\"");
    out.extend_from_slice(field.as_bytes());
    out.extend_from_slice(b"\":{\"text\":");
    json_str(&mut out, text);
    out.extend_from_slice(b"}}");
    Bytes::from(out)
}

/// `s` as a JSON string, escaped as serde_json escapes it.
fn json_str(out: &mut Vec<u8>, s: &str) {
    serde_json::to_writer(out, s).expect("writing a str to a Vec cannot fail");
}

fn presentation_frame(e: pb::PresentationEvent) -> Bytes {
    let name = e.kind.as_ref().map_or("unknown", presentation_kind_name);
    sse_encode::frame(name, None, &to_json(&e))
}

/// A service request made on behalf of an SSE client: it keeps the client's
/// address (stream caps) and is marked "sse" (coworking frames).
pub(crate) fn sse_request<T>(msg: T, peer: Option<Extension<PeerAddr>>) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    req.extensions_mut().insert(Surface::Sse);
    if let Some(Extension(p)) = peer {
        req.extensions_mut().insert(p);
    }
    req
}

/// GET /sessions/:id/presentation/events: a snapshot, then semantic deltas.
pub(crate) async fn presentation_events(
    State(st): State<AppState>,
    Path(id): Path<String>,
    peer: Option<Extension<PeerAddr>>,
) -> Response {
    let req = sse_request(pb::GetPresentationRequest { session_id: id }, peer);
    match st.api.presentation_events(req).await {
        Ok(r) => respond(r.into_inner(), presentation_frame, &st.keepalive),
        Err(s) => status_response(&s),
    }
}

pub(crate) async fn events(
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
    // A malformed ?after= is refused even when the header wins below.
    let from_query = match query.get("after").map(|r| parse_cursor(r)).transpose() {
        Ok(a) => a,
        Err(m) => return bad(m),
    };
    // A browser's reconnect sends Last-Event-ID while its URL keeps the
    // original ?after=, so the header is the fresher cursor.
    let after = match headers.get("last-event-id") {
        Some(v) => match v
            .to_str()
            .map_err(|_| "malformed Last-Event-ID header".to_string())
            .and_then(parse_cursor)
        {
            Ok(a) => Some(a),
            Err(m) => return bad(m),
        },
        None => from_query,
    };
    let req = sse_request(
        pb::SubscribeRequest {
            session_id: id,
            after,
        },
        peer,
    );
    match st.api.open_subscription(req).await {
        Ok(opened) => event_stream(opened, &st.keepalive),
        Err(s) => status_response(&s),
    }
}

/// Frames taken from the subscription per write.
const BATCH: usize = 256;

/// A frame holding this many payload bytes or more has its JSON written from
/// the frame's own buffer (its own HTTP chunk, shared by every reader)
/// instead of copied into each reader's batch, a fresh large allocation per
/// reader (measured: about 8% less server CPU with 64 KiB deltas to 10
/// readers; BENCHMARKS.md). The batch is sized by the same test.
const SHARED_JSON_FROM: usize = 4096;

/// The per-session event stream as SSE. Each frame's JSON is made once and
/// shared by every subscriber (`Frame::encoded`); whatever is queued goes out
/// in one write, so a busy stream costs one write per batch, not per frame:
/// small frames copied into one chunk, large JSON as chunks of their own.
fn event_stream(opened: Opened, keepalive: &Keepalive) -> Response {
    let Opened {
        session_id,
        latest_seq,
        subscription,
        hold,
        ..
    } = opened;
    let mut first = BytesMut::new();
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
    let chunks = futures_util::stream::unfold(state, |mut st| async move {
        if let Some(first) = st.first.take() {
            return Some((futures_util::stream::iter(vec![first]), st));
        }
        if st.done {
            return None;
        }
        let batch = st.sub.recv_many(BATCH).await;
        if batch.is_empty() {
            return None;
        }
        // Sized for the batch up front: growing it frame by frame was a
        // realloc and a copy per frame and subscriber.
        let room: usize = batch
            .iter()
            .map(|d| match d {
                Delivery::Frame(f) if f.size >= SHARED_JSON_FROM => f.session_id.len() + 64,
                Delivery::Frame(f) => f.size + f.session_id.len() + 64,
                _ => 256,
            })
            .sum();
        let mut out = BytesMut::with_capacity(room);
        let mut pieces: Vec<Bytes> = Vec::new();
        let mut id = itoa::Buffer::new();
        for d in batch {
            match d {
                Delivery::Frame(f) => {
                    let json = f.encoded_json(frame_json);
                    let id = Some(id.format(f.seq));
                    if f.size >= SHARED_JSON_FROM {
                        sse_encode::write_head(&mut out, f.event.kind(), id);
                        pieces.push(out.split().freeze());
                        pieces.push(json);
                        out.extend_from_slice(sse_encode::FRAME_END);
                    } else {
                        write_frame(&mut out, f.event.kind(), id, &json);
                    }
                }
                Delivery::Resync {
                    reason,
                    latest_seq,
                    lost,
                } => {
                    write_frame(
                        &mut out,
                        "resync",
                        None,
                        &to_json(&convert::resync(&st.sid, reason, latest_seq, lost)),
                    );
                }
                Delivery::End(End::Closed(reason)) => {
                    let closed = convert::session_closed(&st.sid, reason);
                    write_frame(&mut out, "session_closed", None, &to_json(&closed));
                    st.done = true;
                }
            }
        }
        // Until the connection has written it, the batch counts in this
        // reader's byte budget (its buffer at capacity, and the shared JSON
        // it holds): a stalled reader's unwritten frames are part of what
        // `--max-queued-mib` bounds. The charge rides on the last piece,
        // which is written last.
        let in_pieces: usize = pieces.iter().map(Bytes::len).sum();
        let charge = st.sub.charge(out.capacity() + in_pieces);
        pieces.push(Bytes::from_owner(Charged {
            buf: out,
            _charge: charge,
        }));
        Some((futures_util::stream::iter(pieces), st))
    })
    .flatten();
    sse_encode::response(chunks, keepalive)
}

/// An encoded chunk and its charge on the reader's budget, released when
/// the last reference to the chunk (the connection's write queue) drops it.
struct Charged {
    buf: BytesMut,
    _charge: Charge,
}

impl AsRef<[u8]> for Charged {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// The direct delta encoding is the mapping's, byte for byte.
        #[test]
        fn deltas_are_written_as_the_proto3_mapping_writes_them(
            seq in proptest::prelude::any::<u64>(),
            sid in "\\PC{0,12}",
            text in "(\\PC|[\\x00-\\x1f\"\\\\\\u{2028}\\u{7f}])*",
            thinking in proptest::prelude::any::<bool>(),
        ) {
            let event = if thinking {
                ClientEvent::ThinkingDelta { text }
            } else {
                ClientEvent::TextDelta { text }
            };
            let f = Frame::new(seq, std::sync::Arc::from(sid.as_str()), event);
            proptest::prop_assert_eq!(frame_json(&f), Bytes::from(to_json(&convert::frame(&f))));
        }
    }

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
