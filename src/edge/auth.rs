//! The guard every request passes first: Host pinning (DNS rebinding), CORS and the cross-origin rule for browsers, then credentials (bearer token, login cookie, or `?token=` from loopback), plus the browser login routes.

use super::errors::{grpc_content_type, json_error, refuse};
use super::listener::{PeerAddr, Secure};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tonic::Status;

pub const COOKIE: &str = "vak_session";
/// Browser login sessions a server keeps at once; the oldest go first.
const MAX_LOGINS: usize = 10_000;

/// Who may reach the server and how.
#[derive(Clone, Debug, Default)]
pub struct AuthConfig {
    pub token: String,
    /// Host names (without port) accepted besides loopback.
    pub trusted_hosts: Vec<String>,
    /// Origins (scheme://host[:port]) allowed cross-origin: IDE webviews, a desktop shell.
    pub allow_origins: Vec<String>,
    /// How long a login cookie lives.
    pub login_ttl: Duration,
}

pub struct Auth {
    cfg: AuthConfig,
    /// Login cookie id -> expiry. Opaque random ids: the token never leaves the server.
    logins: Mutex<HashMap<String, Instant>>,
}

impl Auth {
    pub fn new(cfg: AuthConfig) -> Arc<Auth> {
        Arc::new(Auth {
            cfg,
            logins: Mutex::new(HashMap::new()),
        })
    }

    fn token_ok(&self, presented: &str) -> bool {
        constant_time_eq(presented.as_bytes(), self.cfg.token.as_bytes())
    }

    fn logins(&self) -> std::sync::MutexGuard<'_, HashMap<String, Instant>> {
        self.logins.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn cookie_ok(&self, headers: &HeaderMap) -> bool {
        let Some(id) = cookie(headers, COOKIE) else {
            return false;
        };
        let logins = self.logins();
        // Looked up by value, then compared in constant time.
        logins
            .iter()
            .any(|(k, exp)| constant_time_eq(k.as_bytes(), id.as_bytes()) && *exp > Instant::now())
    }

    fn login(&self) -> String {
        let id = format!(
            "{}{}",
            uuid::Uuid::new_v4().simple(),
            uuid::Uuid::new_v4().simple()
        );
        let mut logins = self.logins();
        let now = Instant::now();
        logins.retain(|_, exp| *exp > now);
        if logins.len() >= MAX_LOGINS {
            if let Some(oldest) = logins.iter().min_by_key(|(_, e)| **e).map(|(k, _)| k.clone()) {
                logins.remove(&oldest);
            }
        }
        logins.insert(id.clone(), now + self.cfg.login_ttl);
        id
    }

    fn host_ok(&self, host: &str) -> bool {
        is_loopback_host(host)
            || self
                .cfg
                .trusted_hosts
                .iter()
                .any(|t| strip_port(host).is_some_and(|h| h.eq_ignore_ascii_case(t)))
    }

    /// An Origin the server answers for: its own, or a configured one.
    fn origin_ok(&self, origin: &str, own: &str) -> bool {
        origin.eq_ignore_ascii_case(own) || self.allowed_cross_origin(origin)
    }

    fn allowed_cross_origin(&self, origin: &str) -> bool {
        self.cfg
            .allow_origins
            .iter()
            .any(|o| o.eq_ignore_ascii_case(origin))
    }
}

/// Compares in time that depends only on the lengths, never on where the bytes differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = u8::from(a.len() != b.len());
    for (i, x) in a.iter().enumerate() {
        diff |= x ^ b.get(i).copied().unwrap_or(0);
    }
    diff == 0
}

/// The host part of a Host / :authority value, without its port.
fn strip_port(host: &str) -> Option<&str> {
    if let Some(rest) = host.strip_prefix('[') {
        return match rest.split_once(']') {
            Some((ip, port)) if port.is_empty() || port.starts_with(':') => Some(ip),
            _ => None,
        };
    }
    match host.rsplit_once(':') {
        Some((h, port)) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => Some(h),
        Some(_) => None,
        None => Some(host),
    }
}

/// Whether a Host / :authority value names this machine's loopback.
pub fn is_loopback_host(host: &str) -> bool {
    strip_port(host).is_some_and(|name| {
        name.eq_ignore_ascii_case("localhost") || name.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
    })
}

/// One cookie's value from the Cookie headers.
fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.trim())
}

/// The `token` query parameter, if any.
fn query_token(req: &Request) -> Option<String> {
    let q = req.uri().query()?;
    let pairs: Vec<(String, String)> = serde_urlencoded::from_str(q).ok()?;
    pairs.into_iter().find(|(k, _)| k == "token").map(|(_, v)| v)
}

fn is_state_changing(m: &Method) -> bool {
    !matches!(*m, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// What needs no credentials: liveness, gRPC health, the login routes, and
/// reflection, whose answer is the public proto of this repository (so
/// grpcurl and buf curl can discover the API before they hold a token).
fn exempt(req: &Request) -> bool {
    let path = req.uri().path();
    path == "/health"
        || path.starts_with("/grpc.health.v1.Health/")
        || path.starts_with("/grpc.reflection.v1.ServerReflection/")
        || path.starts_with("/grpc.reflection.v1alpha.ServerReflection/")
        || path.starts_with("/auth/")
}

/// The credentials of `Authorization: Bearer <token>`; the scheme is
/// case-insensitive (RFC 9110 §11.1), so `bearer` and `BEARER` work too.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.trim_start().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then_some(token.trim())
}

fn header_str(req: &Request, name: header::HeaderName) -> Option<&str> {
    req.headers().get(name).and_then(|h| h.to_str().ok())
}

/// What CORS says to an allowed cross origin.
fn cors(resp: &mut Response, origin: &str) {
    let h = resp.headers_mut();
    if let Ok(v) = HeaderValue::from_str(origin) {
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, v);
        h.insert(
            header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
            HeaderValue::from_static("true"),
        );
        h.insert(
            header::ACCESS_CONTROL_EXPOSE_HEADERS,
            HeaderValue::from_static("grpc-status, grpc-message, grpc-status-details-bin"),
        );
        h.append(header::VARY, HeaderValue::from_static("Origin"));
    }
}

fn preflight(origin: &str) -> Response {
    let mut resp = StatusCode::NO_CONTENT.into_response();
    cors(&mut resp, origin);
    let h = resp.headers_mut();
    h.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static("GET, POST, PUT, PATCH, DELETE, OPTIONS"),
    );
    h.insert(
        header::ACCESS_CONTROL_ALLOW_HEADERS,
        HeaderValue::from_static(
            "authorization, content-type, last-event-id, x-grpc-web, x-user-agent, grpc-timeout, connect-protocol-version",
        ),
    );
    h.insert(header::ACCESS_CONTROL_MAX_AGE, HeaderValue::from_static("600"));
    resp
}

pub async fn guard(State(auth): State<Arc<Auth>>, req: Request, next: Next) -> Response {
    let grpc = grpc_content_type(req.headers());
    let host = header_str(&req, header::HOST)
        .or_else(|| req.uri().authority().map(|a| a.as_str()))
        .map(str::to_string);
    let Some(host) = host.filter(|h| auth.host_ok(h)) else {
        return refuse(
            grpc,
            Status::permission_denied(
                "the Host header must name a loopback or trusted host (DNS rebinding protection)",
            ),
        );
    };
    let secure = req.extensions().get::<Secure>().is_some_and(|s| s.0);
    let own = format!("{}://{host}", if secure { "https" } else { "http" });
    let origin = header_str(&req, header::ORIGIN).map(str::to_string);

    if req.method() == Method::OPTIONS && req.headers().contains_key(header::ACCESS_CONTROL_REQUEST_METHOD) {
        return match origin.as_deref() {
            Some(o) if auth.origin_ok(o, &own) => preflight(o),
            _ => json_error(
                StatusCode::FORBIDDEN,
                "forbidden",
                "this origin may not call this server",
            ),
        };
    }
    if let Some(o) = origin.as_deref() {
        if is_state_changing(req.method()) && !auth.origin_ok(o, &own) {
            return refuse(
                grpc,
                Status::permission_denied(format!("cross-origin requests from {o} are refused")),
            );
        }
    }
    let cross = origin.filter(|o| auth.allowed_cross_origin(o));

    let allowed = exempt(&req) || {
        match bearer(req.headers()) {
            Some(t) => auth.token_ok(t),
            None => {
                auth.cookie_ok(req.headers())
                    || query_token(&req).is_some_and(|t| {
                        // EventSource cannot send headers; a URL token is only
                        // taken from this machine, where no proxy logs it.
                        let loopback = req
                            .extensions()
                            .get::<PeerAddr>()
                            .is_some_and(|p| p.0.ip().is_loopback());
                        loopback && auth.token_ok(&t)
                    })
            }
        }
    };
    let mut resp = if allowed {
        next.run(req).await
    } else {
        refuse(
            grpc,
            Status::unauthenticated(
                "missing or invalid credentials: send `Authorization: Bearer <token>` or log in",
            ),
        )
    };
    if let Some(o) = cross {
        cors(&mut resp, &o);
    }
    resp
}

fn authenticated(yes: bool) -> Response {
    let mut resp = format!(r#"{{"authenticated":{yes}}}"#).into_response();
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

fn set_cookie(resp: &mut Response, value: &str, max_age: u64, secure: bool) {
    let cookie = format!(
        "{COOKIE}={value}; Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age}{}",
        if secure { "; Secure" } else { "" }
    );
    if let Ok(v) = HeaderValue::from_str(&cookie) {
        resp.headers_mut().append(header::SET_COOKIE, v);
    }
}

/// POST /auth/login {token}: a `vak_session` cookie for a browser.
pub async fn login(State(auth): State<Arc<Auth>>, req: Request<Body>) -> Response {
    let secure = req.extensions().get::<Secure>().is_some_and(|s| s.0);
    let peer = req.extensions().get::<PeerAddr>().map(|p| p.0);
    let bytes = match axum::body::to_bytes(req.into_body(), 64 * 1024).await {
        Ok(b) => b,
        Err(_) => {
            return json_error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                "the login body is too large",
            )
        }
    };
    let token = serde_json::from_slice::<serde_json::Value>(&bytes)
        .ok()
        .and_then(|v| v.get("token").and_then(|t| t.as_str()).map(str::to_string));
    let Some(token) = token else {
        return json_error(
            StatusCode::BAD_REQUEST,
            "invalid_argument",
            "expected {\"token\": \"...\"}",
        );
    };
    if !auth.token_ok(&token) {
        // The presented value is never logged.
        tracing::warn!(peer = ?peer, "failed login");
        return json_error(
            StatusCode::UNAUTHORIZED,
            "unauthenticated",
            "the token is not valid",
        );
    }
    let id = auth.login();
    let mut resp = authenticated(true);
    set_cookie(&mut resp, &id, auth.cfg.login_ttl.as_secs(), secure);
    resp
}

/// POST /auth/logout: forgets the cookie on both sides.
pub async fn logout(State(auth): State<Arc<Auth>>, req: Request<Body>) -> Response {
    let secure = req.extensions().get::<Secure>().is_some_and(|s| s.0);
    if let Some(id) = cookie(req.headers(), COOKIE) {
        auth.logins().remove(id);
    }
    let mut resp = authenticated(false);
    set_cookie(&mut resp, "", 0, secure);
    resp
}

/// GET /auth/session: 200 {authenticated} either way, so "not logged in" is
/// distinguishable from "unreachable".
pub async fn session(State(auth): State<Arc<Auth>>, headers: HeaderMap) -> Response {
    let bearer = bearer(&headers).is_some_and(|t| auth.token_ok(t));
    authenticated(bearer || auth.cookie_ok(&headers))
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
            "localhost:",
        ] {
            assert!(!is_loopback_host(bad), "{bad}");
        }
    }

    #[test]
    fn trusted_hosts_match_without_port() {
        let a = Auth::new(AuthConfig {
            trusted_hosts: vec!["vak.example.com".into()],
            ..Default::default()
        });
        assert!(a.host_ok("vak.example.com"));
        assert!(a.host_ok("VAK.example.com:443"));
        assert!(!a.host_ok("evil.vak.example.com"));
        assert!(!a.host_ok("vak.example.com.evil"));
    }

    #[test]
    fn token_comparison() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(!constant_time_eq(b"secret2", b"secret"));
        assert!(!constant_time_eq(b"", b"x"));
        assert!(constant_time_eq(b"", b""));
    }

    #[test]
    fn the_bearer_scheme_is_case_insensitive() {
        let with = |v: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(header::AUTHORIZATION, HeaderValue::from_static(v));
            bearer(&h).map(str::to_string)
        };
        for v in ["Bearer tok", "bearer tok", "BEARER tok", "bEaReR  tok "] {
            assert_eq!(with(v).as_deref(), Some("tok"), "{v}");
        }
        for v in ["Basic tok", "Bearertok", "Bearer", "tok"] {
            assert_eq!(with(v), None, "{v}");
        }
    }

    #[test]
    fn cookies() {
        let mut h = HeaderMap::new();
        h.append(
            header::COOKIE,
            HeaderValue::from_static("a=1; vak_session=abc ; b=2"),
        );
        assert_eq!(cookie(&h, COOKIE), Some("abc"));
        assert_eq!(cookie(&h, "zz"), None);
    }
}
