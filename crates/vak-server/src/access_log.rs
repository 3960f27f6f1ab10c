//! One log line per request on every surface (REST, SSE, gRPC, gRPC-web, Connect): protocol, method, path, status, latency, peer; written when the response body ends, so a stream's line carries its whole duration and a gRPC call its grpc-status. Failures an operator should see also go to the console's recent errors.

use super::body::{watched, Watch};
use super::listener::PeerAddr;
use super::protocol::Protocol;
use super::recent_errors::{noteworthy, RecentError, RecentErrors};
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, Uri};
use axum::middleware::Next;
use axum::response::Response;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

/// How much of a failed REST answer's body is read for its `error.message`.
const ERROR_BODY: usize = 4096;

/// The middleware: outermost, so refusals by the guard are logged too.
pub(crate) async fn access_log(
    State(errors): State<Arc<RecentErrors>>,
    req: Request,
    next: Next,
) -> Response {
    let start = Instant::now();
    let method = req.method().clone();
    let protocol = Protocol::of(&method, req.uri(), req.headers()).name();
    let target = redacted(req.uri());
    let peer = req
        .extensions()
        .get::<PeerAddr>()
        .map_or_else(|| "-".to_string(), |p| p.0.to_string());
    let resp = next.run(req).await;
    let line = Line {
        protocol,
        method,
        target,
        peer,
        status: resp.status().as_u16(),
        grpc_status: grpc_status(resp.headers()),
        grpc_message: grpc_message(resp.headers()),
        start,
        headers_after: start.elapsed(),
    };
    let error_body = noteworthy(line.status, None).then(Vec::new);
    let (parts, body) = resp.into_parts();
    let body = watched(
        body,
        Logged {
            line,
            complete: false,
            errors,
            error_body,
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

/// `grpc-message`, percent-decoded as the gRPC spec encodes it.
fn grpc_message(headers: &HeaderMap) -> Option<String> {
    let raw = headers.get("grpc-message")?.as_bytes();
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (
            raw[i],
            raw.get(i + 1).copied().and_then(hex),
            raw.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    Some(String::from_utf8_lossy(&out).into_owned())
}

struct Line {
    method: Method,
    target: String,
    peer: String,
    status: u16,
    /// From the headers (a trailers-only answer) or, later, the trailers.
    grpc_status: Option<u16>,
    grpc_message: Option<String>,
    /// rest, grpc, grpc_web or connect.
    protocol: &'static str,
    start: Instant,
    headers_after: Duration,
}

/// The line, written when the response body is dropped (ended, or cut by the client).
struct Logged {
    line: Line,
    complete: bool,
    errors: Arc<RecentErrors>,
    /// The start of a failed answer's body, for its JSON `error.message`.
    error_body: Option<Vec<u8>>,
}

impl Watch for Logged {
    fn frame(&mut self, frame: &http_body::Frame<Bytes>) {
        if let Some(trailers) = frame.trailers_ref() {
            if let Some(code) = grpc_status(trailers) {
                self.line.grpc_status = Some(code);
            }
            if let Some(m) = grpc_message(trailers) {
                self.line.grpc_message = Some(m);
            }
        }
        if let (Some(buf), Some(data)) = (self.error_body.as_mut(), frame.data_ref()) {
            let room = ERROR_BODY.saturating_sub(buf.len());
            buf.extend_from_slice(&data[..data.len().min(room)]);
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
            protocol = l.protocol,
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
        if noteworthy(l.status, l.grpc_status) {
            let from_body = self.error_body.as_deref().and_then(|b| {
                let v: serde_json::Value = serde_json::from_slice(b).ok()?;
                Some(v.get("error")?.get("message")?.as_str()?.to_string())
            });
            self.errors.record(RecentError {
                at: humantime::format_rfc3339_seconds(SystemTime::now()).to_string(),
                method: l.method.to_string(),
                path: l.target.clone(),
                status: l.status,
                grpc_status: l.grpc_status,
                message: from_body.or_else(|| l.grpc_message.clone()).unwrap_or_default(),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_messages_are_percent_decoded() {
        let mut h = HeaderMap::new();
        h.insert(
            "grpc-message",
            "no%20session%20x%3A%20%E2%9C%93%2".parse().unwrap(),
        );
        assert_eq!(grpc_message(&h).unwrap(), "no session x: \u{2713}%2");
        assert_eq!(grpc_message(&HeaderMap::new()), None);
    }

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
