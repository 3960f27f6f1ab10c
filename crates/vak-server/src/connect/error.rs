//! Connect errors: each gRPC code's Connect name and HTTP status, the error JSON with its details (vak's error kind and reason as a `google.rpc.ErrorInfo`), and the end-of-stream message.

use super::super::protocol::{Codec, ConnectCall};
use super::codec::{envelope, END_STREAM};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use serde_json::{json, Map, Value};
use tonic::{Code, Status};

/// The gRPC metadata vak's statuses carry besides their code.
const KIND: &str = "vak-error-kind";
const REASON: &str = "vak-error-reason";

/// The Connect name of a code.
pub(crate) fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "ok",
        Code::Cancelled => "canceled",
        Code::Unknown => "unknown",
        Code::InvalidArgument => "invalid_argument",
        Code::DeadlineExceeded => "deadline_exceeded",
        Code::NotFound => "not_found",
        Code::AlreadyExists => "already_exists",
        Code::PermissionDenied => "permission_denied",
        Code::ResourceExhausted => "resource_exhausted",
        Code::FailedPrecondition => "failed_precondition",
        Code::Aborted => "aborted",
        Code::OutOfRange => "out_of_range",
        Code::Unimplemented => "unimplemented",
        Code::Internal => "internal",
        Code::Unavailable => "unavailable",
        Code::DataLoss => "data_loss",
        Code::Unauthenticated => "unauthenticated",
    }
}

/// The HTTP status the Connect spec gives a code on a unary call.
pub(crate) fn http_status(code: Code) -> StatusCode {
    match code {
        Code::Cancelled => StatusCode::from_u16(499).expect("499 is a valid status"),
        Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => StatusCode::BAD_REQUEST,
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::Ok | Code::Unknown | Code::Internal | Code::DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// `google.rpc.Status`, to read the details a gRPC status carries.
#[derive(Clone, PartialEq, prost::Message)]
struct RpcStatus {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
    #[prost(message, repeated, tag = "3")]
    details: Vec<prost_types::Any>,
}

/// `google.rpc.ErrorInfo`: vak's error kind (and reason) as a typed detail.
#[derive(Clone, PartialEq, prost::Message)]
struct ErrorInfo {
    #[prost(string, tag = "1")]
    reason: String,
    #[prost(string, tag = "2")]
    domain: String,
    #[prost(btree_map = "string, string", tag = "3")]
    metadata: std::collections::BTreeMap<String, String>,
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD_NO_PAD.encode(bytes)
}

/// `{"code", "message", "details"}` of a status.
pub(crate) fn error_json(s: &Status) -> Value {
    let mut error = Map::new();
    error.insert("code".into(), code_name(s.code()).into());
    if !s.message().is_empty() {
        error.insert("message".into(), s.message().into());
    }
    let mut details: Vec<Value> = Vec::new();
    if let Ok(status) = <RpcStatus as prost::Message>::decode(s.details()) {
        for any in status.details {
            let name = any.type_url.rsplit('/').next().unwrap_or_default().to_string();
            details.push(json!({"type": name, "value": b64(&any.value)}));
        }
    }
    let md = s.metadata();
    let kind = md.get(KIND).and_then(|v| v.to_str().ok());
    let reason = md.get(REASON).and_then(|v| v.to_str().ok());
    if kind.is_some() || reason.is_some() {
        let mut metadata = std::collections::BTreeMap::new();
        if let Some(k) = kind {
            metadata.insert("kind".to_string(), k.to_string());
        }
        if let Some(r) = reason {
            metadata.insert("reason".to_string(), r.to_string());
        }
        let info = ErrorInfo {
            reason: reason.or(kind).unwrap_or_default().to_string(),
            domain: "vak".into(),
            metadata: metadata.clone(),
        };
        details.push(json!({
            "type": "google.rpc.ErrorInfo",
            "value": b64(&prost::Message::encode_to_vec(&info)),
            "debug": {"reason": info.reason, "domain": "vak", "metadata": metadata},
        }));
    }
    if !details.is_empty() {
        error.insert("details".into(), details.into());
    }
    Value::Object(error)
}

/// Whether a header is the protocol's own, never passed on as metadata.
pub(crate) fn is_reserved(name: &HeaderName) -> bool {
    let n = name.as_str();
    n.starts_with("grpc-")
        || n.starts_with("connect-")
        || matches!(
            n,
            "content-type"
                | "content-length"
                | "content-encoding"
                | "accept-encoding"
                | "te"
                | "trailer"
                | "transfer-encoding"
                | "connection"
        )
}

/// A unary call's error: its HTTP status, the error JSON, and the status's
/// metadata (vak-error-kind, vak-error-reason) as headers.
pub(crate) fn unary_error(s: &Status) -> Response {
    let mut resp = (http_status(s.code()), error_json(s).to_string()).into_response();
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    copy_metadata(&s.metadata().clone().into_headers(), h, "");
    if s.code() == Code::Unavailable {
        h.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    resp
}

/// Copies the non-reserved headers of `from` into `to`, each name after `prefix`.
pub(crate) fn copy_metadata(from: &HeaderMap, to: &mut HeaderMap, prefix: &str) {
    for (name, value) in from {
        if is_reserved(name) {
            continue;
        }
        let name = if prefix.is_empty() {
            name.clone()
        } else {
            match HeaderName::from_bytes(format!("{prefix}{name}").as_bytes()) {
                Ok(n) => n,
                Err(_) => continue,
            }
        };
        to.append(name, value.clone());
    }
}

/// The end-of-stream message: the error if the stream failed, and the
/// trailers as metadata (`{"key": ["value", ...]}`).
pub(crate) fn end_stream(error: Option<&Status>, trailers: &HeaderMap) -> bytes::Bytes {
    let mut end = Map::new();
    let mut metadata: Map<String, Value> = Map::new();
    let mut add = |h: &HeaderMap| {
        for (name, value) in h {
            if is_reserved(name) {
                continue;
            }
            let Ok(v) = value.to_str() else { continue };
            let entry = metadata
                .entry(name.as_str().to_string())
                .or_insert_with(|| Value::Array(Vec::new()));
            if let Value::Array(list) = entry {
                list.push(v.into());
            }
        }
    };
    add(trailers);
    if let Some(s) = error {
        add(&s.metadata().clone().into_headers());
        end.insert("error".into(), error_json(s));
    }
    if !metadata.is_empty() {
        end.insert("metadata".into(), Value::Object(metadata));
    }
    envelope(END_STREAM, Value::Object(end).to_string().as_bytes())
}

/// A streaming response that is only its end: HTTP 200, as every Connect
/// stream answers, with the error in the end-of-stream message.
pub(crate) fn stream_error(codec: Option<Codec>, s: &Status) -> Response {
    let codec = codec.unwrap_or(Codec::Proto);
    let mut resp = (StatusCode::OK, end_stream(Some(s), &HeaderMap::new())).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_str(&format!("application/connect+{}", codec.name()))
            .expect("a valid content type"),
    );
    resp
}

/// A refusal in the shape the call expects.
pub(crate) fn refusal(call: &ConnectCall, s: &Status) -> Response {
    if call.streaming {
        stream_error(call.codec, s)
    } else {
        unary_error(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_has_the_specs_name_and_status() {
        let table = [
            (Code::Cancelled, "canceled", 499),
            (Code::Unknown, "unknown", 500),
            (Code::InvalidArgument, "invalid_argument", 400),
            (Code::DeadlineExceeded, "deadline_exceeded", 504),
            (Code::NotFound, "not_found", 404),
            (Code::AlreadyExists, "already_exists", 409),
            (Code::PermissionDenied, "permission_denied", 403),
            (Code::ResourceExhausted, "resource_exhausted", 429),
            (Code::FailedPrecondition, "failed_precondition", 400),
            (Code::Aborted, "aborted", 409),
            (Code::OutOfRange, "out_of_range", 400),
            (Code::Unimplemented, "unimplemented", 501),
            (Code::Internal, "internal", 500),
            (Code::Unavailable, "unavailable", 503),
            (Code::DataLoss, "data_loss", 500),
            (Code::Unauthenticated, "unauthenticated", 401),
        ];
        for (code, name, status) in table {
            assert_eq!(code_name(code), name);
            assert_eq!(http_status(code).as_u16(), status, "{name}");
        }
    }

    #[test]
    fn a_kind_travels_as_error_info_and_metadata() {
        // What errors::to_status makes of an upstream failure.
        let mut md = tonic::metadata::MetadataMap::new();
        md.insert(KIND, "bad_gateway".parse().unwrap());
        md.insert(REASON, "network".parse().unwrap());
        let s = Status::with_metadata(Code::Unavailable, "down", md);
        let v = error_json(&s);
        assert_eq!(v["code"], "unavailable");
        assert_eq!(v["details"][0]["type"], "google.rpc.ErrorInfo");
        assert_eq!(v["details"][0]["debug"]["metadata"]["kind"], "bad_gateway");
        let raw = base64::engine::general_purpose::STANDARD_NO_PAD
            .decode(v["details"][0]["value"].as_str().unwrap())
            .unwrap();
        let info = <ErrorInfo as prost::Message>::decode(raw.as_slice()).unwrap();
        assert_eq!(info.reason, "network");
        assert_eq!(info.domain, "vak");
        let resp = unary_error(&s);
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(resp.headers()[KIND], "bad_gateway");
        let end = end_stream(Some(&s), &HeaderMap::new());
        let v: Value = serde_json::from_slice(&end[5..]).unwrap();
        assert_eq!(end[0], END_STREAM);
        assert_eq!(v["error"]["code"], "unavailable");
        assert_eq!(v["metadata"][KIND][0], "bad_gateway");
    }
}
