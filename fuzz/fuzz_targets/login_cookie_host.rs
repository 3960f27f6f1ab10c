//! The auth guard as a browser or attacker meets it: arbitrary Host, Origin,
//! Authorization, Cookie, query, method, path, peer and login body sent
//! through the real `auth::guard` and login routes on an axum router. It must
//! never panic, and:
//! - a request reaches a handler only with a loopback or trusted Host, and
//!   (outside /health, the health service and /auth/*) with the token as
//!   bearer, a live `vak_session` cookie, or `?token=` from a loopback peer;
//! - a state-changing request with a foreign Origin never reaches a handler;
//! - CORS never answers `*`, and answers only the allowed origin (or, for a
//!   preflight, the server's own);
//! - a login cookie is set only for the right token, is HttpOnly,
//!   SameSite=Strict, Secure exactly under TLS, and is never the token;
//! - the token never appears in a response unless the request put it in a
//!   place that is echoed (Host, Origin, path);
//! - `constant_time_eq` is equality and `is_loopback_host` accepts only
//!   authorities that name loopback.

#![no_main]

use axum::body::Body;
use axum::routing::{get, post};
use axum::Router;
use http::{header, HeaderValue, Method, Request, Response};
use http_body_util::BodyExt;
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use std::net::{IpAddr, SocketAddr};
use std::sync::LazyLock;
use std::time::Duration;
use tower::ServiceExt;
use vak::edge::auth::{self, constant_time_eq, is_loopback_host, Auth, AuthConfig, COOKIE};
use vak::edge::listener::{PeerAddr, Secure};

const TOKEN: &str = "fuzz-token-5f0c2a9e41d7";
const TRUSTED: &str = "vak.example.com";
const ALLOWED: &str = "http://localhost:5173";
const REACHED: &str = "x-fuzz-reached";

static RT: LazyLock<tokio::runtime::Runtime> = LazyLock::new(|| {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
});

#[derive(Arbitrary, Debug)]
struct Input<'a> {
    method: u8,
    path: u8,
    raw_path: &'a str,
    query: &'a str,
    query_token: bool,
    absolute_uri: bool,
    host: u8,
    raw_host: &'a [u8],
    origin: u8,
    raw_origin: &'a [u8],
    authorization: u8,
    raw_authorization: &'a [u8],
    cookie: u8,
    raw_cookie: &'a [u8],
    preflight: bool,
    loopback_peer: bool,
    secure: bool,
    body_token: bool,
    raw_body: &'a [u8],
    a: &'a [u8],
    b: &'a [u8],
}

fn app() -> Router {
    let auth = Auth::new(AuthConfig {
        token: TOKEN.into(),
        trusted_hosts: vec![TRUSTED.into()],
        allow_origins: vec![ALLOWED.into()],
        login_ttl: Duration::from_secs(3600),
        ..Default::default()
    });
    Router::new()
        .route("/auth/login", post(auth::login))
        .route("/auth/logout", post(auth::logout))
        .route("/auth/session", get(auth::session))
        .with_state(auth.clone())
        .fallback(|| async { ([(REACHED, "1")], "reached") })
        .layer(axum::middleware::from_fn_with_state(auth, auth::guard))
}

async fn send(app: &Router, req: Request<Body>) -> (Response<Body>, Vec<u8>) {
    let resp = app.clone().oneshot(req).await.expect("infallible");
    let (parts, body) = resp.into_parts();
    let bytes = body.collect().await.map(|c| c.to_bytes().to_vec()).unwrap_or_default();
    (Response::from_parts(parts, Body::empty()), bytes)
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}

/// `h` without a trailing `:digits` port.
fn host_name(h: &str) -> &str {
    match h.rsplit_once(':') {
        Some((n, p)) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => n,
        _ => h,
    }
}

/// An independent check of `is_loopback_host`: what it accepts must be an
/// HTTP authority (no userinfo) whose host is localhost or a loopback address.
fn names_loopback(h: &str) -> bool {
    let Ok(a) = h.parse::<http::uri::Authority>() else {
        return false;
    };
    if a.as_str().contains('@') {
        return false;
    }
    let host = a.host();
    let host = host
        .strip_prefix('[')
        .and_then(|x| x.strip_suffix(']'))
        .unwrap_or(host);
    host.eq_ignore_ascii_case("localhost") || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

fn pick(choice: u8, fixed: &[&[u8]], raw: &[u8]) -> Option<Vec<u8>> {
    match choice as usize % (fixed.len() + 2) {
        0 => None,
        1 => Some(raw.to_vec()),
        n => Some(fixed[n - 2].to_vec()),
    }
}

fuzz_target!(|input: Input<'_>| {
    assert_eq!(constant_time_eq(input.a, input.b), input.a == input.b);
    if let Ok(h) = std::str::from_utf8(input.raw_host) {
        if is_loopback_host(h) {
            assert!(names_loopback(h), "is_loopback_host accepted {h:?}");
        }
    }

    RT.block_on(async {
        let app = app();
        // A live login cookie to offer (or not) in the fuzzed request.
        let login = Request::post("/auth/login")
            .header(header::HOST, "localhost")
            .body(Body::from(format!(r#"{{"token":"{TOKEN}"}}"#)))
            .unwrap();
        let (resp, _) = send(&app, login).await;
        let set = resp.headers()[header::SET_COOKIE].to_str().unwrap().to_string();
        let live = set
            .split(';')
            .next()
            .and_then(|kv| kv.strip_prefix(&format!("{COOKIE}=")))
            .unwrap()
            .to_string();
        assert!(!live.is_empty() && !live.contains(TOKEN));

        let methods = [
            Method::GET,
            Method::POST,
            Method::OPTIONS,
            Method::HEAD,
            Method::PUT,
            Method::DELETE,
            Method::PATCH,
        ];
        let method = methods[input.method as usize % methods.len()].clone();
        let paths = [
            "/health",
            "/sessions",
            "/sessions/s1/run",
            "/auth/login",
            "/auth/logout",
            "/auth/session",
            "/stream",
            "/grpc.health.v1.Health/Check",
            "/vak.v1.AgentService/Run",
            "/healthz",
            "/auth",
            "/%61uth/login",
        ];
        let n = input.path as usize % (paths.len() + 1);
        let path = if n == paths.len() {
            format!("/{}", input.raw_path)
        } else {
            paths[n].to_string()
        };
        let query = if input.query_token {
            format!("token={TOKEN}&{}", input.query)
        } else {
            input.query.to_string()
        };

        let host = pick(
            input.host,
            &[
                b"localhost:8901",
                b"127.0.0.1",
                b"[::1]:8901",
                b"vak.example.com",
                b"VAK.Example.com:443",
                b"evil.com",
                b"localhost.evil.com",
                b"vak.example.com.evil",
            ],
            input.raw_host,
        );
        let host_str = host.as_deref().and_then(|h| std::str::from_utf8(h).ok());
        let scheme = if input.secure { "https" } else { "http" };
        let own = host_str.map(|h| format!("{scheme}://{h}"));
        let own_bytes = own.clone().unwrap_or_default().into_bytes();
        let origin = pick(
            input.origin,
            &[
                ALLOWED.as_bytes(),
                own_bytes.as_slice(),
                b"http://evil.com",
                b"null",
                b"HTTP://LOCALHOST:5173",
            ],
            input.raw_origin,
        );
        let bearer = format!("Bearer {TOKEN}");
        let authorization = pick(
            input.authorization,
            &[bearer.as_bytes(), b"Bearer wrong", b"Basic Zm9vOmJhcg=="],
            input.raw_authorization,
        );
        let with_live = format!("a=1; {COOKIE}={live}; b=2");
        let cookie = pick(
            input.cookie,
            &[with_live.as_bytes(), b"vak_session=forged", TOKEN.as_bytes()],
            input.raw_cookie,
        );
        let body = if input.body_token {
            format!(r#"{{"token":"{TOKEN}"}}"#).into_bytes()
        } else {
            input.raw_body.to_vec()
        };

        // The request, as the listener would hand it to the router.
        let target = if query.is_empty() {
            path.clone()
        } else {
            format!("{path}?{query}")
        };
        let absolute = host_str
            .filter(|_| input.absolute_uri)
            .map(|h| format!("{scheme}://{h}{target}"));
        let uri = absolute
            .as_deref()
            .and_then(|u| u.parse::<http::Uri>().ok())
            .or_else(|| target.parse::<http::Uri>().ok())
            .or_else(|| path.parse::<http::Uri>().ok())
            .unwrap_or_else(|| http::Uri::from_static("/"));
        let mut req = Request::builder()
            .method(method.clone())
            .uri(uri.clone())
            .body(Body::from(body.clone()))
            .unwrap();
        let h = req.headers_mut();
        let mut set_header = |name: header::HeaderName, v: &Option<Vec<u8>>| {
            if let Some(v) = v.as_deref().and_then(|v| HeaderValue::from_bytes(v).ok()) {
                h.insert(name, v);
            }
        };
        set_header(header::HOST, &host);
        set_header(header::ORIGIN, &origin);
        set_header(header::AUTHORIZATION, &authorization);
        set_header(header::COOKIE, &cookie);
        if input.preflight {
            h.insert(header::ACCESS_CONTROL_REQUEST_METHOD, HeaderValue::from_static("POST"));
        }
        let peer: SocketAddr = if input.loopback_peer {
            "127.0.0.1:50000".parse().unwrap()
        } else {
            "203.0.113.7:50000".parse().unwrap()
        };
        req.extensions_mut().insert(PeerAddr(peer));
        req.extensions_mut().insert(Secure(input.secure));

        // What the guard will see, computed independently.
        let sent = |name: header::HeaderName| -> Option<String> {
            req.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_string)
        };
        let eff_host = sent(header::HOST).or_else(|| uri.authority().map(|a| a.as_str().to_string()));
        let sent_origin = sent(header::ORIGIN);
        let sent_auth = req.headers().get(header::AUTHORIZATION).map(|v| v.as_bytes().to_vec());
        let sent_cookie = req.headers().get(header::COOKIE).map(|v| v.as_bytes().to_vec());
        let query_has_token = uri.query().is_some_and(|q| {
            form_urlencoded::parse(q.as_bytes()).any(|(k, v)| k == "token" && v == TOKEN)
        });
        let is_preflight = input.preflight && method == Method::OPTIONS;
        let state_changing = !matches!(method, Method::GET | Method::HEAD | Method::OPTIONS);
        let uri_path = uri.path().to_string();
        let exempt = (uri_path == "/health" && method == Method::GET)
            || uri_path.starts_with("/grpc.health.v1.Health/")
            || uri_path.starts_with("/auth/");

        let (resp, resp_body) = send(&app, req).await;
        let headers = resp.headers();
        let reached = headers.contains_key(REACHED);

        if reached {
            let h = eff_host.as_deref().expect("reached without any Host");
            assert!(
                is_loopback_host(h) || host_name(h).eq_ignore_ascii_case(TRUSTED),
                "reached with Host {h:?}"
            );
            assert!(names_loopback(h) || host_name(h).eq_ignore_ascii_case(TRUSTED));
            let creds = sent_auth.as_deref().is_some_and(|a| contains(a, TOKEN.as_bytes()))
                || sent_cookie.as_deref().is_some_and(|c| contains(c, live.as_bytes()))
                || (input.loopback_peer && query_has_token);
            assert!(exempt || creds, "reached {uri_path:?} without credentials");
            if state_changing {
                if let Some(o) = sent_origin.as_deref() {
                    let own = format!("{scheme}://{h}");
                    assert!(
                        o.eq_ignore_ascii_case(&own) || o.eq_ignore_ascii_case(ALLOWED),
                        "{method} from Origin {o:?} reached (own {own:?})"
                    );
                }
            }
        }

        // CORS: never a wildcard, only the allowed origin or (preflight) our own.
        if let Some(acao) = headers.get(header::ACCESS_CONTROL_ALLOW_ORIGIN) {
            let acao = acao.to_str().expect("ACAO is text");
            assert_ne!(acao, "*");
            assert_eq!(Some(acao), sent_origin.as_deref(), "ACAO is not the request's Origin");
            let own = eff_host.as_deref().map(|h| format!("{scheme}://{h}"));
            assert!(
                acao.eq_ignore_ascii_case(ALLOWED)
                    || (is_preflight && own.is_some_and(|o| o.eq_ignore_ascii_case(acao))),
                "CORS answered {acao:?}"
            );
        } else {
            assert!(!headers.contains_key(header::ACCESS_CONTROL_ALLOW_CREDENTIALS));
        }

        // Login cookies.
        for sc in headers.get_all(header::SET_COOKIE) {
            let sc = sc.to_str().expect("Set-Cookie is text");
            let value = sc
                .split(';')
                .next()
                .and_then(|kv| kv.strip_prefix(&format!("{COOKIE}=")))
                .expect("only vak_session is set");
            assert!(sc.contains("; HttpOnly") && sc.contains("; SameSite=Strict") && sc.contains("; Path=/"), "{sc}");
            assert_eq!(sc.contains("; Secure"), input.secure, "{sc}");
            assert!(!value.contains(TOKEN), "the cookie carries the token");
            if !value.is_empty() {
                assert!(contains(&body, TOKEN.as_bytes()), "a cookie without the token: {sc}");
                assert_eq!(uri_path, "/auth/login");
            }
        }

        // The token is never echoed, unless the request put it where it is echoed.
        let echoable = [
            sent_origin.as_deref().unwrap_or(""),
            eff_host.as_deref().unwrap_or(""),
            uri_path.as_str(),
        ];
        if !echoable.iter().any(|e| e.contains(TOKEN)) {
            assert!(!contains(&resp_body, TOKEN.as_bytes()), "the token is in a response body");
            for (name, v) in headers {
                assert!(!contains(v.as_bytes(), TOKEN.as_bytes()), "the token is in {name}");
            }
        }
    });
});
