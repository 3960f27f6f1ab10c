//! The browser app's delivery end to end (/app and /admin): the shell and hashed assets with their cache headers, the Content-Security-Policy, precompressed gzip and brotli, the page a binary without the bundle answers, the auth exemption of /app paths only, and traversal refused.

use crate::support::*;
use bytes::Bytes;
use std::sync::Arc;
use vak::edge::http::assets::{Bundle, CSP};

const SHELL: &str =
    "<!doctype html><title>vak</title><script type=\"module\" src=\"/app/assets/app-ABC123.js\"></script>";
const ADMIN: &str = "<!doctype html><title>vak admin</title>";
const JS: &str = "console.log('app')";

/// A bundle laid out as `npm run build:app` lays it out (with stand-in encodings).
fn bundle() -> Arc<Bundle> {
    let f = |p: &str, b: &'static [u8]| (p.to_string(), Bytes::from_static(b));
    Arc::new(Bundle::from_files([
        f("index.html", SHELL.as_bytes()),
        f("index.html.gz", b"shell-gzip"),
        f("admin.html", ADMIN.as_bytes()),
        f("assets/app-ABC123.js", JS.as_bytes()),
        f("assets/app-ABC123.js.gz", b"js-gzip"),
        f("assets/app-ABC123.js.br", b"js-brotli"),
        f(".gitignore", b"*"),
    ]))
}

async fn with_bundle() -> TestServer {
    let b = bundle();
    TestServer::start_with(move |c| c.app = Some(b)).await
}

/// GET with these headers and no credentials: (status, headers, body bytes).
async fn get(
    s: &TestServer,
    path: &str,
    headers: &[(&str, &str)],
) -> (u16, reqwest::header::HeaderMap, Bytes) {
    let mut req = reqwest::Client::new().get(format!("{}{path}", s.url));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let r = req.send().await.unwrap();
    (r.status().as_u16(), r.headers().clone(), r.bytes().await.unwrap())
}

fn header(h: &reqwest::header::HeaderMap, name: &str) -> String {
    h.get(name)
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default()
}

#[tokio::test]
async fn the_shell_is_no_cache_for_every_app_route_with_a_strict_csp_and_no_credentials() {
    let s = with_bundle().await;
    for path in ["/app", "/app/", "/app/s/0123abcd", "/app/s/0123abcd/"] {
        let (status, h, body) = get(&s, path, &[]).await;
        assert_eq!(status, 200, "{path} is served without credentials");
        assert_eq!(body, SHELL.as_bytes(), "{path} is the shell");
        assert_eq!(header(&h, "content-type"), "text/html; charset=utf-8");
        assert_eq!(header(&h, "cache-control"), "no-cache", "{path}");
        assert_eq!(header(&h, "content-security-policy"), CSP);
        assert_eq!(
            CSP,
            "default-src 'self'; script-src 'self'; connect-src 'self'; style-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'"
        );
        assert_eq!(header(&h, "x-content-type-options"), "nosniff");
        assert!(header(&h, "etag").starts_with('"'), "{path} has an etag");
    }
    // Revalidation: the same shell is a 304 with no body.
    let (_, h, _) = get(&s, "/app", &[]).await;
    let etag = header(&h, "etag");
    let (status, h, body) = get(&s, "/app/", &[("if-none-match", &etag)]).await;
    assert_eq!(status, 304);
    assert!(body.is_empty());
    assert_eq!(header(&h, "cache-control"), "no-cache");
    let (status, _, _) = get(&s, "/app/", &[("if-none-match", "\"other\"")]).await;
    assert_eq!(status, 200, "another etag gets the shell");
    // The shell comes gzipped to a client that takes gzip.
    let (_, h, body) = get(&s, "/app", &[("accept-encoding", "gzip")]).await;
    assert_eq!(header(&h, "content-encoding"), "gzip");
    assert_eq!(body, &b"shell-gzip"[..]);
}

#[tokio::test]
async fn hashed_assets_are_immutable_and_precompressed_by_accept_encoding() {
    let s = with_bundle().await;
    let path = "/app/assets/app-ABC123.js";
    for (accept, encoding, body) in [
        ("gzip, deflate, br", "br", &b"js-brotli"[..]),
        ("gzip", "gzip", &b"js-gzip"[..]),
        ("br;q=0, gzip", "gzip", &b"js-gzip"[..]),
        ("identity", "", JS.as_bytes()),
    ] {
        let (status, h, got) = get(&s, path, &[("accept-encoding", accept)]).await;
        assert_eq!(status, 200, "{accept}");
        assert_eq!(header(&h, "content-encoding"), encoding, "{accept}");
        assert_eq!(got, body, "{accept}");
        assert_eq!(header(&h, "cache-control"), "public, max-age=31536000, immutable");
        assert_eq!(header(&h, "content-type"), "text/javascript; charset=utf-8");
        assert_eq!(header(&h, "vary"), "Accept-Encoding");
        assert_eq!(header(&h, "content-security-policy"), CSP);
    }
    let (status, _, body) = get(&s, path, &[]).await;
    assert_eq!(
        (status, body.as_ref()),
        (200, JS.as_bytes()),
        "no Accept-Encoding: as is"
    );
    // An asset this build does not have is a 404, never the shell; so are the encodings as files.
    for missing in [
        "/app/assets/app-OLD999.js",
        "/app/assets/app-ABC123.js.gz",
        "/app/assets/",
    ] {
        let (status, h, body) = get(&s, missing, &[]).await;
        assert_eq!(status, 404, "{missing}");
        assert!(
            String::from_utf8_lossy(&body).contains("\"not_found\""),
            "{missing}"
        );
        assert_eq!(header(&h, "content-security-policy"), CSP);
    }
}

#[tokio::test]
async fn only_app_paths_are_exempt_from_credentials() {
    let s = with_bundle().await;
    for path in ["/admin", "/admin/", "/appx", "/apps/x", "/sessions", "/config"] {
        let (status, _, _) = get(&s, path, &[]).await;
        assert_eq!(status, 401, "{path} needs credentials");
    }
    // /admin with the token, or with a login cookie and its key in the URL (the app's link).
    let (status, _, _) = get(&s, "/admin", &[("authorization", &format!("Bearer {TOKEN}"))]).await;
    assert_eq!(status, 200);
    let c = reqwest::Client::new();
    let r = c
        .post(format!("{}/auth/login", s.url))
        .json(&serde_json::json!({"token": TOKEN}))
        .send()
        .await
        .unwrap();
    let cookie = header(r.headers(), "set-cookie")
        .split(';')
        .next()
        .unwrap()
        .to_string();
    let key = r.json::<serde_json::Value>().await.unwrap()["key"]
        .as_str()
        .unwrap()
        .to_string();
    let (status, h, body) = get(&s, &format!("/admin?key={key}"), &[("cookie", &cookie)]).await;
    assert_eq!((status, body.as_ref()), (200, ADMIN.as_bytes()));
    assert_eq!(header(&h, "cache-control"), "no-cache");
    assert_eq!(header(&h, "content-security-policy"), CSP);
    let (status, _, _) = get(&s, "/admin", &[("cookie", &cookie)]).await;
    assert_eq!(status, 401, "the cookie alone is not enough");
    // A browser opening the console before logging in gets a page that says how, still a 401.
    let (status, h, body) = get(&s, "/admin", &[("accept", "text/html,application/xhtml+xml")]).await;
    assert_eq!(status, 401);
    assert_eq!(header(&h, "content-type"), "text/html; charset=utf-8");
    assert_eq!(header(&h, "content-security-policy"), CSP);
    assert!(String::from_utf8_lossy(&body).contains("href=\"/app/\""));
    let (status, h, _) = get(&s, "/admin/status", &[("accept", "text/html")]).await;
    assert_eq!(
        (status, header(&h, "content-type").as_str()),
        (401, "application/json"),
        "the API stays JSON"
    );
    // A query on the shell is refused like on any route (the app routes by path).
    let (status, _, _) = get(&s, "/app?session=x", &[]).await;
    assert_eq!(status, 400);
}

#[tokio::test]
async fn traversal_and_encoded_segments_under_app_are_refused() {
    let s = with_bundle().await;
    for path in [
        "/app/../sessions",
        "/app/assets/../../Cargo.toml",
        "/app/assets/..%2f..%2fCargo.toml",
        "/app/%2e%2e/%2e%2e/Cargo.toml",
        "/app/assets/./app-ABC123.js",
        "/app/assets//app-ABC123.js",
        "/app/assets/..\\..\\Cargo.toml",
    ] {
        let head = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
        let resp = s.raw_http1_response(&head).await;
        assert!(resp.starts_with("HTTP/1.1 400 "), "{path}: {resp}");
        assert!(resp.contains("invalid_argument"), "{path}: {resp}");
        assert!(
            !resp.contains("[package]") && !resp.contains("\"sessions\""),
            "{path}: {resp}"
        );
    }
}

#[tokio::test]
async fn without_the_bundle_app_and_admin_say_how_to_build_it() {
    let s = TestServer::start_with(|c| c.app = Some(Arc::new(Bundle::from_files([])))).await;
    for (path, auth) in [
        ("/app", false),
        ("/app/s/x", false),
        ("/app/assets/app-1.js", false),
        ("/admin", true),
    ] {
        let mut headers = vec![];
        let bearer = format!("Bearer {TOKEN}");
        if auth {
            headers.push(("authorization", bearer.as_str()));
        }
        let (status, h, body) = get(&s, path, &headers).await;
        let body = String::from_utf8_lossy(&body);
        if path.contains("/assets/") {
            assert_eq!(status, 404, "{path}");
            continue;
        }
        assert_eq!(status, 200, "{path}");
        assert_eq!(header(&h, "content-type"), "text/html; charset=utf-8");
        assert_eq!(header(&h, "cache-control"), "no-cache");
        assert_eq!(header(&h, "content-security-policy"), CSP);
        assert!(
            body.contains("make serve") && body.contains("make app"),
            "{path}: {body}"
        );
        assert!(
            !body.contains("<script") && !body.contains("<style"),
            "nothing inline: {body}"
        );
    }
}

#[tokio::test]
async fn admin_status_shows_streams_per_client_presence_and_recent_failures_never_a_credential() {
    let s = TestServer::start_with(|c| c.max_streams_per_client = 1).await;
    let (status, _) = {
        let r = reqwest::Client::new()
            .get(format!("{}/admin/status", s.url))
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), ())
    };
    assert_eq!(status, 401, "the console's data needs credentials");

    let sid = s.create_session().await;
    let sse = s.open_stream(&s.url, &format!("session={sid}"), None).await;
    let stream_id = sse.opened.as_ref().unwrap().data["stream_id"]
        .as_str()
        .unwrap()
        .to_string();
    // A second stream from this machine is past the per-client cap: a 429 the console lists,
    // with the URL token redacted.
    let r = reqwest::Client::new()
        .get(format!("{}/stream?session={sid}&token={TOKEN}", s.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    drop(r);

    let (code, body) = s.get("/admin/status").await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["open_streams"], 1, "{body}");
    assert_eq!(body["max_streams_per_client"], 1);
    assert_eq!(body["max_streams"], 16384);
    assert_eq!(
        body["clients"],
        serde_json::json!([{"client": "loopback", "open_streams": 1}])
    );
    assert_eq!(body["streams"], serde_json::json!([stream_id]));
    let session = body["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["session_id"] == sid.as_str())
        .unwrap_or_else(|| panic!("{body}"));
    assert_eq!(session["busy"], false);
    let clients = session["clients"].as_array().unwrap();
    assert_eq!(clients.len(), 1, "{session}");
    assert_eq!(
        (&clients[0]["client_id"], &clients[0]["surface"]),
        (&serde_json::json!(stream_id), &serde_json::json!("stream"))
    );
    assert!(
        humantime::parse_rfc3339(clients[0]["attached_at"].as_str().unwrap()).is_ok(),
        "{session}"
    );
    // The access log records the refusal when its answer ends.
    let mut errors = body["recent_errors"].clone();
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while errors.as_array().is_none_or(|a| a.is_empty()) {
        assert!(tokio::time::Instant::now() < deadline, "no recent error: {body}");
        tokio::task::yield_now().await;
        errors = s.get("/admin/status").await.1["recent_errors"].clone();
    }
    let e = &errors[0];
    assert_eq!(e["status"], 429, "{e}");
    assert_eq!(e["method"], "GET");
    assert_eq!(e["path"], format!("/stream?session={sid}&token=[redacted]"));
    assert!(e["message"].as_str().unwrap().contains("per-client limit"), "{e}");
    assert!(
        !errors.to_string().contains(TOKEN),
        "no credential in the console"
    );

    // gRPC sees the same; closing the stream frees its slot and its presence.
    let g = s
        .grpc()
        .await
        .get_admin_status(vak::proto::v1::GetAdminStatusRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(g.open_streams, 1);
    assert_eq!(g.streams, vec![stream_id.clone()]);
    drop(sse);
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let (_, b) = s.get("/admin/status").await;
        if b["open_streams"] == 0 && b["streams"] == serde_json::json!([]) {
            assert_eq!(b["clients"], serde_json::json!([]));
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the stream is still counted: {b}"
        );
        crate::support::poll::pause().await;
    }
}
