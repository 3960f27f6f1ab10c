//! A Connect unary call (POST with a plain body, or GET with the message in the query) as one gRPC call: the message in, the one answer or the error JSON out, under the call's timeout.

use super::codec::{envelope, Deframer, Encoding, COMPRESS_MIN};
use super::error::{copy_metadata, unary_error};
use super::{content_type, grpc_request, Prepared};
use crate::protocol::{query_bytes, query_value};
use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use base64::Engine;
use http_body_util::BodyExt;
use tonic::{Code, Status};
use tower::ServiceExt;

pub(super) async fn serve(grpc: Router, prep: Prepared, req: Request, max_body: usize) -> Response {
    let accept = Encoding::accepted(
        req.headers()
            .get(header::ACCEPT_ENCODING)
            .and_then(|v| v.to_str().ok()),
    );
    let call = async {
        let (message, req) = read(req, max_body).await?;
        let message = prep.transcoder.request(message)?;
        let req = grpc_request(req, Body::from(envelope(0, &message)));
        let resp = grpc.oneshot(req).await.unwrap_or_else(|never| match never {});
        answer(resp, &prep, accept).await
    };
    let result = match prep.timeout {
        Some(d) => tokio::time::timeout(d, call)
            .await
            .unwrap_or_else(|_| Err(Status::deadline_exceeded("the call's connect-timeout-ms passed"))),
        None => call.await,
    };
    result.unwrap_or_else(|s| unary_error(&s))
}

/// The request's message, decompressed, and the request without its body.
async fn read(req: Request, max_body: usize) -> Result<(Bytes, Request), Status> {
    let (parts, body) = req.into_parts();
    let req = Request::from_parts(parts, Body::empty());
    if req.method() == axum::http::Method::GET {
        let uri = req.uri();
        let message = query_bytes(uri, "message").unwrap_or_default();
        let raw = if query_value(uri, "base64").as_deref() == Some("1") {
            let trimmed = message
                .strip_suffix(b"==")
                .or(message.strip_suffix(b"="))
                .unwrap_or(&message);
            base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(trimmed)
                .map_err(|e| Status::invalid_argument(format!("the message is not URL-safe base64: {e}")))?
        } else {
            message
        };
        if raw.len() > max_body {
            return Err(super::codec::too_large(max_body));
        }
        let encoding = Encoding::named(query_value(uri, "compression").as_deref())?;
        return Ok((encoding.decode(raw.into(), max_body)?, req));
    }
    let encoding = Encoding::named(
        req.headers()
            .get(header::CONTENT_ENCODING)
            .and_then(|v| v.to_str().ok()),
    );
    let encoding = match encoding {
        Ok(e) => e,
        Err(s) => {
            crate::body::drain(body).await;
            return Err(s);
        }
    };
    let body = http_body_util::Limited::new(body, max_body)
        .collect()
        .await
        .map_err(|e| match e.downcast::<http_body_util::LengthLimitError>() {
            Ok(_) => super::codec::too_large(max_body),
            Err(e) => Status::invalid_argument(format!("the request body could not be read: {e}")),
        })?
        .to_bytes();
    Ok((encoding.decode(body, max_body)?, req))
}

/// The gRPC answer as a Connect one: the one message, or the error.
async fn answer(resp: Response, prep: &Prepared, accept: Encoding) -> Result<Response, Status> {
    let (parts, body) = resp.into_parts();
    // Trailers-only: the status came with the headers, and holds their
    // metadata already.
    if let Some(status) = Status::from_header_map(&parts.headers) {
        return Err(status);
    }
    let mut frames = Deframer::new(usize::MAX);
    let mut trailers = HeaderMap::new();
    let mut body = body;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| Status::internal(format!("the service's answer broke off: {e}")))?;
        match frame.into_data() {
            Ok(data) => frames.push(&data),
            Err(frame) => {
                if let Ok(t) = frame.into_trailers() {
                    trailers = t;
                }
            }
        }
    }
    let status = Status::from_header_map(&trailers)
        .unwrap_or_else(|| Status::internal("the service's answer ended without a status"));
    if status.code() != Code::Ok {
        return Err(with_headers(status, &parts.headers));
    }
    let Some((_, message)) = frames.next()? else {
        return Err(Status::internal("the service answered no message"));
    };
    let message = prep.transcoder.response(message)?;
    let mut out = Response::new(Body::empty());
    *out.status_mut() = StatusCode::OK;
    let h = out.headers_mut();
    copy_metadata(&parts.headers, h, "");
    copy_metadata(&trailers, h, "trailer-");
    h.insert(header::CONTENT_TYPE, content_type(false, prep.transcoder.codec()));
    let body = if accept == Encoding::Gzip && message.len() >= COMPRESS_MIN {
        h.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        accept.encode(&message)
    } else {
        message
    };
    *out.body_mut() = Body::from(body);
    Ok(out.into_response())
}

/// A status with the response headers' metadata added to its own.
fn with_headers(status: Status, headers: &HeaderMap) -> Status {
    let mut md = status.metadata().clone().into_headers();
    copy_metadata(headers, &mut md, "");
    Status::with_details_and_metadata(
        status.code(),
        status.message().to_string(),
        Bytes::copy_from_slice(status.details()),
        tonic::metadata::MetadataMap::from_headers(md),
    )
}
