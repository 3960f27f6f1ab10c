//! MCP servers as a user meets them, against a real MCP server written with
//! the official Python SDK (tests/mcp/server.py): over stdio from config.toml
//! and over streamable HTTP through `PUT /config/mcp`; the offline model's
//! `/call` drives a tool through an approval in `default`, straight through in
//! `bypass` or under an always-allow rule, and refused in `plan`; a killed
//! server shows `failed`, calls meanwhile get `mcp_unavailable`, and it comes
//! back `ready`; timeouts and cancelled runs reach the server as
//! `notifications/cancelled`; a changed tool list is taken up; config.toml
//! keeps everything outside `[mcp.servers]`; `vak term` shows an MCP tool call
//! and asks for it like any other, one-shot and interactive.
//!
//! `make test` installs the SDK and sets VAK_MCP_PYTHON; by hand:
//! `make mcp`, then `VAK_MCP_PYTHON=$PWD/target/mcp-venv/bin/python cargo test --test it mcp::`.

use crate::support::{Frame, Pty, Sse, TestServer, TOKEN};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::Duration;
use vak::core::PermissionMode;
use vak::proto::v1 as pb;

/// The venv's python with the official MCP SDK.
fn python() -> PathBuf {
    std::env::var_os("VAK_MCP_PYTHON")
        .unwrap_or_else(|| {
            panic!(
                "VAK_MCP_PYTHON is not set: run `make mcp` (it installs the MCP SDK into \
                 target/mcp-venv), then VAK_MCP_PYTHON=$PWD/target/mcp-venv/bin/python"
            )
        })
        .into()
}

fn server_py() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/mcp/server.py")
        .display()
        .to_string()
}

/// A server whose config.toml is `config` (written before it starts).
async fn start(config: &str, mode: PermissionMode) -> (TestServer, tempfile::TempDir, tempfile::TempDir) {
    let home = tempfile::tempdir().unwrap();
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(home.path().join("config.toml"), config).unwrap();
    let s = TestServer::start_in(home.path(), ws.path(), |c| {
        c.core.permission = mode;
        c.core.allow_bypass = true;
    })
    .await;
    (s, home, ws)
}

/// A TOML string literal.
fn lit(s: &str) -> String {
    Value::String(s.to_string()).to_string()
}

/// GET /config/mcp's entry for `name`, once `ok` holds (polled, with a deadline).
async fn until(s: &TestServer, name: &str, what: &str, ok: impl Fn(&Value) -> bool) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (code, v) = s.get("/config/mcp").await;
        assert_eq!(code, 200, "{v}");
        let entry = v["servers"][name].clone();
        if ok(&entry) {
            return entry;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{name} never became {what}: {v}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn ready(s: &TestServer, name: &str) -> Value {
    until(s, name, "ready", |e| e["state"] == "ready").await
}

/// What one run did: the approvals asked, the tool results, the frames.
struct Ran {
    asked: Vec<Value>,
    results: Vec<Value>,
    frames: Vec<Frame>,
}

impl Ran {
    fn text(&self) -> String {
        crate::support::text_of(&self.frames)
    }
}

/// Runs `prompt` in `sid` to its run_finished, answering approvals with `answer`.
async fn run(s: &TestServer, sid: &str, sse: &mut Sse, prompt: &str, answer: Value) -> Ran {
    let (code, body) = s.run(sid, prompt).await;
    assert_eq!(code, 202, "{body}");
    let mut ran = Ran {
        asked: Vec::new(),
        results: Vec::new(),
        frames: Vec::new(),
    };
    loop {
        let f = sse.next().await.expect("the stream goes on until run_finished");
        match f.event.as_str() {
            "approval_requested" => {
                let rid = f.body()["request_id"].as_str().unwrap().to_string();
                let (code, a) = s
                    .post(&format!("/sessions/{sid}/approvals/{rid}"), answer.clone())
                    .await;
                assert_eq!(code, 200, "{a}");
                ran.asked.push(f.body().clone());
            }
            "tool_result" => ran.results.push(f.body().clone()),
            _ => {}
        }
        let done = f.event == "run_finished";
        ran.frames.push(f);
        if done {
            return ran;
        }
    }
}

async fn session(s: &TestServer) -> (String, Sse) {
    let sid = s.create_session().await;
    let sse = s.events(&sid, None).await;
    (sid, sse)
}

#[tokio::test]
async fn an_mcp_tool_over_stdio_asks_in_default_runs_in_bypass_and_under_a_rule_and_is_refused_in_plan() {
    let config = format!(
        "[mcp.servers.t]\ncommand = {}\nargs = [{}, \"stdio\"]\n",
        lit(&python().display().to_string()),
        lit(&server_py())
    );
    let (s, _home, _ws) = start(&config, PermissionMode::Default).await;
    let t = ready(&s, "t").await;
    assert_eq!(t["tool_count"], 6, "{t}");
    let tools: Vec<&str> = t["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    for name in [
        "mcp__t__echo",
        "mcp__t__add",
        "mcp__t__fail",
        "mcp__t__wait",
        "mcp__t__grow",
        "mcp__t__pid",
    ] {
        assert!(tools.contains(&name), "{name} in {tools:?}");
    }
    assert!(t["pid"].as_u64().is_some(), "a stdio server shows its pid: {t}");
    assert_eq!(t["command"], python().display().to_string());

    // The same table over gRPC, typed; a bad one is INVALID_ARGUMENT naming the field.
    let mut grpc = s.grpc().await;
    let got = grpc
        .get_mcp_config(pb::GetMcpConfigRequest {})
        .await
        .unwrap()
        .into_inner();
    let typed = &got.servers["t"];
    assert_eq!(typed.state(), pb::McpServerState::Ready);
    assert_eq!((typed.tool_count, typed.enabled), (6, Some(true)));
    let mut bad = got.servers.clone();
    bad.get_mut("t").unwrap().timeout_ms = Some(0);
    let e = grpc
        .put_mcp_config(pb::PutMcpConfigRequest { servers: bad })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(
        e.message().starts_with("servers.t.timeout_ms:"),
        "{}",
        e.message()
    );

    // default: asked, approved, run; the offline model echoes the result.
    let (sid, mut sse) = session(&s).await;
    let ran = run(
        &s,
        &sid,
        &mut sse,
        r#"/call mcp__t__add {"a": 2, "b": 3}"#,
        json!({"approve": true}),
    )
    .await;
    assert_eq!(ran.asked.len(), 1);
    assert_eq!(ran.asked[0]["tool"], "mcp__t__add");
    assert_eq!(ran.results[0]["ok"], true, "{:?}", ran.results);
    assert_eq!(ran.results[0]["output"], "5");
    assert!(ran.text().contains("result: 5"), "{}", ran.text());
    crate::support::assert_completed(&ran.frames);

    // A denied call never reaches the server; a failing tool is a failed result.
    let ran = run(
        &s,
        &sid,
        &mut sse,
        r#"/call mcp__t__add {"a": 1, "b": 1}"#,
        json!({"approve": false}),
    )
    .await;
    assert_eq!(ran.results[0]["ok"], false);
    let ran = run(
        &s,
        &sid,
        &mut sse,
        r#"/call mcp__t__fail {"why": "boom"}"#,
        json!({"approve": true}),
    )
    .await;
    assert_eq!(ran.results[0]["ok"], false);
    assert!(
        ran.results[0]["output"].as_str().unwrap().contains("boom"),
        "{:?}",
        ran.results
    );
    assert!(ran.text().contains("error: "), "{}", ran.text());

    // An unknown tool is refused without asking.
    let ran = run(
        &s,
        &sid,
        &mut sse,
        "/call mcp__t__nope {}",
        json!({"approve": true}),
    )
    .await;
    assert!(ran.asked.is_empty());
    assert_eq!(ran.results[0]["output"], "unknown tool mcp__t__nope");

    // plan: refused, nothing asked.
    assert_eq!(s.post("/config/mode", json!({"mode": "plan"})).await.0, 200);
    let ran = run(
        &s,
        &sid,
        &mut sse,
        r#"/call mcp__t__echo {"text": "x"}"#,
        json!({"approve": true}),
    )
    .await;
    assert!(ran.asked.is_empty());
    assert_eq!(ran.results[0]["ok"], false, "{:?}", ran.results);

    // bypass: straight through.
    assert_eq!(s.post("/config/mode", json!({"mode": "bypass"})).await.0, 200);
    let ran = run(
        &s,
        &sid,
        &mut sse,
        r#"/call mcp__t__echo {"text": "hi"}"#,
        json!({"approve": false}),
    )
    .await;
    assert!(ran.asked.is_empty());
    assert_eq!(ran.results[0]["output"], "echo: hi");

    // An always-allow answer stores a rule on the tool; its next call runs.
    assert_eq!(s.post("/config/mode", json!({"mode": "default"})).await.0, 200);
    let always = json!({"approve": true, "always": true});
    let ran = run(&s, &sid, &mut sse, r#"/call mcp__t__echo {"text": "1"}"#, always).await;
    assert_eq!(ran.asked.len(), 1);
    let (_, rules) = s.get("/permissions/rules").await;
    let rule = &rules["rules"][0];
    assert_eq!(
        (rule["tool"].as_str(), rule["kind"].as_str()),
        (Some("mcp__t__echo"), Some("tool")),
        "{rules}"
    );
    let ran = run(
        &s,
        &sid,
        &mut sse,
        r#"/call mcp__t__echo {"text": "2"}"#,
        json!({"approve": false}),
    )
    .await;
    assert!(ran.asked.is_empty(), "the rule covers it");
    assert_eq!(ran.results[0]["output"], "echo: 2");
    let ran = run(
        &s,
        &sid,
        &mut sse,
        r#"/call mcp__t__add {"a": 1, "b": 2}"#,
        json!({"approve": false}),
    )
    .await;
    assert_eq!(ran.asked.len(), 1, "another tool still asks");
    s.stop().await;
}

/// A stdio server's stderr is read all along, whatever it holds: a server that first writes a
/// line that is not UTF-8 and then four pipes' worth of lines starts and answers (vak once
/// stopped reading at that line, the server blocked on its full pipe and never started).
#[tokio::test]
async fn a_stdio_server_that_writes_much_that_is_not_utf8_to_stderr_starts_and_answers() {
    let config = format!(
        "[mcp.servers.noisy]\ncommand = {}\nargs = [{}, \"stdio\"]\nenv = {{ MCP_TEST_NOISE_KIB = \"256\" }}\n",
        lit(&python().display().to_string()),
        lit(&server_py())
    );
    let (s, _home, _ws) = start(&config, PermissionMode::Bypass).await;
    ready(&s, "noisy").await;
    let (sid, mut sse) = session(&s).await;
    let ran = run(
        &s,
        &sid,
        &mut sse,
        r#"/call mcp__noisy__echo {"text": "still here"}"#,
        json!({}),
    )
    .await;
    assert_eq!(ran.results[0]["ok"], true, "{:?}", ran.results);
    assert_eq!(ran.results[0]["output"], "echo: still here", "{:?}", ran.results);
}

#[tokio::test]
async fn a_killed_stdio_server_shows_failed_answers_mcp_unavailable_then_is_ready_again() {
    // The server refuses to start while `down` exists in the workspace, so
    // the failed state lasts as long as the test needs it.
    let script = format!(
        "if [ -e down ]; then echo 'held down by the test' >&2; exit 3; fi; exec {} {} stdio",
        python().display(),
        server_py()
    );
    let config = format!(
        "# a comment\n[mcp.servers.t]\ncommand = \"sh\"\nargs = [\"-c\", {}]\n\n[mcp.servers.slow]\ncommand = {}\nargs = [{}, \"stdio\"]\ntimeout_ms = 300\n",
        lit(&script),
        lit(&python().display().to_string()),
        lit(&server_py())
    );
    let (s, _home, ws) = start(&config, PermissionMode::Bypass).await;
    let t = ready(&s, "t").await;
    ready(&s, "slow").await;
    let pid = t["pid"].as_u64().unwrap() as i32;
    let (sid, mut sse) = session(&s).await;

    // A call past its timeout_ms is cancelled and says so.
    let ran = run(
        &s,
        &sid,
        &mut sse,
        r#"/call mcp__slow__wait {"seconds": 60}"#,
        json!({}),
    )
    .await;
    assert_eq!(ran.results[0]["ok"], false);
    assert!(
        ran.results[0]["output"]
            .as_str()
            .unwrap()
            .starts_with("mcp_timeout:"),
        "{:?}",
        ran.results
    );

    std::fs::write(ws.path().join("down"), "").unwrap();
    // SAFETY: kill sends a signal to the server process this test's server started.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let failed = until(&s, "t", "failed with its reason", |e| {
        e["state"] == "failed"
            && e["last_error"]
                .as_str()
                .is_some_and(|m| m.contains("held down by the test"))
    })
    .await;
    assert!(failed["pid"].is_null(), "{failed}");
    let ran = run(
        &s,
        &sid,
        &mut sse,
        r#"/call mcp__t__echo {"text": "meanwhile"}"#,
        json!({}),
    )
    .await;
    assert_eq!(ran.results[0]["ok"], false);
    let out = ran.results[0]["output"].as_str().unwrap();
    assert!(out.starts_with("mcp_unavailable:"), "{out}");
    assert!(out.contains("held down by the test"), "{out}");

    std::fs::remove_file(ws.path().join("down")).unwrap();
    let back = until(&s, "t", "ready again", |e| e["state"] == "ready").await;
    assert!(back["restarts"].as_u64().unwrap() >= 1, "{back}");
    assert!(back["last_error"].is_null(), "{back}");
    assert_ne!(back["pid"].as_u64().unwrap() as i32, pid);
    let ran = run(
        &s,
        &sid,
        &mut sse,
        r#"/call mcp__t__echo {"text": "back"}"#,
        json!({}),
    )
    .await;
    assert_eq!(ran.results[0]["output"], "echo: back");
    s.stop().await;
    assert!(
        crate::support::exited(back["pid"].as_u64().unwrap() as i32).await,
        "a stopped server's process is gone"
    );
}

/// `server.py http` as a child: its URL, and the child (killed on drop).
async fn http_server(token: &str, dir: &Path) -> (String, tokio::process::Child) {
    use tokio::io::AsyncBufReadExt;
    let mut child = tokio::process::Command::new(python())
        .args([server_py().as_str(), "http"])
        .env("MCP_TEST_TOKEN", token)
        .env("MCP_TEST_DIR", dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
        .await
        .expect("the HTTP server starts")
        .unwrap()
        .unwrap();
    let url = line.strip_prefix("listening ").expect(&line).to_string();
    (url, child)
}

#[tokio::test]
async fn put_config_mcp_adds_an_http_server_keeping_config_toml_outside_mcp_servers() {
    // HOME is set in every test process: the header names it as ${HOME}, and
    // the HTTP server wants its value, so a token that was not expanded fails.
    let token = std::env::var("HOME").expect("HOME is set");
    let marks = tempfile::tempdir().unwrap();
    let (url, _child) = http_server(&token, marks.path()).await;
    let outside = "# vak's config, by hand\n[server]\n# who may call\ntrusted_hosts = [\"example.test\"] # keep me\n\n[model]\nprovider = \"offline\"  # the default\n\n";
    let config = format!("{outside}[mcp.servers.old]\ncommand = \"true\"\nenabled = false\n");
    let (s, home, _ws) = start(&config, PermissionMode::Bypass).await;
    assert_eq!(
        s.get("/config/mcp").await.1["servers"]["old"]["state"],
        "disabled"
    );

    // Refused with the field named; nothing written.
    let bad = json!({"servers": {"web": {"url": url, "headers": {"Authorization": "Bearer ${1BAD}"}}}});
    let (code, e) = s.send(reqwest::Method::PUT, "/config/mcp", Some(bad)).await;
    assert_eq!(code, 400, "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("servers.web.headers.Authorization:"),
        "{e}"
    );
    let (code, e) = s
        .send(
            reqwest::Method::PUT,
            "/config/mcp",
            Some(json!({"servers": {"a__b": {"command": "x"}}})),
        )
        .await;
    assert_eq!(code, 400, "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("servers.a__b:"),
        "{e}"
    );
    assert_eq!(
        std::fs::read_to_string(home.path().join("config.toml")).unwrap(),
        config
    );

    // A wrong credential: failed, and it says why.
    let wrong = json!({"servers": {"web": {"url": url, "headers": {"Authorization": "Bearer nope"}}}});
    let (code, v) = s.send(reqwest::Method::PUT, "/config/mcp", Some(wrong)).await;
    assert_eq!(code, 200, "{v}");
    let web = &v["servers"]["web"];
    assert_eq!(web["state"], "failed", "{v}");
    assert!(
        web["last_error"]
            .as_str()
            .unwrap()
            .contains("refused vak's credentials"),
        "{v}"
    );
    assert!(
        v["servers"].get("old").is_none(),
        "the table is replaced whole: {v}"
    );

    let good = json!({"servers": {"web": {"url": url, "headers": {"Authorization": "Bearer ${HOME}"}, "timeout_ms": 30000}}});
    let (code, v) = s.send(reqwest::Method::PUT, "/config/mcp", Some(good)).await;
    assert_eq!(code, 200, "{v}");
    let web = &v["servers"]["web"];
    assert_eq!(web["state"], "ready", "{v}");
    assert_eq!(web["url"], url.as_str());
    assert_eq!(
        web["headers"]["Authorization"], "Bearer ${HOME}",
        "shown as given, never expanded"
    );
    let written = std::fs::read_to_string(home.path().join("config.toml")).unwrap();
    assert!(
        written.starts_with(outside),
        "everything outside [mcp.servers] is kept:\n{written}"
    );
    assert!(
        written.contains("Bearer ${HOME}") && !written.contains(&token),
        "{written}"
    );
    assert!(!written.contains("[mcp.servers.old]"), "{written}");

    // Usable at once, without a restart.
    let (sid, mut sse) = session(&s).await;
    let ran = run(
        &s,
        &sid,
        &mut sse,
        r#"/call mcp__web__echo {"text": "over http"}"#,
        json!({}),
    )
    .await;
    assert_eq!(ran.results[0]["output"], "echo: over http", "{:?}", ran.results);

    // A changed tool list is taken up.
    let ran = run(&s, &sid, &mut sse, "/call mcp__web__grow {}", json!({})).await;
    assert_eq!(ran.results[0]["output"], "grown");
    until(&s, "web", "listing mcp__web__late", |e| {
        e["tools"]
            .as_array()
            .is_some_and(|t| t.iter().any(|n| n == "mcp__web__late"))
    })
    .await;
    let ran = run(
        &s,
        &sid,
        &mut sse,
        r#"/call mcp__web__late {"word": "x"}"#,
        json!({}),
    )
    .await;
    assert_eq!(ran.results[0]["output"], "late: x");

    // Putting the same table back leaves the connection alone.
    let same = s.get("/config/mcp").await.1;
    let (code, v) = s.send(reqwest::Method::PUT, "/config/mcp", Some(same)).await;
    assert_eq!(code, 200, "{v}");
    assert!(
        v["servers"]["web"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n == "mcp__web__late"),
        "still the same session: {v}"
    );

    // Cancelling the run cancels the call on the server.
    assert_eq!(
        s.run(&sid, r#"/call mcp__web__wait {"seconds": 600}"#).await.0,
        202
    );
    sse.until("tool_call").await;
    assert_eq!(s.post(&format!("/sessions/{sid}/cancel"), json!({})).await.0, 200);
    let frames = sse.until("run_finished").await;
    assert_eq!(crate::support::finished(&frames)["outcome"], "cancelled");
    let mark = marks.path().join("cancelled");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !mark.exists() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the server never heard of the cancellation"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    s.stop().await;
}

/// With `--bus`, the table put on one replica is in VAK_CONFIG, signed
/// with the cluster secret: every replica with the secret runs the servers
/// (its own processes), one started later too; a replica without the secret
/// refuses to put one (403 `no_bus_secret`) and never runs the shared ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_bus_the_mcp_servers_put_on_one_replica_run_on_every_replica_with_the_cluster_secret() {
    use crate::support::nats::{Cluster, Replica};
    use std::os::unix::fs::PermissionsExt;
    let nats = Cluster::three().await;
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("bus-secret");
    std::fs::write(
        &secret,
        "9c2e4b6d8f0a1c3e5b7d9f4f1e9a0c7b2d5e8f3a6c9b0d2e4f6a8c1b3d5e7f9a\n",
    )
    .unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let secret = secret.display().to_string();
    let start = |name: &'static str, signed: bool| {
        let url = nats.url();
        let secret = secret.clone();
        async move {
            Replica::start(&url, name, "3", |s| {
                if signed {
                    s.args(["--bus-secret-file", secret.as_str()])
                } else {
                    s
                }
            })
            .await
        }
    };
    let a = start("ra", true).await;
    let b = start("rb", true).await;
    let c = start("rc", false).await;

    let table = json!({"servers": {"t": {"command": python().display().to_string(), "args": [server_py(), "stdio"]}}});
    let (code, v) = c
        .api
        .send(reqwest::Method::PUT, "/config/mcp", Some(table.clone()))
        .await;
    assert_eq!(code, 403, "{v}");
    assert_eq!(v["error"]["reason"], "no_bus_secret", "{v}");

    let (code, v) = a.api.send(reqwest::Method::PUT, "/config/mcp", Some(table)).await;
    assert_eq!(code, 200, "{v}");
    let on_a = &v["servers"]["t"];
    assert_eq!(on_a["state"], "ready", "{v}");
    let on_b = ready(&b.api, "t").await;
    assert_ne!(on_b["pid"], on_a["pid"], "each replica runs its own process");
    let (sid, mut sse) = session(&b.api).await;
    let ran = run(
        &b.api,
        &sid,
        &mut sse,
        r#"/call mcp__t__add {"a": 20, "b": 22}"#,
        json!({"approve": true}),
    )
    .await;
    assert_eq!(ran.results[0]["output"], "42", "{:?}", ran.results);

    let d = start("rd", true).await;
    ready(&d.api, "t").await;
    assert!(
        c.api.get("/config/mcp").await.1["servers"].get("t").is_none(),
        "a replica without the secret does not run the shared servers"
    );
}

// ---- vak term ------------------------------------------------------------------

/// `vak term --url … --token … --transport T ARGS` with stdin piped.
fn term(s: &TestServer, transport: &str, args: &[&str]) -> tokio::process::Command {
    let mut cmd = crate::support::process::vak(&["term", "--url", &s.url, "--token", TOKEN]);
    cmd.args(["--transport", transport])
        .args(args)
        .env_remove("VAK_URL")
        .stdin(std::process::Stdio::piped());
    cmd
}

#[tokio::test]
async fn vak_term_shows_an_mcp_tool_call_like_the_others_and_asks_for_it_one_shot_and_interactive() {
    use tokio::io::AsyncWriteExt;
    let config = format!(
        "[mcp.servers.t]\ncommand = {}\nargs = [{}, \"stdio\"]\n",
        lit(&python().display().to_string()),
        lit(&server_py())
    );
    let (s, _home, ws) = start(&config, PermissionMode::Default).await;
    ready(&s, "t").await;

    // One-shot, over both transports: the question is asked on stderr and
    // answered on stdin; `a` keeps a tool rule, so the second call asks nobody.
    for (t, tool, first, second, shown) in [
        (
            "sse",
            "echo",
            r#"{"text": "one"}"#,
            r#"{"text": "two"}"#,
            [r#"{"text":"one"}"#, "echo: one", "echo: two"],
        ),
        (
            "grpc",
            "add",
            r#"{"a": 2, "b": 3}"#,
            r#"{"a": 4, "b": 5}"#,
            [r#"{"a":2,"b":3}"#, "5", "9"],
        ),
    ] {
        let name = format!("mcp__t__{tool}");
        let prompt = format!("/call {name} {first}\n/call {name} {second}");
        let mut child = term(&s, t, &["--approve", "ask", "-p", &prompt]).spawn().unwrap();
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"a\n").await.unwrap();
        drop(stdin);
        let out = tokio::time::timeout(crate::support::DEADLINE, child.wait_with_output())
            .await
            .expect("vak term exits within the deadline")
            .unwrap();
        let err = String::from_utf8(out.stderr).unwrap();
        assert_eq!(out.status.code(), Some(0), "{t}: {err}");
        for line in [
            format!("vak: ⚙ {name} {}", shown[0]),
            format!(
                "vak: {name} wants approval: run {name}  [y]es / [n]o / [a]lways allow in this workspace"
            ),
            format!("vak: · always allowing every `{name}` call in this workspace"),
            format!("vak: ✓ {name} approved"),
            format!("vak: ✓ {name}: {}", shown[1]),
            format!("vak: ✓ {name}: {}", shown[2]),
        ] {
            assert!(
                err.lines().any(|l| l.trim_end() == line),
                "{t}: {line:?} in:\n{err}"
            );
        }
        assert_eq!(err.matches("wants approval").count(), 1, "{t}: {err}");
        let said = String::from_utf8(out.stdout).unwrap();
        assert!(said.contains(&format!("result: {}", shown[2])), "{t}: {said}");
    }
    let (_, rules) = s.get("/permissions/rules").await;
    let kinds: Vec<(&str, &str)> = rules["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["pattern"].as_str().unwrap(), r["kind"].as_str().unwrap()))
        .collect();
    assert_eq!(kinds.len(), 2, "{rules}");
    assert!(
        kinds.contains(&("mcp__t__echo", "tool")) && kinds.contains(&("mcp__t__add", "tool")),
        "{rules}"
    );

    // Interactive, in a real terminal: the call, the question, the failed result.
    let mut cmd = portable_pty::CommandBuilder::new(env!("CARGO_BIN_EXE_vak"));
    cmd.args(["term", "--url", &s.url, "--token", TOKEN, "--transport", "sse"]);
    for v in ["VAK_URL", "VAK_TOKEN", "VAK_HOME", "RUST_LOG"] {
        cmd.env_remove(v);
    }
    cmd.env("TERM", "xterm-256color");
    cmd.cwd(ws.path());
    let mut pty = Pty::spawn(cmd, 30, 120);
    pty.wait_for("vak term · new session").await;
    pty.send("/call mcp__t__fail {\"why\": \"no luck\"}\r");
    let screen = pty.wait_for("[y]es / [n]o / [a]lways").await;
    assert!(screen.contains(r#"⚙ mcp__t__fail {"why":"no luck"}"#), "{screen}");
    assert!(
        screen.contains("? mcp__t__fail run mcp__t__fail  [y]es"),
        "{screen}"
    );
    pty.send("y");
    let screen = pty
        .wait_for("✗ mcp__t__fail: Error executing tool fail: no luck")
        .await;
    assert!(screen.contains("✓ mcp__t__fail approved"), "{screen}");
    pty.send("\x04");
    assert_eq!(pty.wait_exit().await, 0, "Ctrl-D at an empty prompt exits 0");
}
