//! Secure exposure end to end: TLS on the one port (every surface, both ALPN protocols), Host pinning (HTTP/2 `:authority`, one Host on HTTP/1.1), browser login (a cookie counts only with its session key, and is named per server), origin rules and CORS, `?token=` from an unproxied loopback peer only, stream caps (every loopback address one client), a weak `--token` warned about, and reaping of slow or stalled clients.

use crate::support::*;
use serde_json::{json, Value};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use vak::proto::v1 as pb;

/// A TLS server with a fresh self-signed certificate; returns it and the certificate PEM.
async fn tls_server() -> (TestServer, Vec<u8>, tempfile::TempDir) {
    let certs = tempfile::tempdir().unwrap();
    let tls = vak::edge::tls::self_signed(certs.path()).unwrap();
    let pem = std::fs::read(&tls.cert_path).unwrap();
    let s = TestServer::start_with(|c| c.tls = Some(tls.config.clone())).await;
    (s, pem, certs)
}

fn https(s: &TestServer) -> String {
    format!("https://localhost:{}", s.addr.port())
}

fn tls_client(pem: &[u8], http1: bool) -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
    let b = reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(pem).unwrap())
        .default_headers(headers);
    let b = if http1 { b.http1_only() } else { b };
    b.build().unwrap()
}

#[tokio::test]
async fn rest_and_sse_run_over_tls_with_alpn_h2_and_http1() {
    let (s, pem, _certs) = tls_server().await;
    for (http1, version) in [
        (false, reqwest::Version::HTTP_2),
        (true, reqwest::Version::HTTP_11),
    ] {
        let c = tls_client(&pem, http1);
        let r = c.post(format!("{}/sessions", https(&s))).send().await.unwrap();
        assert_eq!(r.version(), version, "ALPN picked {version:?}");
        assert_eq!(r.status(), 201);
        let sid = r.json::<Value>().await.unwrap()["session_id"]
            .as_str()
            .unwrap()
            .to_string();
        let events = c
            .get(format!("{}/sessions/{sid}/events", https(&s)))
            .send()
            .await
            .unwrap();
        assert_eq!(events.version(), version);
        let mut sse = Sse::new(events);
        assert_eq!(sse.next().await.unwrap().event, "stream_opened");
        let r = c
            .post(format!("{}/sessions/{sid}/run", https(&s)))
            .json(&json!({"prompt": "over tls"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 202);
        let frames = sse.until("run_finished").await;
        assert_eq!(text_of(&frames), "echo: over tls");
    }
}

#[tokio::test]
async fn grpc_and_grpc_web_run_over_tls() {
    let (s, pem, _certs) = tls_server().await;
    let tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(&pem))
        .domain_name("localhost");
    let channel = tonic::transport::Endpoint::from_shared(https(&s))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut g = pb::agent_service_client::AgentServiceClient::with_interceptor(channel, Auth(TOKEN.into()));
    let sid = g
        .create_session(pb::CreateSessionRequest::default())
        .await
        .unwrap()
        .into_inner()
        .session_id;
    let mut stream = g
        .subscribe(pb::SubscribeRequest {
            session_id: sid.clone(),
            after: None,
        })
        .await
        .unwrap()
        .into_inner();
    let first = stream.message().await.unwrap().unwrap();
    assert!(matches!(first.kind, Some(pb::event::Kind::StreamOpened(_))));
    g.run(pb::RunRequest {
        session_id: sid.clone(),
        prompt: "grpc tls".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let mut text = String::new();
    loop {
        let e = tokio::time::timeout(DEADLINE, stream.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        match e.kind {
            Some(pb::event::Kind::TextDelta(t)) => text.push_str(&t.text),
            Some(pb::event::Kind::RunFinished(_)) => break,
            _ => {}
        }
    }
    assert_eq!(text, "echo: grpc tls");

    // gRPC-web over HTTP/1.1 on the same TLS port.
    let c = tls_client(&pem, true);
    let msg = prost::Message::encode_to_vec(&pb::GetTranscriptRequest { session_id: sid });
    let mut body = vec![0u8];
    body.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    body.extend_from_slice(&msg);
    let r = c
        .post(format!("{}/vak.v1.AgentService/GetTranscript", https(&s)))
        .header("content-type", "application/grpc-web+proto")
        .header("x-grpc-web", "1")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.version(), reqwest::Version::HTTP_11);
    let bytes = r.bytes().await.unwrap();
    assert_eq!(bytes[0], 0, "a data frame first");
    let len = u32::from_be_bytes(bytes[1..5].try_into().unwrap()) as usize;
    let t: pb::Transcript = prost::Message::decode(&bytes[5..5 + len]).unwrap();
    assert_eq!(t.messages[1].text, "echo: grpc tls");
    assert!(String::from_utf8_lossy(&bytes[5 + len..]).contains("grpc-status:0"));
}

#[tokio::test]
async fn plain_http_to_the_tls_port_is_refused_cleanly() {
    let (s, _pem, _certs) = tls_server().await;
    let r = reqwest::get(format!("http://127.0.0.1:{}/health", s.addr.port()))
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert!(r.text().await.unwrap().contains("https://"));
}

#[tokio::test]
async fn bad_tls_files_stop_startup_with_one_clear_line() {
    let dir = tempfile::tempdir().unwrap();
    let missing = vak::edge::tls::load(&dir.path().join("nope.pem"), &dir.path().join("nope.key"))
        .err()
        .unwrap();
    assert!(
        missing.message.contains("cannot read the TLS certificate"),
        "{missing}"
    );
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    vak::edge::tls::self_signed(a.path()).unwrap();
    vak::edge::tls::self_signed(b.path()).unwrap();
    let mismatched = vak::edge::tls::load(
        &a.path().join("tls/dev-cert.pem"),
        &b.path().join("tls/dev-key.pem"),
    )
    .err()
    .unwrap();
    assert!(mismatched.message.contains("does not fit"), "{mismatched}");
    assert!(!mismatched.message.contains('\n'));
    std::fs::write(dir.path().join("junk.pem"), "not pem").unwrap();
    let junk = vak::edge::tls::load(&dir.path().join("junk.pem"), &a.path().join("tls/dev-key.pem"))
        .err()
        .unwrap();
    assert!(junk.message.contains("no certificate"), "{junk}");
    // The development certificate is made once and reused.
    let first = vak::edge::tls::self_signed(a.path()).unwrap().fingerprint;
    assert_eq!(vak::edge::tls::self_signed(a.path()).unwrap().fingerprint, first);
}

#[tokio::test]
async fn host_pinning_accepts_loopback_and_trusted_hosts_only() {
    let plain = TestServer::start().await;
    let trusting = TestServer::start_with(|c| c.trusted_hosts = vec!["vak.example.com".into()]).await;
    let c = reqwest::Client::new();
    for (s, host, want) in [
        (&plain, "vak.example.com", 403),
        (&plain, "localhost:1", 200),
        (&trusting, "vak.example.com", 200),
        (&trusting, "VAK.EXAMPLE.COM:8443", 200),
        (&trusting, "evil.example.com", 403),
    ] {
        let r = c
            .get(format!("{}/sessions", s.url))
            .bearer_auth(TOKEN)
            .header("host", host)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), want, "{host}");
    }
}

fn set_cookie(r: &reqwest::Response) -> String {
    r.headers()["set-cookie"].to_str().unwrap().to_string()
}

#[tokio::test]
async fn browser_login_sets_a_strict_cookie_that_works_on_rest_and_sse() {
    let s = TestServer::start().await;
    let c = reqwest::Client::new();
    let u = &s.url;
    let r = c.get(format!("{u}/auth/session")).send().await.unwrap();
    assert_eq!(
        (r.status().as_u16(), r.json::<Value>().await.unwrap()),
        (200, json!({"authenticated": false}))
    );
    let r = c
        .post(format!("{u}/auth/login"))
        .json(&json!({"token": "wrong"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert!(r.headers().get("set-cookie").is_none());
    let body = r.text().await.unwrap();
    assert!(!body.contains("wrong"), "the presented value is never echoed");

    let r = c
        .post(format!("{u}/auth/login"))
        .json(&json!({"token": TOKEN}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let cookie = set_cookie(&r);
    assert!(cookie.starts_with("vak_session_"), "{cookie}");
    for flag in ["HttpOnly", "SameSite=Strict", "Path=/"] {
        assert!(cookie.contains(flag), "{cookie}");
    }
    assert!(
        !cookie.contains("Secure"),
        "no Secure flag over plain HTTP: {cookie}"
    );
    assert!(
        !cookie.contains(TOKEN),
        "the cookie is an opaque id, not the token"
    );
    let pair = cookie.split(';').next().unwrap().to_string();
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["authenticated"], true);
    let key = body["key"]
        .as_str()
        .expect("the login answers a session key")
        .to_string();
    assert!(key.len() >= 32 && !pair.contains(&key), "{key}");

    let r = c
        .post(format!("{u}/sessions"))
        .header("cookie", &pair)
        .header("x-vak-key", &key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201, "cookie-authenticated REST");
    let sid = r.json::<Value>().await.unwrap()["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    let r = c
        .get(format!("{u}/sessions/{sid}/events"))
        .header("cookie", &pair)
        .header("x-vak-key", &key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "cookie-authenticated SSE");
    let r = c
        .get(format!("{u}/auth/session"))
        .header("cookie", &pair)
        .header("x-vak-key", &key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.json::<Value>().await.unwrap(), json!({"authenticated": true}));

    let r = c
        .post(format!("{u}/auth/logout"))
        .header("cookie", &pair)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(set_cookie(&r).contains("Max-Age=0"));
    assert!(set_cookie(&r).starts_with(cookie.split('=').next().unwrap()));
    let r = c
        .get(format!("{u}/sessions"))
        .header("cookie", &pair)
        .header("x-vak-key", &key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401, "a logged-out cookie no longer works");
}

/// POST /auth/login: the `name=value` of its cookie and the session key of its body.
async fn login(c: &reqwest::Client, url: &str) -> (String, String) {
    let r = c
        .post(format!("{url}/auth/login"))
        .json(&json!({"token": TOKEN}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let pair = set_cookie(&r).split(';').next().unwrap().to_string();
    let key = r.json::<Value>().await.unwrap()["key"]
        .as_str()
        .unwrap()
        .to_string();
    (pair, key)
}

/// A gRPC-web unary call (binary framing, HTTP/1.1) with these headers; returns its grpc-status.
async fn grpc_web_status(url: &str, method: &str, msg: Vec<u8>, headers: &[(&str, &str)]) -> String {
    let mut body = vec![0u8];
    body.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    body.extend_from_slice(&msg);
    let mut req = reqwest::Client::new()
        .post(format!("{url}/vak.v1.AgentService/{method}"))
        .header("content-type", "application/grpc-web+proto")
        .header("x-grpc-web", "1");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let r = req.body(body).send().await.unwrap();
    assert_eq!(r.status(), 200);
    if let Some(s) = r.headers().get("grpc-status") {
        return s.to_str().unwrap().to_string();
    }
    let bytes = r.bytes().await.unwrap();
    let text = String::from_utf8_lossy(&bytes);
    let at = text.find("grpc-status:").expect("a grpc-status trailer");
    text[at + "grpc-status:".len()..]
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect()
}

#[tokio::test]
async fn a_login_cookie_is_a_credential_only_with_its_session_key() {
    let s = TestServer::start().await;
    let u = &s.url;
    let sid = s.create_session().await;
    let c = reqwest::Client::new();
    let (cookie, key) = login(&c, u).await;
    let (other_cookie, other_key) = login(&c, u).await;
    assert_ne!(key, other_key);

    // What another local web app that received the cookie can do with it: nothing.
    let get = |path: String, headers: Vec<(&'static str, String)>| {
        let mut r = c.get(format!("{u}{path}"));
        for (k, v) in headers {
            r = r.header(k, v);
        }
        async move { r.send().await.unwrap().status().as_u16() }
    };
    let rest = "/sessions".to_string();
    let sse = format!("/sessions/{sid}/events");
    let stream = format!("/stream?session={sid}");
    for path in [&rest, &sse, &stream] {
        assert_eq!(
            get(path.clone(), vec![("cookie", cookie.clone())]).await,
            401,
            "cookie alone: {path}"
        );
        assert_eq!(
            get(path.clone(), vec![("x-vak-key", key.clone())]).await,
            401,
            "key alone: {path}"
        );
        assert_eq!(
            get(
                path.clone(),
                vec![("cookie", cookie.clone()), ("x-vak-key", other_key.clone())]
            )
            .await,
            401,
            "another login's key: {path}"
        );
        assert_eq!(
            get(
                path.clone(),
                vec![("cookie", cookie.clone()), ("x-vak-key", key.clone())]
            )
            .await,
            200,
            "cookie and key: {path}"
        );
        assert_eq!(
            get(
                path.clone(),
                vec![("cookie", other_cookie.clone()), ("x-vak-key", other_key.clone())]
            )
            .await,
            200,
            "the other login, whole: {path}"
        );
    }
    // EventSource cannot send headers: `?key=` stands in for the header, on a GET.
    let sep = |p: &str| if p.contains('?') { '&' } else { '?' };
    for path in [&sse, &stream] {
        let with_key = format!("{path}{}key={key}", sep(path));
        assert_eq!(
            get(with_key.clone(), vec![("cookie", cookie.clone())]).await,
            200,
            "{with_key}"
        );
        assert_eq!(
            get(with_key.clone(), vec![]).await,
            401,
            "?key= alone: {with_key}"
        );
        let wrong = format!("{path}{}key={other_key}", sep(path));
        assert_eq!(get(wrong, vec![("cookie", cookie.clone())]).await, 401);
    }
    // Not on a mutation, where fetch can always send the header.
    let r = c
        .post(format!("{u}/sessions?key={key}"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401, "?key= on a POST");
    let r = c
        .post(format!("{u}/sessions"))
        .header("cookie", &cookie)
        .header("x-vak-key", &key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);

    // gRPC-web, as a browser page's fetch would send it.
    let msg = prost::Message::encode_to_vec(&pb::GetTranscriptRequest {
        session_id: sid.clone(),
    });
    let call = |h: Vec<(&'static str, String)>| {
        let msg = msg.clone();
        async move {
            let h: Vec<(&str, &str)> = h.iter().map(|(k, v)| (*k, v.as_str())).collect();
            grpc_web_status(u, "GetTranscript", msg, &h).await
        }
    };
    assert_eq!(
        call(vec![("cookie", cookie.clone())]).await,
        "16",
        "gRPC-web, cookie alone"
    );
    assert_eq!(
        call(vec![("x-vak-key", key.clone())]).await,
        "16",
        "gRPC-web, key alone"
    );
    assert_eq!(
        call(vec![("cookie", cookie.clone()), ("x-vak-key", other_key.clone())]).await,
        "16",
        "gRPC-web, another login's key"
    );
    assert_eq!(
        call(vec![("cookie", cookie.clone()), ("x-vak-key", key.clone())]).await,
        "0",
        "gRPC-web, cookie and key"
    );

    // GET /auth/session says the same.
    for (headers, want) in [
        (vec![("cookie", cookie.clone())], false),
        (vec![("cookie", cookie.clone()), ("x-vak-key", key.clone())], true),
    ] {
        let mut r = c.get(format!("{u}/auth/session"));
        for (k, v) in headers {
            r = r.header(k, v);
        }
        let v: Value = r.send().await.unwrap().json().await.unwrap();
        assert_eq!(v, json!({"authenticated": want}));
    }
    // A browser page calling cross-origin may send the key header.
    let s2 = TestServer::start_with(|c| c.allow_origins = vec!["http://127.0.0.1:1".into()]).await;
    let r = c
        .request(reqwest::Method::OPTIONS, format!("{}/sessions", s2.url))
        .header("origin", "http://127.0.0.1:1")
        .header("access-control-request-method", "POST")
        .header("access-control-request-headers", "x-vak-key")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    assert!(r.headers()["access-control-allow-headers"]
        .to_str()
        .unwrap()
        .contains("x-vak-key"));
}

#[tokio::test]
async fn two_servers_on_one_host_keep_separate_login_cookies() {
    let a = TestServer::start().await;
    let b = TestServer::start().await;
    // One cookie jar for the host, as a browser keeps it: cookies ignore ports.
    let c = reqwest::Client::builder().cookie_store(true).build().unwrap();
    let (cookie_a, key_a) = login(&c, &a.url).await;
    let (cookie_b, key_b) = login(&c, &b.url).await;
    let name = |pair: &str| pair.split('=').next().unwrap().to_string();
    assert_ne!(name(&cookie_a), name(&cookie_b), "the cookie names differ");
    assert!(name(&cookie_a).starts_with("vak_session_"));
    // Logging into b did not overwrite a's cookie in the shared jar.
    for (s, key) in [(&a, &key_a), (&b, &key_b)] {
        let r = c
            .get(format!("{}/sessions", s.url))
            .header("x-vak-key", key)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{}", s.url);
        let v: Value = c
            .get(format!("{}/auth/session", s.url))
            .header("x-vak-key", key)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(v, json!({"authenticated": true}));
    }
    // Logging out of a leaves b logged in.
    let r = c.post(format!("{}/auth/logout", a.url)).send().await.unwrap();
    assert!(set_cookie(&r).starts_with(&format!("{}=;", name(&cookie_a))));
    let r = c
        .get(format!("{}/sessions", b.url))
        .header("x-vak-key", &key_b)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // The same home keeps its name across restarts.
    let (home, ws) = a.stop().await.unwrap();
    let again = TestServer::start_in(home.path(), ws.path(), |_| {}).await;
    let (cookie_again, _) = login(&c, &again.url).await;
    assert_eq!(name(&cookie_again), name(&cookie_a));
}

#[tokio::test]
async fn the_login_cookie_is_secure_under_tls() {
    let (s, pem, _certs) = tls_server().await;
    let c = tls_client(&pem, true);
    let r = c
        .post(format!("{}/auth/login", https(&s)))
        .json(&json!({"token": TOKEN}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(set_cookie(&r).contains("; Secure"));
}

#[tokio::test]
async fn a_url_token_is_accepted_only_from_loopback_peers() {
    let s = TestServer::start().await;
    let r = reqwest::get(format!("{}/sessions?token={TOKEN}", s.url))
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "loopback: EventSource-style ?token= works");
    let r = reqwest::get(format!("{}/sessions?token=nope", s.url))
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let req = |q: &str| {
        axum::http::Request::get(format!("/sessions{q}"))
            .header("host", "127.0.0.1")
            .body(axum::body::Body::empty())
            .unwrap()
    };
    assert_eq!(
        from_peer(&s, "10.1.2.3:5555", req(&format!("?token={TOKEN}"))).await,
        401
    );
    assert_eq!(
        from_peer(&s, "127.0.0.1:5555", req(&format!("?token={TOKEN}"))).await,
        200
    );
}

#[tokio::test]
async fn cross_origin_mutations_are_refused_and_cors_answers_allowed_origins_only() {
    let s = TestServer::start_with(|c| c.allow_origins = vec!["vscode-webview://ide".into()]).await;
    let h = s.http();
    let u = &s.url;
    let own = format!("http://{}", s.addr);
    let r = h
        .post(format!("{u}/sessions"))
        .header("origin", "https://evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403, "a foreign page cannot create sessions");
    assert!(r.headers().get("access-control-allow-origin").is_none());
    let r = h
        .post(format!("{u}/sessions"))
        .header("origin", &own)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201, "same origin");
    let r = h
        .post(format!("{u}/sessions"))
        .header("origin", "vscode-webview://ide")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201, "allowed origin");
    assert_eq!(r.headers()["access-control-allow-origin"], "vscode-webview://ide");
    assert_eq!(r.headers()["access-control-allow-credentials"], "true");
    // A foreign GET is not a mutation, but CORS never lets the page read it.
    let r = h
        .get(format!("{u}/sessions"))
        .header("origin", "https://evil.example")
        .send()
        .await
        .unwrap();
    assert!(r.headers().get("access-control-allow-origin").is_none());

    let c = reqwest::Client::new();
    let pre = |origin: &str| {
        c.request(reqwest::Method::OPTIONS, format!("{u}/sessions"))
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .header("access-control-request-headers", "authorization, content-type")
            .send()
    };
    let r = pre("vscode-webview://ide").await.unwrap();
    assert_eq!(r.status(), 204);
    assert_eq!(r.headers()["access-control-allow-origin"], "vscode-webview://ide");
    assert!(r.headers()["access-control-allow-headers"]
        .to_str()
        .unwrap()
        .contains("authorization"));
    let r = pre("https://evil.example").await.unwrap();
    assert_eq!(r.status(), 403);
    assert!(r.headers().get("access-control-allow-origin").is_none());
    // A cross-origin login is a mutation too.
    let r = c
        .post(format!("{u}/auth/login"))
        .header("origin", "https://evil.example")
        .json(&json!({"token": TOKEN}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
}

#[tokio::test]
async fn stream_caps_refuse_with_429_and_resource_exhausted_then_free_up() {
    let s = TestServer::start_with(|c| {
        c.max_streams_per_client = 2;
        c.max_streams = 1000;
    })
    .await;
    let sid = s.create_session().await;
    let a = s.events(&sid, None).await;
    let _b = s.events(&sid, None).await;
    let r = s
        .http()
        .get(format!("{}/sessions/{sid}/events", s.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "resource_exhausted");
    assert!(v["error"]["message"].as_str().unwrap().contains("limit"));
    let mut g = s.grpc().await;
    let e = g
        .subscribe(pb::SubscribeRequest {
            session_id: sid.clone(),
            after: None,
        })
        .await
        .map(|_| ())
        .expect_err("over the cap");
    assert_eq!(e.code(), tonic::Code::ResourceExhausted);
    drop(a);
    // The slot frees once the server notices the closed stream.
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let r = s
            .http()
            .get(format!("{}/sessions/{sid}/events", s.url))
            .send()
            .await
            .unwrap();
        if r.status() == 200 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the slot was never freed");
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn a_slow_header_writer_is_cut_off() {
    let s = TestServer::start_with(|c| c.header_read_timeout = Duration::from_millis(300)).await;
    let mut tcp = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    tcp.write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        .await
        .unwrap();
    let mut buf = Vec::new();
    // The server closes the connection (read_to_end returns) instead of waiting forever.
    let _ = tokio::time::timeout(DEADLINE, tcp.read_to_end(&mut buf))
        .await
        .expect("closed within the deadline");
    assert!(
        !String::from_utf8_lossy(&buf).contains("200 OK"),
        "no response to half a request"
    );
}

/// Polls until a new SSE stream on `sid` is admitted (its slot is free), within the deadline.
async fn wait_for_a_free_slot(s: &TestServer, sid: &str) {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let r = s
            .http()
            .get(format!("{}/sessions/{sid}/events", s.url))
            .send()
            .await
            .unwrap();
        if r.status() == 200 {
            return;
        }
        assert_eq!(r.status(), 429);
        assert!(tokio::time::Instant::now() < deadline, "the slot was never freed");
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn a_client_that_stops_reading_is_reaped_and_its_stream_released() {
    // One stream per client: the stalled client's slot shows whether it still holds a subscription.
    let s = TestServer::start_with(|c| {
        c.write_timeout = Duration::from_millis(300);
        c.max_streams_per_client = 1;
        // So large that the bus never drops it for lagging: only the write timeout can.
        c.core.bus.max_queued_bytes = 1 << 30;
        c.core.bus.queue = 1 << 20;
    })
    .await;
    let busy = s.create_session().await;
    let idle = s.create_session().await;
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    let mut stalled = sock.connect(s.addr).await.unwrap();
    let req = format!(
        "GET /sessions/{busy}/events HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n\r\n"
    );
    stalled.write_all(req.as_bytes()).await.unwrap();
    let mut head = [0u8; 12];
    stalled.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");
    let r = s
        .http()
        .get(format!("{}/sessions/{idle}/events", s.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429, "the stalled client holds its one slot");
    // Flood its session far past what the socket buffers hold; it never reads.
    s.run(&busy, "/burst 300000").await;
    wait_for_a_free_slot(&s, &idle).await;
    drop(stalled);
}

/// An h2c (prior knowledge) client that connects every name to this server, as a
/// proxy or a DNS rebinding page would reach it under another name.
fn h2_client(s: &TestServer) -> reqwest::Client {
    reqwest::Client::builder()
        .http2_prior_knowledge()
        .resolve("evil.example", s.addr)
        .build()
        .unwrap()
}

#[tokio::test]
async fn on_http2_the_authority_is_checked_and_a_conflicting_host_is_refused() {
    let s = TestServer::start().await;
    let c = h2_client(&s);
    let port = s.addr.port();
    let evil = format!("http://evil.example:{port}/sessions");
    let own = format!("http://127.0.0.1:{port}/sessions");
    for (url, host, want) in [
        // `:authority: evil.example` with `host: 127.0.0.1` is not let through by the host header.
        (&evil, Some("127.0.0.1"), 403),
        (&evil, Some(format!("127.0.0.1:{port}")).as_deref(), 403),
        (&evil, None, 403),
        (&own, Some("evil.example"), 403),
        (&own, Some("127.0.0.2"), 403),
        (&own, None, 200),
        (&own, Some(format!("127.0.0.1:{port}")).as_deref(), 200),
    ] {
        let mut req = c.get(url.as_str()).bearer_auth(TOKEN);
        if let Some(h) = host {
            req = req.header("host", h);
        }
        let r = req.send().await.unwrap();
        assert_eq!(r.version(), reqwest::Version::HTTP_2);
        assert_eq!(r.status(), want, "{url} with host {host:?}");
        if want == 403 {
            let v: Value = r.json().await.unwrap();
            assert_eq!(v["error"]["code"], "forbidden", "{v}");
        }
    }

    // gRPC: the channel's origin is the :authority.
    #[derive(Clone)]
    struct Host(Option<&'static str>);
    impl tonic::service::Interceptor for Host {
        fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
            req.metadata_mut()
                .insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
            if let Some(h) = self.0 {
                req.metadata_mut().insert("host", h.parse().unwrap());
            }
            Ok(req)
        }
    }
    for (origin, host, want) in [
        (
            "http://evil.example:1",
            Some("127.0.0.1"),
            tonic::Code::PermissionDenied,
        ),
        (
            "http://127.0.0.1:1",
            Some("evil.example"),
            tonic::Code::PermissionDenied,
        ),
        ("http://evil.example:1", None, tonic::Code::PermissionDenied),
        ("http://127.0.0.1:1", None, tonic::Code::Ok),
    ] {
        let channel = tonic::transport::Endpoint::from_shared(s.url.clone())
            .unwrap()
            .origin(origin.parse().unwrap())
            .connect()
            .await
            .unwrap();
        let mut g = pb::agent_service_client::AgentServiceClient::with_interceptor(channel, Host(host));
        let got = g
            .list_sessions(pb::ListSessionsRequest {})
            .await
            .map_or_else(|e| e.code(), |_| tonic::Code::Ok);
        assert_eq!(got, want, "gRPC to {origin} with host {host:?}");
    }
}

#[tokio::test]
async fn two_host_headers_on_http1_are_a_400() {
    let s = TestServer::start().await;
    let req = |hosts: &[&str]| {
        let mut head =
            format!("GET /sessions HTTP/1.1\r\nAuthorization: Bearer {TOKEN}\r\nConnection: close\r\n");
        for h in hosts {
            head.push_str(&format!("Host: {h}\r\n"));
        }
        head + "\r\n"
    };
    assert_eq!(raw_http1(&s, &req(&["127.0.0.1"])).await, "HTTP/1.1 200 OK");
    for hosts in [
        &["127.0.0.1", "evil.example"][..],
        &["evil.example", "127.0.0.1"],
        &["127.0.0.1", "127.0.0.1"],
    ] {
        assert_eq!(
            raw_http1(&s, &req(hosts)).await,
            "HTTP/1.1 400 Bad Request",
            "{hosts:?}"
        );
    }
    // An absolute-form target names the authority; a Host that disagrees is refused.
    let head = format!(
        "GET http://evil.example/sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\nConnection: close\r\n\r\n"
    );
    assert_eq!(raw_http1(&s, &head).await, "HTTP/1.1 403 Forbidden");
}

#[tokio::test]
async fn a_url_token_is_refused_through_a_proxy_and_with_allow_remote() {
    let s = TestServer::start().await;
    let c = reqwest::Client::new();
    let url = format!("{}/sessions?token={TOKEN}", s.url);
    assert_eq!(
        c.get(&url).send().await.unwrap().status(),
        200,
        "loopback, no proxy"
    );
    for (name, value) in [
        ("forwarded", "for=203.0.113.9;proto=https"),
        ("x-forwarded-for", "203.0.113.9"),
        ("x-forwarded-host", "vak.example.com"),
        ("x-forwarded-proto", "https"),
        ("x-real-ip", "203.0.113.9"),
    ] {
        let r = c.get(&url).header(name, value).send().await.unwrap();
        assert_eq!(r.status(), 401, "{name}");
        let v: Value = r.json().await.unwrap();
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("never through a proxy"),
            "{v}"
        );
        // The header is still fine.
        let r = c
            .get(format!("{}/sessions", s.url))
            .bearer_auth(TOKEN)
            .header(name, value)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "bearer through a proxy ({name})");
    }
    // A login's `?key=` is half a credential, so it is kept behind a proxy (EventSource needs it).
    let sid = s.create_session().await;
    let (cookie, key) = login(&c, &s.url).await;
    let r = c
        .get(format!("{}/sessions/{sid}/events?key={key}", s.url))
        .header("cookie", &cookie)
        .header("x-forwarded-for", "203.0.113.9")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "cookie + ?key= through a proxy");

    let remote = TestServer::start_with(|c| c.allow_remote = true).await;
    let r = c
        .get(format!("{}/sessions?token={TOKEN}", remote.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401, "--allow-remote: no ?token= even from loopback");
    let r = c
        .get(format!("{}/sessions", remote.url))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn every_loopback_address_shares_one_stream_quota() {
    let s = TestServer::start_with(|c| {
        c.max_streams_per_client = 1;
        c.max_streams = 1000;
    })
    .await;
    let sid = s.create_session().await;
    let from = |ip: [u8; 4]| {
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
        reqwest::Client::builder()
            .local_address(std::net::IpAddr::from(ip))
            .default_headers(headers)
            .build()
            .unwrap()
    };
    let url = format!("{}/sessions/{sid}/events", s.url);
    let held = from([127, 0, 0, 1]).get(&url).send().await.unwrap();
    assert_eq!(held.status(), 200);
    for ip in [[127, 0, 0, 2], [127, 1, 2, 3]] {
        let r = from(ip).get(&url).send().await.unwrap();
        assert_eq!(r.status(), 429, "{ip:?} is this machine too");
        let v: Value = r.json().await.unwrap();
        assert_eq!(
            v["error"]["message"],
            "loopback already has 1 stream open, the per-client limit; close one first"
        );
    }
    drop(held);
}

/// Starts `vak serve --token <token>`, waits for its listening line, stops it;
/// returns what it wrote on stderr.
async fn serve_stderr_with_token(token: &str) -> String {
    let home = tempfile::tempdir().unwrap();
    let mut served = Serve::new()
        .token(token)
        .home(home.path())
        .workspace(home.path())
        .env("RUST_LOG", "warn")
        .start()
        .await;
    // Killed and reaped: all it wrote has been read.
    served.vak.signal("KILL");
    served.vak.wait().await;
    served.vak.log()
}

#[tokio::test]
async fn a_weak_token_on_the_command_line_is_warned_about() {
    let err = serve_stderr_with_token("T").await;
    let warning = err
        .lines()
        .find(|l| l.starts_with("vak: warning: the token"))
        .unwrap_or_else(|| panic!("no warning on stderr:\n{err}"));
    assert!(
        warning.contains("1 character (about 6 bits, under 128)"),
        "{warning}"
    );
    // 31 hex characters are 124 bits; 21 base64 ones 126.
    for weak in ["0123456789abcdef0123456789abcde", "AbCdEfGhIjKlMnOpQrStU"] {
        assert!(
            serve_stderr_with_token(weak).await.contains("under 128"),
            "{weak}"
        );
    }
    for strong in [
        "0123456789abcdef0123456789abcdef",
        "AbCdEfGhIjKlMnOpQrStUv",
        "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
    ] {
        let err = serve_stderr_with_token(strong).await;
        assert!(!err.contains("warning: the token"), "{strong}: {err}");
    }
}

#[tokio::test]
async fn a_login_outlives_a_restart_and_a_logout_stays_a_logout() {
    let s = TestServer::start().await;
    let c = reqwest::Client::new();
    let (kept, kept_key) = login(&c, &s.url).await;
    let (ended, ended_key) = login(&c, &s.url).await;
    let logout = c
        .post(format!("{}/auth/logout", s.url))
        .header("cookie", &ended)
        .send()
        .await
        .unwrap();
    assert_eq!(logout.status(), 200);
    let (home, ws) = (s.home.clone(), s.workspace.clone());
    let _dirs = s.stop().await;

    let s = TestServer::start_in(&home, &ws, |_| {}).await;
    let status = |cookie: &str, key: &str| {
        let r = c
            .get(format!("{}/sessions", s.url))
            .header("cookie", cookie)
            .header("x-vak-key", key);
        async move { r.send().await.unwrap().status().as_u16() }
    };
    assert_eq!(
        status(&kept, &kept_key).await,
        200,
        "the login outlived the restart"
    );
    assert_eq!(
        status(&ended, &ended_key).await,
        401,
        "the logout outlived it too"
    );
    assert_eq!(
        status(&kept, &ended_key).await,
        401,
        "still only with its own key"
    );
    let stored = std::fs::read_to_string(home.join("logins.json")).unwrap();
    let id = kept.split('=').nth(1).unwrap();
    assert!(
        !stored.contains(id) && !stored.contains(&kept_key),
        "only hashes on disk"
    );
}
