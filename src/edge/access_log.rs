//! One log line per request on every surface (REST, SSE, gRPC, gRPC-web): method, path, status, latency, peer; written when the response body ends, so a stream's line carries its whole duration and a gRPC call its grpc-status.

use super::body::{watched, Watch};
use super::listener::PeerAddr;
use axum::body::Bytes;
use axum::extract::Request;
use axum::http::{HeaderMap, Method, Uri};
use axum::middleware::Next;
use axum::response::Response;
use std::time::{Duration, Instant};

/// The middleware: outermost, so refusals by the guard are logged too.
pub async fn access_log(req: Request, next: Next) -> Response {
    let start = Instant::now();
    let method = req.method().clone();
    let target = redacted(req.uri());
    let peer = req
        .extensions()
        .get::<PeerAddr>()
        .map_or_else(|| "-".to_string(), |p| p.0.to_string());
    let resp = next.run(req).await;
    let line = Line {
        method,
        target,
        peer,
        status: resp.status().as_u16(),
        grpc_status: grpc_status(resp.headers()),
        start,
        headers_after: start.elapsed(),
    };
    let (parts, body) = resp.into_parts();
    let body = watched(
        body,
        Logged {
            line,
            complete: false,
        },
    );
    Response::from_parts(parts, body)
}

/// Path and query, with the value of any `token` or `key` parameter
/// replaced: a credential never reaches a log.
fn redacted(uri: &Uri) -> String {
    let Some(query) = uri.query() else {
        return uri.path().to_string();
    };
    let query: Vec<&str> = query
        .split('&')
        .map(|pair| {
            // Decoded as the guard decodes it, so `to%6Ben=` is caught too.
            let key = serde_urlencoded::from_str::<Vec<(String, String)>>(pair)
                .ok()
                .and_then(|kv| kv.into_iter().next())
                .map(|(k, _)| k);
            match key.as_deref() {
                Some("token") => "token=[redacted]",
                Some("key") => "key=[redacted]",
                _ => pair,
            }
        })
        .collect();
    format!("{}?{}", uri.path(), query.join("&"))
}

fn grpc_status(headers: &HeaderMap) -> Option<u16> {
    headers.get("grpc-status")?.to_str().ok()?.parse().ok()
}

struct Line {
    method: Method,
    target: String,
    peer: String,
    status: u16,
    /// From the headers (a trailers-only answer) or, later, the trailers.
    grpc_status: Option<u16>,
    start: Instant,
    headers_after: Duration,
}

/// The line, written when the response body is dropped (ended, or cut by the client).
struct Logged {
    line: Line,
    complete: bool,
}

impl Watch for Logged {
    fn frame(&mut self, frame: &http_body::Frame<Bytes>) {
        if let Some(code) = frame.trailers_ref().and_then(grpc_status) {
            self.line.grpc_status = Some(code);
        }
    }

    fn end(&mut self) {
        self.complete = true;
    }
}

impl Drop for Logged {
    fn drop(&mut self) {
        let l = &self.line;
        let complete = self.complete;
        tracing::info!(
            target: "vak::access",
            method = %l.method,
            path = %l.target,
            status = l.status,
            grpc_status = l.grpc_status,
            latency_ms = l.headers_after.as_millis() as u64,
            duration_ms = l.start.elapsed().as_millis() as u64,
            peer = %l.peer,
            ended = if complete { "complete" } else { "cut" },
            "request"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_values_never_reach_the_line() {
        let uri: Uri = "/sessions/a/events?after=3&token=s3cret&x=token&to%6Ben=s3cret"
            .parse()
            .unwrap();
        let line = redacted(&uri);
        assert_eq!(
            line,
            "/sessions/a/events?after=3&token=[redacted]&x=token&token=[redacted]"
        );
        assert!(!line.contains("s3cret"));
        let uri: Uri = "/stream?session=a&key=k3y".parse().unwrap();
        assert_eq!(redacted(&uri), "/stream?session=a&key=[redacted]");
        let uri: Uri = "/health".parse().unwrap();
        assert_eq!(redacted(&uri), "/health");
    }
}
