//! The Connect protocol (connectrpc.com/docs/protocol) on the one port: an adapter that turns each Connect call into a gRPC call to the same tonic services and the answer back, so every RPC is served by one implementation whatever the protocol.
//!
//! Why an adapter rather than a library: the maintained Rust Connect runtime
//! (the `connectrpc` crates) generates its own message types and service
//! traits, so it would mean a second implementation of every RPC beside the
//! tonic one. Connect's wire is small (a plain body or the same five-byte
//! envelope gRPC uses, JSON by the descriptor set, gzip, an error JSON), so
//! transcoding it in front of the tonic router keeps one service, one set of
//! stream caps and one backpressure path.

mod codec;
pub(crate) mod error;
mod stream;
mod unary;

use super::protocol::{Codec, ConnectCall};
use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use codec::Transcoder;
use std::time::Duration;
use tonic::Status;

/// The largest `Connect-Timeout-Ms` the spec allows: ten digits.
const MAX_TIMEOUT_DIGITS: usize = 10;

/// Serves one Connect call through `grpc`, the router of the tonic services.
pub(crate) async fn serve(grpc: Router, call: ConnectCall, mut req: Request, max_body: usize) -> Response {
    req.extensions_mut().insert(crate::metrics::Transport::Connect);
    let refused = match prepare(&call, &req) {
        Ok(prep) if call.streaming => return stream::serve(grpc, prep, req, max_body).await,
        Ok(prep) => return unary::serve(grpc, prep, req, max_body).await,
        Err(refused) => refused,
    };
    crate::body::drain(req.into_body()).await;
    match refused {
        Refused::Status(s) => error::refusal(&call, &s),
        Refused::Media { streaming } => unsupported_media_type(streaming),
        Refused::NotGet => get_not_allowed(),
    }
}

/// What every call needs settled before its message is read.
pub(crate) struct Prepared {
    transcoder: Transcoder,
    /// The method has a request stream (client or bidi streaming): its
    /// envelopes are transcoded as they arrive.
    client_streaming: bool,
    timeout: Option<Duration>,
}

/// Why a call is refused before its message is read.
enum Refused {
    Status(Box<Status>),
    /// A content type this RPC does not take (415, plain HTTP as Connect servers answer);
    /// `streaming`: the RPC takes the streaming content types.
    Media {
        streaming: bool,
    },
    /// GET of an RPC with side effects (405).
    NotGet,
}

impl From<Status> for Refused {
    fn from(s: Status) -> Refused {
        Refused::Status(Box::new(s))
    }
}

fn prepare(call: &ConnectCall, req: &Request) -> Result<Prepared, Refused> {
    let h = req.headers();
    if let Some(v) = h.get("connect-protocol-version") {
        if v != "1" {
            return Err(Status::invalid_argument("connect-protocol-version must be 1").into());
        }
    }
    let Some(codec) = call.codec else {
        return Err(Refused::Media {
            streaming: call.streaming,
        });
    };
    let Some(method) = codec::method(req.uri().path()) else {
        return Err(Status::unimplemented(format!("no such RPC: {}", req.uri().path())).into());
    };
    // A unary content type for a streaming RPC (or the other way round):
    // the answer names the ones the RPC takes.
    let streaming = method.is_client_streaming() || method.is_server_streaming();
    if call.streaming != streaming {
        return Err(Refused::Media { streaming });
    }
    if call.get {
        let side_effect_free = method
            .method_descriptor_proto()
            .options
            .as_ref()
            .and_then(|o| o.idempotency_level)
            == Some(prost_types::method_options::IdempotencyLevel::NoSideEffects as i32);
        if !side_effect_free {
            return Err(Refused::NotGet);
        }
    }
    let timeout = match h.get("connect-timeout-ms") {
        None => None,
        Some(v) => Some(timeout_of(v).ok_or_else(|| {
            Status::invalid_argument("connect-timeout-ms must be a positive integer of at most 10 digits")
        })?),
    };
    Ok(Prepared {
        transcoder: Transcoder::new(codec, &method),
        client_streaming: method.is_client_streaming(),
        timeout,
    })
}

fn timeout_of(v: &HeaderValue) -> Option<Duration> {
    let s = v.to_str().ok()?;
    if s.is_empty() || s.len() > MAX_TIMEOUT_DIGITS || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(Duration::from_millis(s.parse().ok()?))
}

fn get_not_allowed() -> Response {
    let mut resp = (
        StatusCode::METHOD_NOT_ALLOWED,
        "GET is for RPCs marked idempotency_level = NO_SIDE_EFFECTS; use POST\n",
    )
        .into_response();
    resp.headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static("POST"));
    resp
}

fn unsupported_media_type(streaming: bool) -> Response {
    let accepted = if streaming {
        "application/connect+json, application/connect+proto"
    } else {
        "application/json, application/proto"
    };
    let mut resp = (
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        format!("this RPC takes {accepted}\n"),
    )
        .into_response();
    resp.headers_mut()
        .insert("accept-post", HeaderValue::from_static(accepted));
    resp
}

/// The gRPC request the tonic service sees: the same path, headers (the
/// caller's metadata, traceparent) and extensions (peer address, transport),
/// with gRPC's content type and `body`.
fn grpc_request(req: Request, body: Body) -> Request {
    let (mut parts, _) = req.into_parts();
    parts.method = Method::POST;
    if parts.uri.query().is_some() {
        let path = parts.uri.path().to_string();
        parts.uri = path.parse().unwrap_or_default();
    }
    let h = &mut parts.headers;
    let drop: Vec<_> = h.keys().filter(|n| error::is_reserved(n)).cloned().collect();
    for name in drop {
        h.remove(name);
    }
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    h.insert(header::TE, HeaderValue::from_static("trailers"));
    Request::from_parts(parts, body)
}

/// The content type of a response in `codec`.
fn content_type(streaming: bool, codec: Codec) -> HeaderValue {
    HeaderValue::from_static(match (streaming, codec) {
        (false, Codec::Json) => "application/json",
        (false, Codec::Proto) => "application/proto",
        (true, Codec::Json) => "application/connect+json",
        (true, Codec::Proto) => "application/connect+proto",
    })
}
