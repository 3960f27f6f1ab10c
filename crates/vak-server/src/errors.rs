//! The one table that maps core errors to gRPC codes and gRPC codes to HTTP statuses and `{"error": {"code", "message"}}` bodies.

use super::protocol::Protocol;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use tonic::{Code, Status};
use vak_core::error::{Error, ErrorKind};

/// A core error as the status a client sees. An internal error's message
/// names files and system errors of this machine: it goes to the server log
/// under an incident id, and the client gets the id, never the details.
pub(crate) fn to_status(e: Error) -> Status {
    let code = match e.kind {
        ErrorKind::InvalidArgument => Code::InvalidArgument,
        ErrorKind::NotFound => Code::NotFound,
        ErrorKind::Conflict => Code::FailedPrecondition,
        ErrorKind::Internal => {
            let incident = &uuid::Uuid::new_v4().simple().to_string()[..12];
            tracing::error!(incident, "internal error: {}", e.message);
            return Status::internal(format!(
                "internal error {incident}: the server log has the details"
            ));
        }
        ErrorKind::Unavailable => Code::Unavailable,
        ErrorKind::ResourceExhausted => Code::ResourceExhausted,
        // Both travel with their kind (and reason) in metadata, so REST can
        // tell them from the plain codes they share.
        ErrorKind::NoAiService => Code::FailedPrecondition,
        ErrorKind::Upstream => Code::Unavailable,
        ErrorKind::TooLarge => Code::OutOfRange,
        ErrorKind::PermissionDenied => Code::PermissionDenied,
        ErrorKind::DeadlineExceeded => Code::DeadlineExceeded,
    };
    match e.kind {
        ErrorKind::NoAiService | ErrorKind::Upstream | ErrorKind::TooLarge | ErrorKind::DeadlineExceeded => {
            let mut md = tonic::metadata::MetadataMap::new();
            md.insert(
                KIND_HEADER,
                tonic::metadata::MetadataValue::from_static(e.kind.code()),
            );
            if let Some(reason) = e.reason {
                md.insert(REASON_HEADER, tonic::metadata::MetadataValue::from_static(reason));
            }
            Status::with_metadata(code, e.message, md)
        }
        // Any other kind with a reason (a side run's `side_busy`, an
        // attachment's `unsupported_media_type`) keeps its code and carries
        // the reason beside it.
        _ => match e.reason {
            Some(reason) => {
                let mut md = tonic::metadata::MetadataMap::new();
                md.insert(REASON_HEADER, tonic::metadata::MetadataValue::from_static(reason));
                Status::with_metadata(code, e.message, md)
            }
            None => Status::new(code, e.message),
        },
    }
}

/// gRPC metadata naming the error kind of a status whose code alone is
/// ambiguous (`no_ai_service`, `bad_gateway`, `deadline_exceeded`).
pub(crate) const KIND_HEADER: &str = "vak-error-kind";
/// gRPC metadata with the machine-readable reason of an upstream failure.
pub(crate) const REASON_HEADER: &str = "vak-error-reason";

/// The REST answer of a status that carries a kind: `no_ai_service` is 400
/// with `"kind": "no_ai_service"`, an upstream failure 502 with its `reason`,
/// a file over a cap 413 (OUT_OF_RANGE alone is a 400), a search past its
/// deadline 408.
fn kind_response(s: &Status) -> Option<Response> {
    let kind = s.metadata().get(KIND_HEADER)?.to_str().ok()?;
    let reason = s.metadata().get(REASON_HEADER).and_then(|v| v.to_str().ok());
    let (status, mut error) = match kind {
        "no_ai_service" => (
            StatusCode::BAD_REQUEST,
            serde_json::json!({"code": "no_ai_service", "kind": "no_ai_service", "message": s.message()}),
        ),
        "bad_gateway" => (
            StatusCode::BAD_GATEWAY,
            serde_json::json!({"code": "bad_gateway", "message": s.message()}),
        ),
        "payload_too_large" => (
            StatusCode::PAYLOAD_TOO_LARGE,
            serde_json::json!({"code": "payload_too_large", "message": s.message()}),
        ),
        // The work the request asked for was stopped at its time limit (a
        // search): 408, as the search contract says; a bare
        // DEADLINE_EXCEEDED (no kind) stays 504.
        "deadline_exceeded" => (
            StatusCode::REQUEST_TIMEOUT,
            serde_json::json!({"code": "deadline_exceeded", "message": s.message()}),
        ),
        _ => return None,
    };
    if let Some(r) = reason {
        error["reason"] = r.into();
    }
    let body = serde_json::json!({ "error": error });
    let mut resp = (status, body.to_string()).into_response();
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    Some(resp)
}

/// The HTTP status and body code for a gRPC code.
pub(crate) fn http_of(code: Code) -> (StatusCode, &'static str) {
    match code {
        Code::InvalidArgument | Code::OutOfRange => (StatusCode::BAD_REQUEST, "invalid_argument"),
        Code::NotFound => (StatusCode::NOT_FOUND, "not_found"),
        Code::AlreadyExists | Code::FailedPrecondition | Code::Aborted => (StatusCode::CONFLICT, "conflict"),
        Code::Unauthenticated => (StatusCode::UNAUTHORIZED, "unauthenticated"),
        Code::PermissionDenied => (StatusCode::FORBIDDEN, "forbidden"),
        Code::ResourceExhausted => (StatusCode::TOO_MANY_REQUESTS, "resource_exhausted"),
        Code::Unimplemented => (StatusCode::NOT_IMPLEMENTED, "unimplemented"),
        Code::Unavailable => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
        Code::DeadlineExceeded => (StatusCode::GATEWAY_TIMEOUT, "deadline_exceeded"),
        _ => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
    }
}

/// A structured JSON error response.
pub(crate) fn json_error(status: StatusCode, code: &str, message: &str) -> Response {
    let body = serde_json::json!({ "error": { "code": code, "message": message } });
    let mut resp = (status, body.to_string()).into_response();
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if status == StatusCode::SERVICE_UNAVAILABLE {
        // Shutdown or a storage failure: both pass (a restart, a reload after a second).
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    resp
}

/// A gRPC status as a REST response.
pub(crate) fn status_response(s: &Status) -> Response {
    if let Some(resp) = kind_response(s) {
        return resp;
    }
    let (status, code) = http_of(s.code());
    match s.metadata().get(REASON_HEADER).and_then(|v| v.to_str().ok()) {
        Some(reason) => {
            let body =
                serde_json::json!({ "error": { "code": code, "reason": reason, "message": s.message() } });
            let mut resp = (status, body.to_string()).into_response();
            resp.headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
            if status == StatusCode::SERVICE_UNAVAILABLE {
                // A session served elsewhere (`--bus`) passes as the others do.
                resp.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            resp
        }
        None => json_error(status, code, s.message()),
    }
}

/// Refuses a request in the protocol it speaks: a trailers-only grpc-status
/// response labelled with the request's own gRPC or gRPC-web content type
/// (browser clients check it before the status), a Connect error for a
/// Connect call, JSON otherwise.
pub(crate) fn refuse(protocol: &Protocol, status: Status) -> Response {
    match protocol {
        Protocol::Grpc { content_type, .. } => {
            let mut resp = status.into_http::<axum::body::Body>();
            resp.headers_mut()
                .insert(header::CONTENT_TYPE, content_type.clone());
            resp
        }
        Protocol::Connect(call) => super::connect::error::refusal(call, &status),
        Protocol::Rest => status_response(&status),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_details_stay_in_the_log() {
        let s = to_status(Error::internal(
            "cannot create ledger /home/me/.local/share/vak/sessions/x.jsonl: Too many open files",
        ));
        assert_eq!(s.code(), Code::Internal);
        assert!(!s.message().contains('/'), "{}", s.message());
        assert!(s.message().starts_with("internal error "), "{}", s.message());
    }

    #[tokio::test]
    async fn every_core_error_has_one_status() {
        let cases = [
            (ErrorKind::InvalidArgument, 400),
            (ErrorKind::NotFound, 404),
            (ErrorKind::Conflict, 409),
            (ErrorKind::Internal, 500),
            (ErrorKind::Unavailable, 503),
            (ErrorKind::ResourceExhausted, 429),
            (ErrorKind::NoAiService, 400),
            (ErrorKind::Upstream, 502),
            (ErrorKind::TooLarge, 413),
            (ErrorKind::PermissionDenied, 403),
            (ErrorKind::DeadlineExceeded, 408),
        ];
        for (kind, http) in cases {
            let s = to_status(Error::new(kind, "m"));
            let resp = status_response(&s);
            assert_eq!(resp.status().as_u16(), http, "{kind:?}");
            if !matches!(
                kind,
                ErrorKind::NoAiService
                    | ErrorKind::Upstream
                    | ErrorKind::TooLarge
                    | ErrorKind::DeadlineExceeded
            ) {
                assert_eq!(http_of(s.code()).0.as_u16(), http);
            }
            assert_eq!(
                code_of(resp).await,
                if kind == ErrorKind::Conflict {
                    "conflict"
                } else {
                    kind.code()
                }
            );
        }
    }

    async fn code_of(resp: Response) -> String {
        use http_body_util::BodyExt;
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        v["error"]["code"].as_str().unwrap().to_string()
    }

    #[tokio::test]
    async fn an_unavailable_answer_with_a_reason_keeps_it_and_retry_after() {
        let e = Error::new(ErrorKind::Unavailable, "session s is written by replica ra")
            .with_reason("served_elsewhere");
        let resp = status_response(&to_status(e));
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(resp.headers()[header::RETRY_AFTER], "1");
        let body = axum::body::to_bytes(resp.into_body(), 1 << 16).await.unwrap();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["error"]["reason"], "served_elsewhere");
        assert_eq!(v["error"]["code"], "unavailable");
    }

    #[tokio::test]
    async fn no_ai_service_and_upstream_failures_keep_their_kind_and_reason() {
        use http_body_util::BodyExt;
        let s = to_status(Error::new(ErrorKind::NoAiService, "no key"));
        assert_eq!(s.code(), Code::FailedPrecondition);
        let body = status_response(&s)
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["error"]["kind"], "no_ai_service");
        let s = to_status(Error::new(ErrorKind::Upstream, "could not reach").with_reason("network"));
        let resp = status_response(&s);
        assert_eq!(resp.status(), StatusCode::BAD_GATEWAY);
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["error"]["reason"], "network");
        assert_eq!(v["error"]["code"], "bad_gateway");
    }
}
