//! The host, workspaces and terminal surface (issue 16 item 4): `GET /host` says what a client needs and never a secret; workspaces open only under the roots, bounded, with trust; `GET /pty` is off by default, refused to other machines and other sites, and a real shell whose life is the socket's.

use crate::support::*;
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;
use vak::proto::v1 as pb;

fn code(v: &Value) -> &str {
    v["error"]["code"].as_str().unwrap_or_default()
}

fn reason(v: &Value) -> &str {
    v["error"]["reason"].as_str().unwrap_or_default()
}

/// A server with the terminal on (loopback only, the default).
async fn terminal_server() -> TestServer {
    TestServer::start_with(|c| {
        c.web.terminal = true;
        // Not the user's own shell, whose startup files are theirs (one
        // that takes a minute would fail every test here).
        c.web.terminal_shell = Some("/bin/sh".into());
    })
    .await
}

type Socket = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// A WebSocket onto `GET /pty<query>` with the token and `origin`; a
/// refusal is its status and JSON body.
async fn connect(s: &TestServer, query: &str, origin: Option<&str>) -> Result<Socket, (u16, Value)> {
    let url = format!("ws://{}/pty{query}", s.addr);
    let mut req = url.into_client_request().unwrap();
    req.headers_mut()
        .insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
    if let Some(o) = origin {
        req.headers_mut().insert("origin", o.parse().unwrap());
    }
    match tokio::time::timeout(DEADLINE, tokio_tungstenite::connect_async(req))
        .await
        .expect("the handshake ends within the deadline")
    {
        Ok((ws, _)) => Ok(ws),
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
            let status = resp.status().as_u16();
            let body = resp.into_body().unwrap_or_default();
            Err((status, serde_json::from_slice(&body).unwrap_or(Value::Null)))
        }
        Err(e) => panic!("handshake: {e}"),
    }
}

/// The next message, within the deadline (None: the socket ended).
async fn next(ws: &mut Socket) -> Option<Message> {
    tokio::time::timeout(DEADLINE, ws.next())
        .await
        .expect("a message within the deadline")
        .map(|m| m.expect("a well-formed message"))
}

/// The `started` message every terminal opens with.
async fn started(ws: &mut Socket) -> Value {
    match next(ws).await {
        Some(Message::Text(t)) => {
            let v: Value = serde_json::from_str(t.as_str()).unwrap();
            assert_eq!(v["type"], "started", "{v}");
            v
        }
        other => panic!("expected the started message, got {other:?}"),
    }
}

/// `out` without terminal control sequences (ESC [ … final byte, ESC ] … BEL).
fn plain(out: &str) -> String {
    let mut s = String::new();
    let mut chars = out.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\u{1b}' => match chars.next() {
                Some('[') => {
                    for c in chars.by_ref() {
                        if ('@'..='~').contains(&c) {
                            break;
                        }
                    }
                }
                Some(']') => {
                    for c in chars.by_ref() {
                        if c == '\u{7}' {
                            break;
                        }
                    }
                }
                _ => {}
            },
            '\r' => {}
            c => s.push(c),
        }
    }
    s
}

/// Reads output until one of its lines is exactly `line` (what the shell
/// printed, not the echo of what was typed); all of it. A slow shell prints
/// its first prompt after the tty has already echoed typed-ahead input, so
/// the output can share a line with a prompt (`# hi`): a prompt prefix is
/// allowed, an echoed command (`echo hi`) is not.
async fn until_line(ws: &mut Socket, line: &str) -> String {
    let printed = |l: &str| {
        l == line
            || l.strip_suffix(line)
                .is_some_and(|prompt| prompt.ends_with("# ") || prompt.ends_with("$ "))
    };
    let mut out = String::new();
    loop {
        if plain(&out).lines().any(printed) {
            return out;
        }
        let Ok(msg) = tokio::time::timeout(DEADLINE, ws.next()).await else {
            panic!("no line {line:?} within the deadline; output: {out:?}");
        };
        match msg.map(|m| m.expect("a well-formed message")) {
            Some(Message::Binary(b)) => out.push_str(&String::from_utf8_lossy(&b)),
            Some(Message::Text(_)) | Some(Message::Ping(_)) | Some(Message::Pong(_)) => {}
            other => panic!("the terminal ended before {line:?} ({other:?}); output: {out}"),
        }
    }
}

async fn type_in(ws: &mut Socket, text: &str) {
    ws.send(Message::binary(text.as_bytes().to_vec())).await.unwrap();
}

#[tokio::test]
async fn host_says_what_a_client_needs_and_never_a_secret() {
    let s = TestServer::start().await;
    let (status, host) = s.get("/host").await;
    assert_eq!(status, 200, "{host}");
    assert_eq!(host["version"], env!("CARGO_PKG_VERSION"));
    let ws = s.workspace.canonicalize().unwrap().display().to_string();
    assert_eq!(host["workspace"], ws.as_str());
    assert_eq!(
        host["workspaces"],
        json!([{"path": ws, "trusted": true, "primary": true}])
    );
    assert_eq!(host["workspace_roots"], json!([ws]));
    assert_eq!(host["max_workspaces"], 32);
    assert_eq!(host["auth"], "local");
    assert_eq!(host["storage"], "ledger");
    let f = &host["features"];
    assert_eq!(f["terminal"], false, "{host}");
    assert_eq!(f["terminal_requires_loopback"], true, "{host}");
    let text = host.to_string();
    for secret in [TOKEN, "http://", s.url.as_str(), "key"] {
        assert!(!text.contains(secret), "/host names {secret:?}: {text}");
    }
    // The same answer over gRPC, and the terminal shows as on when it is.
    let t = terminal_server().await;
    let mut g = t.grpc().await;
    let h = g.get_host(pb::GetHostRequest {}).await.unwrap().into_inner();
    assert!(h.features.unwrap().terminal);
    assert_eq!(h.auth(), pb::AuthMode::Local);
    s.stop().await;
    t.stop().await;
}

#[tokio::test]
async fn workspaces_open_only_under_the_roots_with_trust_and_a_bound() {
    let roots = tempfile::tempdir().unwrap();
    let root = roots.path().canonicalize().unwrap();
    let home = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.join("main")).unwrap();
    let s = TestServer::start_in(home.path(), &root.join("main"), |c| {
        c.core.workspace_roots = vec![root.clone()];
    })
    .await;
    std::fs::create_dir_all(root.join("a/deep")).unwrap();
    let a = root.join("a").display().to_string();
    let (status, w) = s.post("/workspaces/open", json!({"path": a})).await;
    assert_eq!(status, 200, "{w}");
    assert_eq!(
        w,
        json!({"workspace": {"path": a, "trusted": false, "primary": false}, "opened": true}),
        "untrusted unless asked"
    );
    // Again with trust: the same workspace, now trusted; trust is never taken back.
    let (_, w) = s
        .post(
            "/workspaces/open",
            json!({"path": format!("{a}/deep/.."), "trust": true}),
        )
        .await;
    assert_eq!(
        w,
        json!({"workspace": {"path": a, "trusted": true, "primary": false}, "opened": false})
    );
    let (_, w) = s.post("/workspaces/open", json!({"path": a})).await;
    assert_eq!(w["workspace"]["trusted"], true);
    let (status, list) = s.get("/workspaces").await;
    assert_eq!(status, 200);
    let paths: Vec<&str> = list["workspaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        paths,
        [root.join("main").display().to_string().as_str(), a.as_str()]
    );
    assert_eq!(list["max_workspaces"], 32);
    let (_, host) = s.get("/host").await;
    assert_eq!(host["workspaces"], list["workspaces"]);

    // Refusals: outside the roots (directly or through a symlink), not
    // absolute, missing, a file, no path, an unknown field.
    let outside = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(outside.path(), root.join("link")).unwrap();
    std::fs::write(root.join("file"), "x").unwrap();
    let cases = [
        (json!({"path": outside.path()}), 403, "forbidden"),
        (json!({"path": root.join("link")}), 403, "forbidden"),
        (json!({"path": "a"}), 400, "invalid_argument"),
        (json!({"path": root.join("missing")}), 404, "not_found"),
        (json!({"path": root.join("file")}), 400, "invalid_argument"),
        (json!({}), 400, "invalid_argument"),
        (json!({"path": a, "trusted": true}), 400, "invalid_argument"),
    ];
    for (body, want, want_code) in cases {
        let (status, e) = s.post("/workspaces/open", body.clone()).await;
        assert_eq!((status, code(&e)), (want, want_code), "{body}: {e}");
    }
    let (_, e) = s.post("/workspaces/open", json!({"path": outside.path()})).await;
    assert_eq!(reason(&e), "outside_workspace_roots", "{e}");
    // The bound: 32 open, the server's own included.
    for i in 2..32 {
        std::fs::create_dir(root.join(format!("w{i}"))).unwrap();
        let (status, e) = s
            .post("/workspaces/open", json!({"path": root.join(format!("w{i}"))}))
            .await;
        assert_eq!(status, 200, "{e}");
    }
    std::fs::create_dir(root.join("one-more")).unwrap();
    let (status, e) = s
        .post("/workspaces/open", json!({"path": root.join("one-more")}))
        .await;
    assert_eq!((status, reason(&e)), (429, "too_many_workspaces"), "{e}");
    s.stop().await;
}

#[tokio::test]
async fn the_terminal_is_off_by_default_with_a_reason() {
    let s = TestServer::start().await;
    let (status, e) = s.get("/pty").await;
    assert_eq!(
        (status, code(&e), reason(&e)),
        (403, "forbidden", "terminal_off"),
        "{e}"
    );
    assert!(e["error"]["message"]
        .as_str()
        .unwrap()
        .contains("[server.web] terminal = true"));
    let (status, e) = connect(&s, "", None).await.expect_err("refused");
    assert_eq!((status, reason(&e)), (403, "terminal_off"));
    s.stop().await;
}

#[tokio::test]
async fn echo_round_trips_resize_applies_and_exit_closes_the_socket() {
    let s = terminal_server().await;
    let mut ws = connect(&s, "?cols=90&rows=20", None)
        .await
        .expect("the terminal opens");
    let hello = started(&mut ws).await;
    let pid = hello["pid"].as_i64().unwrap() as i32;
    assert_eq!(
        hello["workspace"],
        s.workspace.canonicalize().unwrap().display().to_string().as_str()
    );
    type_in(&mut ws, "echo hi\r").await;
    until_line(&mut ws, "hi").await;
    type_in(&mut ws, "stty size\r").await;
    until_line(&mut ws, "20 90").await;
    ws.send(Message::text(r#"{"type":"resize","cols":120,"rows":40}"#))
        .await
        .unwrap();
    type_in(&mut ws, "stty size\r").await;
    until_line(&mut ws, "40 120").await;
    // The shell exits: its exit code, then a normal close, and no process.
    type_in(&mut ws, "exit 3\r").await;
    let mut exit = None;
    loop {
        match next(&mut ws).await {
            Some(Message::Text(t)) => exit = Some(serde_json::from_str::<Value>(t.as_str()).unwrap()),
            Some(Message::Close(f)) => {
                assert_eq!(u16::from(f.expect("a close frame").code), 1000);
                break;
            }
            Some(_) => {}
            None => panic!("the socket ended without a close frame"),
        }
    }
    assert_eq!(exit, Some(json!({"type": "exit", "code": 3})));
    assert!(exited(pid).await, "the shell is gone");
    s.stop().await;
}

#[tokio::test]
async fn closing_the_socket_kills_the_shell() {
    let s = terminal_server().await;
    let mut ws = connect(&s, "", None).await.expect("the terminal opens");
    let pid = started(&mut ws).await["pid"].as_i64().unwrap() as i32;
    // A shell that ignores the hangup is killed after the grace.
    type_in(&mut ws, "trap '' HUP; echo trapped\r").await;
    until_line(&mut ws, "trapped").await;
    ws.close(None).await.unwrap();
    drop(ws);
    assert!(exited(pid).await, "the shell {pid} outlived its socket");
    s.stop().await;
}

#[tokio::test]
async fn another_sites_page_cannot_open_a_terminal() {
    let s = terminal_server().await;
    for origin in ["http://localhost:5173", "http://evil.example", "null"] {
        let (status, e) = connect(&s, "", Some(origin)).await.expect_err("refused");
        assert_eq!((status, code(&e)), (403, "forbidden"), "{origin}: {e}");
    }
    // The app's own origin may.
    let own = format!("http://{}", s.addr);
    let mut ws = connect(&s, "", Some(&own))
        .await
        .expect("the own origin opens one");
    started(&mut ws).await;
    // And nobody without credentials.
    let mut req = format!("ws://{}/pty", s.addr).into_client_request().unwrap();
    req.headers_mut().insert("origin", own.parse().unwrap());
    match tokio_tungstenite::connect_async(req).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => assert_eq!(r.status(), 401),
        other => panic!("expected 401, got {:?}", other.map(|_| ())),
    }
    s.stop().await;
}

#[tokio::test]
async fn a_peer_on_another_machine_or_through_a_proxy_is_refused() {
    let s = TestServer::start().await;
    let req = |forwarded: bool| {
        let mut b = axum::http::Request::get("/pty")
            .header("host", "127.0.0.1")
            .header("authorization", format!("Bearer {TOKEN}"));
        if forwarded {
            b = b.header("x-forwarded-for", "203.0.113.9");
        }
        b.body(axum::body::Body::empty()).unwrap()
    };
    async fn json_of(r: axum::response::Response) -> (u16, Value) {
        let status = r.status().as_u16();
        let body = http_body_util::BodyExt::collect(r.into_body())
            .await
            .unwrap()
            .to_bytes();
        (status, serde_json::from_slice(&body).unwrap())
    }
    let on = |c: &mut vak::edge::server::ServeConfig| c.web.terminal = true;
    for (peer, forwarded) in [("192.0.2.7:5000", false), ("127.0.0.1:5000", true)] {
        let (status, e) = json_of(from_peer_with(&s, peer, req(forwarded), on).await).await;
        assert_eq!(
            (status, reason(&e)),
            (403, "terminal_loopback_only"),
            "{peer}: {e}"
        );
    }
    // Turned off, another machine gets past that rule (to the handshake,
    // which a request that is not an upgrade fails).
    let (status, e) = json_of(
        from_peer_with(&s, "192.0.2.7:5000", req(false), |c| {
            c.web.terminal = true;
            c.web.terminal_requires_loopback = false;
        })
        .await,
    )
    .await;
    assert_eq!((status, code(&e)), (400, "invalid_argument"), "{e}");
    s.stop().await;
}

#[tokio::test]
async fn a_terminal_runs_only_in_an_open_trusted_workspace() {
    let s = terminal_server().await;
    let sub = s.workspace.canonicalize().unwrap().join("sub");
    std::fs::create_dir(&sub).unwrap();
    let q = format!("?workspace={}", sub.display());
    let (status, e) = connect(&s, &q, None).await.expect_err("refused");
    assert_eq!((status, reason(&e)), (404, "workspace_not_open"), "{e}");
    s.post("/workspaces/open", json!({"path": sub})).await;
    let (status, e) = connect(&s, &q, None).await.expect_err("refused");
    assert_eq!((status, reason(&e)), (403, "untrusted_workspace"), "{e}");
    s.post("/workspaces/open", json!({"path": sub, "trust": true}))
        .await;
    let mut ws = connect(&s, &q, None).await.expect("a trusted workspace opens");
    assert_eq!(
        started(&mut ws).await["workspace"],
        sub.display().to_string().as_str()
    );
    type_in(&mut ws, "pwd\r").await;
    until_line(&mut ws, &sub.display().to_string()).await;
    // Bad sizes and parameters are refused before any shell starts.
    for q in ["?cols=0", "?rows=5000", "?cols=wide", "?shell=/bin/zsh"] {
        let (status, e) = connect(&s, q, None).await.expect_err("refused");
        assert_eq!((status, code(&e)), (400, "invalid_argument"), "{q}: {e}");
    }
    s.stop().await;
}

#[tokio::test]
async fn an_unknown_control_message_closes_the_terminal_with_a_reason() {
    let s = terminal_server().await;
    let mut ws = connect(&s, "", None).await.expect("the terminal opens");
    let pid = started(&mut ws).await["pid"].as_i64().unwrap() as i32;
    ws.send(Message::text(r#"{"type":"paste","text":"rm -rf /"}"#))
        .await
        .unwrap();
    loop {
        match next(&mut ws).await {
            Some(Message::Close(Some(f))) => {
                assert_eq!(u16::from(f.code), 1008);
                assert!(
                    f.reason.as_str().contains("unknown control message"),
                    "{}",
                    f.reason
                );
                break;
            }
            Some(Message::Binary(_)) => {}
            other => panic!("expected a 1008 close, got {other:?}"),
        }
    }
    assert!(exited(pid).await);
    s.stop().await;
}

#[tokio::test]
async fn streams_host_frame_is_the_same_answer_as_get_host() {
    let s = terminal_server().await;
    let mut sse = s.open_stream(&s.url, "host=1", None).await;
    let frame = sse.next().await.expect("a host frame");
    assert_eq!(frame.event, "host", "{frame:?}");
    let (_, host) = s.get("/host").await;
    assert_eq!(frame.data, host, "{frame:?}");
    assert_eq!(frame.data["features"]["terminal"], true);
    s.stop().await;
}

#[tokio::test]
async fn the_real_binary_reads_server_web_and_its_shell_gets_no_keys() {
    let home = tempfile::tempdir().unwrap();
    let ws = tempfile::tempdir().unwrap();
    let args = |home: &std::path::Path| {
        Serve::new()
            .home(home)
            .workspace(ws.path())
            .env("OPENAI_API_KEY", "sk-not-for-the-terminal")
    };
    // A misspelt key stops startup, naming it.
    std::fs::write(home.path().join("config.toml"), "[server.web]\nterminl = true\n").unwrap();
    let mut bad = args(home.path()).spawn().vak;
    assert!(!bad.wait().await.success());
    assert!(bad.log().contains("terminl"), "{}", bad.log());
    // So does a shell that is not an absolute path to a file.
    std::fs::write(
        home.path().join("config.toml"),
        "[server.web]\nterminal = true\nterminal_shell = \"sh\"\n",
    )
    .unwrap();
    let mut bad = args(home.path()).spawn().vak;
    assert!(!bad.wait().await.success());
    assert!(
        bad.log().contains("terminal_shell: sh is not an absolute path"),
        "{}",
        bad.log()
    );
    std::fs::write(
        home.path().join("config.toml"),
        "[server.web]\nterminal = true\nterminal_shell = \"/bin/sh\"\n",
    )
    .unwrap();
    let served = args(home.path()).start().await;
    let s = served.api();
    let (_, host) = s.get("/host").await;
    assert_eq!(host["features"]["terminal"], true, "{host}");
    let mut term = connect(&s, "", None).await.expect("the terminal opens");
    started(&mut term).await;
    type_in(&mut term, "echo \"key=${OPENAI_API_KEY:-none}\"\r").await;
    until_line(&mut term, "key=none").await;
    drop(term);
    served.vak.terminate().await;
}

/// What `/read marker.txt` in session `sid` answers.
async fn read_marker(s: &TestServer, sid: &str) -> String {
    let mut sse = s.events(sid, None).await;
    let (status, body) = s.run(sid, "/read marker.txt").await;
    assert_eq!(status, 202, "{body}");
    let frames = sse.until("run_finished").await;
    frames
        .iter()
        .find(|f| f.event == "tool_result")
        .map(|f| f.body()["output"].as_str().unwrap_or_default().to_string())
        .expect("a tool result")
}

#[tokio::test]
async fn a_session_keeps_the_workspace_it_was_created_in() {
    let roots = tempfile::tempdir().unwrap();
    let root = roots.path().canonicalize().unwrap();
    let home = tempfile::tempdir().unwrap();
    for (dir, text) in [("main", "in main"), ("b", "in b")] {
        std::fs::create_dir(root.join(dir)).unwrap();
        std::fs::write(root.join(dir).join("marker.txt"), text).unwrap();
    }
    let tweak = |c: &mut vak::edge::server::ServeConfig| c.core.workspace_roots = vec![root.clone()];
    let s = TestServer::start_in(home.path(), &root.join("main"), tweak).await;
    let b = root.join("b").display().to_string();
    // Not open, then untrusted: refused.
    let (status, e) = s.post("/sessions", json!({"workspace": b})).await;
    assert_eq!((status, reason(&e)), (404, "workspace_not_open"), "{e}");
    s.post("/workspaces/open", json!({"path": b})).await;
    let (status, e) = s.post("/sessions", json!({"workspace": b})).await;
    assert_eq!((status, reason(&e)), (403, "untrusted_workspace"), "{e}");
    s.post("/workspaces/open", json!({"path": b, "trust": true}))
        .await;
    let (status, created) = s.post("/sessions", json!({"workspace": b})).await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["workspace"], b.as_str());
    let in_b = created["session_id"].as_str().unwrap().to_string();
    let (_, created) = s.post("/sessions", json!({})).await;
    assert_eq!(
        created["workspace"],
        root.join("main").display().to_string().as_str()
    );
    let in_main = created["session_id"].as_str().unwrap().to_string();
    assert_eq!(read_marker(&s, &in_b).await, "in b");
    assert_eq!(read_marker(&s, &in_main).await, "in main");
    // A fork keeps its parent's workspace.
    let (status, fork) = s.post(&format!("/sessions/{in_b}/fork"), json!({})).await;
    assert_eq!(status, 201, "{fork}");
    let forked = fork["session"]["session_id"].as_str().unwrap().to_string();
    assert_eq!(read_marker(&s, &forked).await, "in b");
    let main = root.join("main").display().to_string();
    let listed = |list: &Value| -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = list["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| {
                let id = x["session_id"].as_str().unwrap().to_string();
                (id, x["workspace"].as_str().unwrap().to_string())
            })
            .collect();
        v.sort();
        v
    };
    let mut want = vec![
        (in_b.clone(), b.clone()),
        (in_main.clone(), main.clone()),
        (forked.clone(), b.clone()),
    ];
    want.sort();
    let (_, list) = s.get("/sessions").await;
    assert_eq!(listed(&list), want, "GET /sessions says where each runs: {list}");
    // After a restart (open workspaces are forgotten), the listing still
    // says so before any session is loaded, and the session loads from its
    // ledger into the workspace it was created in.
    s.stop().await;
    let s = TestServer::start_in(home.path(), &root.join("main"), tweak).await;
    let (_, list) = s.get("/sessions").await;
    assert!(
        list["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .all(|x| x["loaded"] == false),
        "{list}"
    );
    assert_eq!(listed(&list), want, "{list}");
    assert_eq!(read_marker(&s, &in_b).await, "in b");
    s.stop().await;
    // And from the ledgers alone, with the index gone.
    std::fs::remove_file(home.path().join("sessions").join("index.json")).unwrap();
    let s = TestServer::start_in(home.path(), &root.join("main"), tweak).await;
    let (_, list) = s.get("/sessions").await;
    assert_eq!(listed(&list), want, "rebuilt from the ledgers' headers: {list}");
    s.stop().await;
}
