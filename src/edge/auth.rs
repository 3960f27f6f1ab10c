//! The guard every request passes first: the Host must be loopback (DNS rebinding), and every route but liveness needs the bearer token.

use super::errors::{grpc_content_type, refuse};
use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::Response;
use std::net::IpAddr;
use std::sync::Arc;
use tonic::Status;

pub struct Auth {
    token: String,
}

impl Auth {
    pub fn new(token: String) -> Arc<Auth> {
        Arc::new(Auth { token })
    }
}

/// Compares in time that depends only on the lengths, never on where the bytes differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = (a.len() ^ b.len()) as u8 | u8::from(a.len() != b.len());
    for (i, x) in a.iter().enumerate() {
        diff |= x ^ b.get(i).copied().unwrap_or(0);
    }
    diff == 0
}

/// Whether a Host / :authority value names this machine's loopback.
pub fn is_loopback_host(host: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        match rest.split_once(']') {
            Some((ip, port)) if port.is_empty() || port.starts_with(':') => ip,
            _ => return false,
        }
    } else {
        match host.rsplit_once(':') {
            Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
            Some(_) => return false,
            None => host,
        }
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

fn exempt(req: &Request) -> bool {
    let path = req.uri().path();
    (path == "/health" && req.method() == axum::http::Method::GET)
        || path.starts_with("/grpc.health.v1.Health/")
}

pub async fn guard(State(auth): State<Arc<Auth>>, req: Request, next: Next) -> Response {
    let grpc = grpc_content_type(req.headers());
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| req.uri().authority().map(|a| a.as_str()));
    if !host.is_some_and(is_loopback_host) {
        return refuse(
            grpc,
            Status::permission_denied("the Host header must name a loopback host (DNS rebinding protection)"),
        );
    }
    if exempt(&req) {
        return next.run(req).await;
    }
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.strip_prefix("Bearer "))
        .map(str::trim);
    match presented {
        Some(t) if constant_time_eq(t.as_bytes(), auth.token.as_bytes()) => next.run(req).await,
        Some(_) => refuse(grpc, Status::unauthenticated("the bearer token is not valid")),
        None => refuse(
            grpc,
            Status::unauthenticated("missing `Authorization: Bearer <token>`"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts() {
        for ok in [
            "localhost",
            "LOCALHOST:8901",
            "127.0.0.1",
            "127.0.0.1:1",
            "127.9.9.9:80",
            "[::1]",
            "[::1]:8901",
        ] {
            assert!(is_loopback_host(ok), "{ok}");
        }
        for bad in [
            "evil.com",
            "evil.com:8901",
            "10.0.0.1",
            "[::1]x",
            "localhost.evil.com",
            "127.0.0.1:80x",
            "",
            "[fe80::1]:1",
        ] {
            assert!(!is_loopback_host(bad), "{bad}");
        }
    }

    #[test]
    fn token_comparison() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(!constant_time_eq(b"", b"x"));
        assert!(constant_time_eq(b"", b""));
    }
}
