//! The guard every request passes first: Host pinning (DNS rebinding), CORS and the cross-origin rule for browsers, then credentials (bearer token, login cookie with its session key, or `?token=` from an unproxied loopback peer), plus the browser login routes.

use super::errors::{json_error, refuse};
use super::listener::{PeerAddr, Secure};
use super::logins::{constant_time_eq, Logins};
use super::protocol::Protocol;
use super::tickets::{link_path, TicketRefused, Tickets, TICKET_TTL};
use crate::metrics::{reject, Rejection};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tonic::Status;

/// The login cookie's name without its instance suffix (see [`cookie_name`]).
pub const COOKIE: &str = "vak_session";
/// The header that carries a login's session key next to its cookie.
pub const KEY_HEADER: &str = "x-vak-key";

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
    /// The login cookie's name, unique to this server's home ([`cookie_name`]);
    /// empty means plain `vak_session`.
    pub cookie_name: String,
    /// `--allow-remote`: a `?token=` URL credential is never accepted.
    pub allow_remote: bool,
    /// Where logins are kept across restarts (`<home>/logins.json`); None:
    /// in memory only.
    pub login_store: Option<std::path::PathBuf>,
    /// One-time login links waiting to be used.
    pub tickets: Tickets,
}

/// `vak_session_<16 hex>`: the home's path hashed, so two servers on one host
/// (which never share a home) never overwrite each other's cookie: browsers
/// scope cookies by host, not port.
pub fn cookie_name(home: &Path) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, home.as_os_str().as_encoded_bytes());
    let hex: String = digest.as_ref()[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("{COOKIE}_{hex}")
}

/// A warning for a token given on the command line (or VAK_TOKEN) that carries
/// under 128 bits: counted as 4 bits a character when it is all hex digits,
/// else 6 (the base64 alphabet), so 32 hex or 22 other characters are enough.
pub fn weak_token(token: &str) -> Option<String> {
    let chars = token.chars().count();
    let per_char = if token.chars().all(|c| c.is_ascii_hexdigit()) {
        4
    } else {
        6
    };
    let bits = chars * per_char;
    (bits < 128).then(|| {
        format!(
            "the token from --token/VAK_TOKEN is {chars} character{} (about {bits} bits, under 128): use at least 32 hex or 22 base64 characters (`openssl rand -hex 16`), or leave it out to use the home's kept 256-bit token",
            if chars == 1 { "" } else { "s" }
        )
    })
}

pub struct Auth {
    cfg: AuthConfig,
    /// Login cookie id -> its session key (which every cookie-authenticated
    /// request must present: `x-vak-key`, or `?key=` on a GET) and expiry.
    /// Opaque random ids: the token never leaves the server.
    logins: Arc<Logins>,
}

impl Auth {
    pub fn new(cfg: AuthConfig) -> Arc<Auth> {
        let logins = Logins::load(cfg.login_store.clone(), &cfg.token);
        Arc::new(Auth { cfg, logins })
    }

    fn token_ok(&self, presented: &str) -> bool {
        constant_time_eq(presented.as_bytes(), self.cfg.token.as_bytes())
    }

    fn cookie_name(&self) -> &str {
        if self.cfg.cookie_name.is_empty() {
            COOKIE
        } else {
            &self.cfg.cookie_name
        }
    }

    /// A live login's cookie together with that login's session key: the
    /// cookie alone is never enough, since browsers send it to every port of
    /// the host (another local web app would receive it).
    fn cookie_ok(&self, headers: &HeaderMap, url_key: Option<&str>) -> bool {
        let Some(id) = cookie(headers, self.cookie_name()) else {
            return false;
        };
        let Some(key) = headers.get(KEY_HEADER).and_then(|v| v.to_str().ok()).or(url_key) else {
            return false;
        };
        self.logins.check(id, key)
    }

    /// Whether a `?token=` may be taken from this request: only from a
    /// loopback peer, with no proxy in between (a reverse proxy on loopback
    /// would make every remote client a loopback peer) and not when the
    /// server is exposed with --allow-remote.
    fn url_token_allowed(&self, req: &Request) -> bool {
        let loopback = req
            .extensions()
            .get::<PeerAddr>()
            .is_some_and(|p| p.0.ip().to_canonical().is_loopback());
        loopback && !self.cfg.allow_remote && !proxied(req.headers())
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

/// A query parameter's value, if any.
fn query_param(req: &Request, name: &str) -> Option<String> {
    let q = req.uri().query()?;
    let pairs: Vec<(String, String)> = serde_urlencoded::from_str(q).ok()?;
    pairs.into_iter().find(|(k, _)| k == name).map(|(_, v)| v)
}

/// Whether a proxy says it forwarded this request (`Forwarded`,
/// `X-Forwarded-*`, `X-Real-IP`): its peer address is then the proxy's.
pub fn proxied(headers: &HeaderMap) -> bool {
    headers.contains_key(header::FORWARDED)
        || headers.contains_key("x-real-ip")
        || headers.keys().any(|k| k.as_str().starts_with("x-forwarded-"))
}

/// The authority a request names, or why it is refused: on HTTP/2 (and an
/// HTTP/1.1 absolute-form target) the request target's authority
/// (`:authority`), with any `host` header required to agree with it; on
/// HTTP/1.1 exactly one `Host` header (RFC 9112 §3.2: two are a 400).
fn authority(req: &Request) -> Result<Option<String>, Status> {
    let hosts: Vec<&str> = req
        .headers()
        .get_all(header::HOST)
        .iter()
        .map(|v| v.to_str().unwrap_or("\u{fffd}"))
        .collect();
    match req.uri().authority() {
        Some(a) => {
            if let Some(h) = hosts.iter().find(|h| !h.eq_ignore_ascii_case(a.as_str())) {
                return Err(Status::permission_denied(format!(
                    "the host header ({}) disagrees with the request's authority ({})",
                    h.chars().take(100).collect::<String>(),
                    a.as_str().chars().take(100).collect::<String>()
                )));
            }
            Ok(Some(a.as_str().to_string()))
        }
        None if hosts.len() > 1 && req.version() < axum::http::Version::HTTP_2 => Err(
            Status::invalid_argument("a request must carry exactly one Host header (RFC 9112)"),
        ),
        None if hosts.len() > 1 => Err(Status::permission_denied(
            "a request must carry at most one host header",
        )),
        None => Ok(hosts.first().map(|h| h.to_string())),
    }
}

/// A WebSocket handshake (`Upgrade: websocket`).
fn is_websocket(headers: &HeaderMap) -> bool {
    headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"))
}

fn is_state_changing(m: &Method) -> bool {
    !matches!(*m, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// What needs no credentials: liveness, gRPC health, the login routes,
/// reflection and the OpenAPI document, whose answers are the public proto
/// of this repository (so grpcurl, buf curl and OpenAPI tools can discover
/// the API before they hold a token), and the browser app's shell and assets
/// (its login form is part of it; every call it makes then needs the
/// cookie). `/admin` is not exempt.
fn exempt(req: &Request) -> bool {
    let path = req.uri().path();
    path == "/health"
        || path == "/openapi.json"
        || path == "/app"
        || path.starts_with("/app/")
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
            HeaderValue::from_static(
                "grpc-status, grpc-message, grpc-status-details-bin, connect-content-encoding, vak-error-kind, vak-error-reason",
            ),
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
            "authorization, content-type, content-encoding, last-event-id, x-grpc-web, x-user-agent, grpc-timeout, connect-protocol-version, connect-timeout-ms, connect-content-encoding, connect-accept-encoding, traceparent, x-vak-key",
        ),
    );
    h.insert(header::ACCESS_CONTROL_MAX_AGE, HeaderValue::from_static("600"));
    resp
}

pub async fn guard(State(auth): State<Arc<Auth>>, req: Request, next: Next) -> Response {
    let (mut resp, cross) = match admit(&auth, &req) {
        Verdict::Pass { cross } => (next.run(req).await, cross),
        Verdict::Answer { resp, cross } => {
            // The client may still be sending its body: read a bounded part
            // of it first, so the answer is not lost to a reset of a
            // connection closed with unread bytes in it (a client streams
            // its body while the refusal is already on its way).
            super::body::drain(req.into_body()).await;
            (resp, cross)
        }
    };
    if let Some(o) = cross {
        cors(&mut resp, &o);
    }
    resp
}

/// What the guard decided about a request.
enum Verdict {
    /// On to the routes; CORS headers for an allowed cross origin.
    Pass { cross: Option<String> },
    /// Answered here (a refusal, a preflight, the console's login page).
    Answer { resp: Response, cross: Option<String> },
}

fn admit(auth: &Auth, req: &Request) -> Verdict {
    let answer = |resp| Verdict::Answer { resp, cross: None };
    let protocol = Protocol::of(req.method(), req.uri(), req.headers());
    let host = match authority(req) {
        Ok(host) => host,
        Err(status) => {
            reject(Rejection::Host);
            return answer(refuse(&protocol, status));
        }
    };
    let Some(host) = host.filter(|h| auth.host_ok(h)) else {
        reject(Rejection::Host);
        return answer(refuse(
            &protocol,
            Status::permission_denied(
                "the Host header must name a loopback or trusted host (DNS rebinding protection)",
            ),
        ));
    };
    let secure = req.extensions().get::<Secure>().is_some_and(|s| s.0);
    let own = format!("{}://{host}", if secure { "https" } else { "http" });
    let origin = header_str(req, header::ORIGIN).map(str::to_string);

    if req.method() == Method::OPTIONS && req.headers().contains_key(header::ACCESS_CONTROL_REQUEST_METHOD) {
        return answer(match origin.as_deref() {
            Some(o) if auth.origin_ok(o, &own) => preflight(o),
            _ => {
                reject(Rejection::Origin);
                json_error(
                    StatusCode::FORBIDDEN,
                    "forbidden",
                    "this origin may not call this server",
                )
            }
        });
    }
    if let Some(o) = origin.as_deref() {
        // A WebSocket is a GET a page on any site may open (and a browser
        // sends it the cookie): its Origin is checked like a POST's, or a
        // page elsewhere could drive a terminal (cross-site WebSocket hijacking).
        if (is_state_changing(req.method()) || is_websocket(req.headers())) && !auth.origin_ok(o, &own) {
            reject(Rejection::Origin);
            return answer(refuse(
                &protocol,
                Status::permission_denied(format!("cross-origin requests from {o} are refused")),
            ));
        }
    }
    let cross = origin.filter(|o| auth.allowed_cross_origin(o));

    // EventSource cannot send headers: a URL token is taken only from this
    // machine with no proxy in between (where no proxy logs it), and a URL
    // session key only on a GET (it is half a credential: the cookie is the other).
    let url_token = query_param(req, "token");
    let url_token_refused = url_token.is_some() && !auth.url_token_allowed(req);
    let url_key = (req.method() == Method::GET)
        .then(|| query_param(req, "key"))
        .flatten();
    let allowed = exempt(req)
        || match bearer(req.headers()) {
            Some(t) => auth.token_ok(t),
            None => {
                auth.cookie_ok(req.headers(), url_key.as_deref())
                    || (!url_token_refused && url_token.is_some_and(|t| auth.token_ok(&t)))
            }
        };
    if !allowed {
        reject(Rejection::Auth);
    }
    if allowed {
        return Verdict::Pass { cross };
    }
    let resp = if url_token_refused {
        refuse(
            &protocol,
            Status::unauthenticated(
                "`?token=` is accepted only from this machine, never through a proxy or with --allow-remote: send `Authorization: Bearer <token>` or log in",
            ),
        )
    } else if protocol == Protocol::Rest && crate::http::assets::is_console_page(req) {
        // A person opening the console before logging in: a page, not JSON.
        crate::http::assets::console_login_page()
    } else {
        refuse(
            &protocol,
            Status::unauthenticated(
                "missing or invalid credentials: send `Authorization: Bearer <token>` or log in",
            ),
        )
    };
    Verdict::Answer { resp, cross }
}

fn authenticated(yes: bool) -> Response {
    json_body(format!(r#"{{"authenticated":{yes}}}"#))
}

fn json_body(body: String) -> Response {
    let mut resp = body.into_response();
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

fn set_cookie(resp: &mut Response, name: &str, value: &str, max_age: u64, secure: bool) {
    let cookie = format!(
        "{name}={value}; Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age}{}",
        if secure { "; Secure" } else { "" }
    );
    if let Ok(v) = HeaderValue::from_str(&cookie) {
        resp.headers_mut().append(header::SET_COOKIE, v);
    }
}

/// POST /auth/login {token} or {ticket}: a `vak_session_<instance>` cookie for a browser,
/// and in the body `{"authenticated":true,"key":"..."}`, the session key the
/// page keeps in its origin's storage and sends with every request. A
/// ticket (a one-time login link's) works once, within a minute of being made.
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
    let body = serde_json::from_slice::<serde_json::Value>(&bytes).ok();
    let field = |name: &str| {
        body.as_ref()
            .and_then(|v| v.get(name).and_then(|t| t.as_str()).map(str::to_string))
    };
    let (token, ticket) = (field("token"), field("ticket"));
    if let Some(ticket) = ticket {
        if !auth.cfg.tickets.redeem(&ticket) {
            match peer {
                Some(p) => tracing::warn!(peer = %p, "failed login (a login link not valid)"),
                None => tracing::warn!("failed login (a login link not valid)"),
            }
            return json_error(
                StatusCode::UNAUTHORIZED,
                "unauthenticated",
                "this login link is not valid: it works once, within a minute of being made; run `vak open` for a new one",
            );
        }
        return logged_in(&auth, secure).await;
    }
    let Some(token) = token else {
        return json_error(
            StatusCode::BAD_REQUEST,
            "invalid_argument",
            "expected {\"token\": \"...\"} or {\"ticket\": \"...\"}",
        );
    };
    if !auth.token_ok(&token) {
        // The presented value is never logged.
        match peer {
            Some(p) => tracing::warn!(peer = %p, "failed login"),
            None => tracing::warn!("failed login (peer unknown)"),
        }
        return json_error(
            StatusCode::UNAUTHORIZED,
            "unauthenticated",
            "the token is not valid",
        );
    }
    logged_in(&auth, secure).await
}

/// A new login: its cookie, and its session key in the body.
async fn logged_in(auth: &Auth, secure: bool) -> Response {
    let (id, key) = auth.logins.add(auth.cfg.login_ttl).await;
    let mut resp = json_body(format!(r#"{{"authenticated":true,"key":"{key}"}}"#));
    set_cookie(
        &mut resp,
        auth.cookie_name(),
        &id,
        auth.cfg.login_ttl.as_secs(),
        secure,
    );
    resp
}

/// POST /auth/ticket, with the bearer token only (never a login: a login
/// cannot make more logins): a one-time login link,
/// `{"ticket","path":"/app/#ticket=…","expires_in_s":60}`; 429 while
/// `MAX_TICKETS` links wait.
pub async fn ticket(State(auth): State<Arc<Auth>>, req: Request<Body>) -> Response {
    if !bearer(req.headers()).is_some_and(|t| auth.token_ok(t)) {
        return json_error(
            StatusCode::UNAUTHORIZED,
            "unauthenticated",
            "a login link needs `Authorization: Bearer <token>`",
        );
    }
    match auth.cfg.tickets.issue() {
        Ok(ticket) => json_body(
            serde_json::json!({
                "ticket": ticket,
                "path": link_path(&ticket),
                "expires_in_s": TICKET_TTL.as_secs(),
            })
            .to_string(),
        ),
        Err(TicketRefused::TooMany) => json_error(
            StatusCode::TOO_MANY_REQUESTS,
            "resource_exhausted",
            "too many login links are waiting to be used; use one, or wait a minute",
        ),
    }
}

/// POST /auth/logout: forgets the cookie on both sides. The cookie alone is
/// enough here: ending a login only ever takes access away.
pub async fn logout(State(auth): State<Arc<Auth>>, req: Request<Body>) -> Response {
    let secure = req.extensions().get::<Secure>().is_some_and(|s| s.0);
    if let Some(id) = cookie(req.headers(), auth.cookie_name()) {
        auth.logins.remove(id).await;
    }
    let mut resp = authenticated(false);
    set_cookie(&mut resp, auth.cookie_name(), "", 0, secure);
    resp
}

/// GET /auth/session: 200 {authenticated} either way, so "not logged in" is
/// distinguishable from "unreachable". A cookie counts only with its key.
pub async fn session(State(auth): State<Arc<Auth>>, req: Request<Body>) -> Response {
    let headers = req.headers();
    let bearer = bearer(headers).is_some_and(|t| auth.token_ok(t));
    let url_key = query_param(&req, "key");
    authenticated(bearer || auth.cookie_ok(headers, url_key.as_deref()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A refusal waits for the body the client is still sending (hyper
    /// closes a connection whose body is unread after one poll, and a
    /// client then writing it gets a reset instead of the answer).
    #[tokio::test]
    async fn a_refusal_is_answered_once_the_body_has_arrived() {
        use futures_util::FutureExt;
        use tower::ServiceExt;
        let auth = Auth::new(AuthConfig {
            token: "t".repeat(32),
            ..Default::default()
        });
        let app = axum::Router::new()
            .route("/sessions", axum::routing::post(|| async { "never" }))
            .layer(axum::middleware::from_fn_with_state(auth, guard));
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Result<bytes::Bytes, std::io::Error>>(1);
        let body = Body::from_stream(futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx)));
        let req = Request::post("/sessions")
            .header(header::HOST, "127.0.0.1")
            .body(body)
            .unwrap();
        let mut answer = Box::pin(app.oneshot(req));
        assert!(
            (&mut answer).now_or_never().is_none(),
            "answered before the body came"
        );
        tx.send(Ok(bytes::Bytes::from_static(b"{}"))).await.unwrap();
        drop(tx);
        let resp = answer.await.unwrap();
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    }

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
    fn a_token_under_128_bits_is_weak() {
        assert!(weak_token("T").is_some_and(|w| w.contains("1 character (about 6 bits")));
        assert!(weak_token(&"f".repeat(31)).is_some_and(|w| w.contains("about 124 bits")));
        assert!(weak_token(&"f".repeat(32)).is_none());
        assert!(weak_token(&"Z".repeat(21)).is_some());
        assert!(weak_token(&"Z".repeat(22)).is_none());
    }

    #[test]
    fn each_home_has_its_own_cookie_name() {
        let a = cookie_name(Path::new("/home/a/.local/share/vak"));
        let b = cookie_name(Path::new("/home/b/.local/share/vak"));
        assert_ne!(a, b);
        assert_eq!(a, cookie_name(Path::new("/home/a/.local/share/vak")));
        assert!(
            a.starts_with("vak_session_") && a.len() == "vak_session_".len() + 16,
            "{a}"
        );
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
