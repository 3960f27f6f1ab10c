//! The real `vak` binary: the startup line, server.json, SIGTERM, startup failures, the
//! VAK_TOKEN / VAK_HOME environment, and the log lines of a run and of a failed login.

use crate::support::process::Vak;
use crate::support::*;
use serde_json::Value;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::ExitStatus;
use vak::proto::v1 as pb;

/// `vak serve --listen LISTEN EXTRA… --home HOME --workspace WS` (no `--token` unless in EXTRA).
fn serve_at(listen: &str, home: &Path, ws: &Path, extra: &[&str]) -> Serve {
    Serve::new()
        .listen(listen)
        .no_token()
        .home(home)
        .workspace(ws)
        .args(extra)
}

/// Runs a `vak` that is expected to fail at startup: (status, stdout, stderr).
async fn run_to_exit(serve: Serve) -> (ExitStatus, String, String) {
    let out = serve.output().await;
    (
        out.status,
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

/// The one non-empty line of `stderr` (panics when there are several or none).
#[track_caller]
fn one_line(stderr: &str) -> &str {
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "exactly one line on stderr, got {stderr:?}");
    lines[0]
}

fn server_json(home: &Path) -> Value {
    let raw = std::fs::read(home.join("server.json")).expect("server.json exists");
    serde_json::from_slice(&raw).expect("server.json is JSON")
}

async fn get_status(url: &str, path: &str, token: Option<&str>) -> u16 {
    let mut req = reqwest::Client::new().get(format!("{url}{path}"));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    tokio::time::timeout(DEADLINE, req.send())
        .await
        .expect("an answer within the deadline")
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test]
async fn serve_announces_its_real_port_answers_there_and_writes_server_json_owner_only() {
    let home = tempfile::tempdir().unwrap();
    let ws = tempfile::tempdir().unwrap();
    let cmd = serve_at("127.0.0.1:0", home.path(), ws.path(), &["--token", "T0k"]);
    let mut v = cmd.spawn().vak;
    let url = v.url().await;
    let port: u16 = url
        .strip_prefix("http://127.0.0.1:")
        .unwrap_or_else(|| panic!("a loopback URL: {url}"))
        .parse()
        .unwrap_or_else(|_| panic!("a numeric port: {url}"));
    assert_ne!(port, 0, "the real port, not the requested 0");

    let health = reqwest::get(format!("{url}/health")).await.unwrap();
    assert_eq!(health.status(), 200);
    assert_eq!(health.json::<Value>().await.unwrap()["status"], "ok");
    assert_eq!(get_status(&url, "/sessions", Some("T0k")).await, 200);
    assert_eq!(get_status(&url, "/sessions", None).await, 401);

    let path = home.path().join("server.json");
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "server.json holds the token: owner only");
    let info = server_json(home.path());
    assert_eq!(info["url"], url.as_str());
    assert_eq!(info["token"], "T0k");
}

/// Starts vak, opens an SSE and a gRPC stream on a session sleeping in a run, sends `signal`,
/// and checks both streams see the run cancelled and the session closed, and vak exits 0.
async fn signal_stops_gracefully(signal: &str) {
    let home = tempfile::tempdir().unwrap();
    let ws = tempfile::tempdir().unwrap();
    let cmd = serve_at("127.0.0.1:0", home.path(), ws.path(), &["--token", "T"]);
    let mut v = cmd.spawn().vak;
    let url = v.url().await;
    let http = reqwest::Client::new();

    let created: Value = http
        .post(format!("{url}/sessions"))
        .bearer_auth("T")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let sid = created["session_id"].as_str().unwrap().to_string();
    let resp = http
        .get(format!("{url}/sessions/{sid}/events"))
        .bearer_auth("T")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut sse = Sse::new(resp);
    assert_eq!(sse.next().await.unwrap().event, "stream_opened");
    let channel = tonic::transport::Endpoint::from_shared(url.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = pb::agent_service_client::AgentServiceClient::with_interceptor(channel, Auth("T".into()));
    let (mut events, _) = grpc_subscribe(&mut grpc, &sid, None).await;

    let r = http
        .post(format!("{url}/sessions/{sid}/run"))
        .bearer_auth("T")
        .json(&serde_json::json!({"prompt": "/sleep 60000"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    sse.until("turn_started").await;
    events.until("turn_started").await;

    v.signal(signal);
    let frames = sse.until("run_finished").await;
    assert_eq!(
        frames.last().unwrap().body()["outcome"],
        "cancelled",
        "{frames:?}"
    );
    let closed = sse.next().await.expect("session_closed follows");
    assert_eq!(closed.event, "session_closed", "{closed:?}");
    assert!(
        sse.next().await.is_none(),
        "the SSE stream ends after session_closed"
    );

    let got = events.until("run_finished").await;
    assert_eq!(outcome_of(got.last().unwrap()), "cancelled");
    let closed = events.expect_next().await;
    assert_eq!(kind_of(&closed), "session_closed", "{closed:?}");
    assert!(
        events.next().await.is_none(),
        "the gRPC stream ends after session_closed"
    );

    let status = v.wait().await;
    assert_eq!(status.code(), Some(0), "graceful shutdown on SIG{signal} exits 0");

    // The ledger was flushed: the settled run is on disk.
    let ledger = std::fs::read_to_string(home.path().join(format!("sessions/{sid}.jsonl"))).unwrap();
    let last: Value = serde_json::from_str(ledger.lines().last().unwrap()).unwrap();
    assert_eq!(last["event"]["event"]["kind"], "run_finished", "{ledger}");
    assert_eq!(last["event"]["event"]["outcome"], "cancelled", "{ledger}");
}

#[tokio::test]
async fn sigterm_settles_the_run_closes_every_stream_and_exits_zero() {
    signal_stops_gracefully("TERM").await;
}

#[tokio::test]
async fn sigint_settles_the_run_closes_every_stream_and_exits_zero() {
    signal_stops_gracefully("INT").await;
}

#[tokio::test]
async fn a_signal_during_startup_stops_it_cleanly_and_frees_the_home() {
    for signal in ["TERM", "INT"] {
        let home = tempfile::tempdir().unwrap();
        let ws = tempfile::tempdir().unwrap();
        // A bus that takes the connection and never answers: startup waits on it.
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let bus = format!("nats://{}", silent.local_addr().unwrap());
        let cmd = serve_at(
            "127.0.0.1:0",
            home.path(),
            ws.path(),
            &["--token", "T", "--bus", &bus],
        );
        let mut v = cmd.spawn().vak;
        let _held = tokio::time::timeout(DEADLINE, silent.accept())
            .await
            .expect("vak connects to the bus")
            .unwrap();
        v.signal(signal);
        let status = v.wait().await;
        assert_eq!(
            status.code(),
            Some(0),
            "SIG{signal} during startup stops it cleanly, not by the default action: {status:?}"
        );
        assert!(!home.path().join("server.json").exists());
        // The home is free at once: the next server starts on it.
        let mut next = serve_at("127.0.0.1:0", home.path(), ws.path(), &["--token", "T"])
            .spawn()
            .vak;
        next.url().await;
        next.signal("TERM");
        assert_eq!(next.wait().await.code(), Some(0));
    }
}

#[tokio::test]
async fn a_taken_port_exits_nonzero_with_one_line_naming_the_address() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let home = tempfile::tempdir().unwrap();
    let ws = tempfile::tempdir().unwrap();
    let cmd = serve_at(&addr, home.path(), ws.path(), &["--token", "T"]);
    let (status, stdout, stderr) = run_to_exit(cmd).await;
    assert!(!status.success(), "a taken port is fatal: {status:?}");
    assert!(!stdout.contains("listening on"), "{stdout}");
    let line = one_line(&stderr);
    assert!(line.contains(&addr), "the line names {addr}: {line:?}");
    drop(taken);
}

#[tokio::test]
async fn an_unwritable_home_exits_nonzero_with_one_clear_line() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, "not a directory").unwrap();
    let home = file.join("home");
    let ws = tempfile::tempdir().unwrap();
    let cmd = serve_at("127.0.0.1:0", &home, ws.path(), &["--token", "T"]);
    let (status, stdout, stderr) = run_to_exit(cmd).await;
    assert!(!status.success(), "{status:?}");
    assert!(!stdout.contains("listening on"), "{stdout}");
    let line = one_line(&stderr);
    assert!(
        line.contains(&*file.to_string_lossy()),
        "the line names the home: {line:?}"
    );
}

#[tokio::test]
async fn a_non_loopback_listen_address_is_refused() {
    let home = tempfile::tempdir().unwrap();
    let ws = tempfile::tempdir().unwrap();
    let cmd = serve_at("0.0.0.0:0", home.path(), ws.path(), &["--token", "T"]);
    let (status, stdout, stderr) = run_to_exit(cmd).await;
    assert!(!status.success(), "{status:?}");
    assert!(!stdout.contains("listening on"), "{stdout}");
    let line = one_line(&stderr);
    assert!(line.contains("0.0.0.0"), "{line:?}");
}

#[tokio::test]
async fn vak_token_and_vak_home_are_honoured_without_flags() {
    let home = tempfile::tempdir().unwrap();
    let ws = tempfile::tempdir().unwrap();
    let cmd = Serve::new()
        .no_token()
        .no_home()
        .workspace(ws.path())
        .env("VAK_TOKEN", "from-env")
        .env("VAK_HOME", home.path());
    let mut v = cmd.spawn().vak;
    let url = v.url().await;
    assert_eq!(get_status(&url, "/sessions", Some("from-env")).await, 200);
    assert_eq!(get_status(&url, "/sessions", Some("other")).await, 401);
    let info = server_json(home.path());
    assert_eq!(info["url"], url.as_str());
    assert_eq!(info["token"], "from-env");
    assert!(
        home.path().join("sessions").is_dir(),
        "VAK_HOME holds the ledgers"
    );
}

#[tokio::test]
async fn without_a_token_one_is_generated_written_to_server_json_and_accepted() {
    let home = tempfile::tempdir().unwrap();
    let ws = tempfile::tempdir().unwrap();
    let cmd = serve_at("127.0.0.1:0", home.path(), ws.path(), &[]);
    let mut v = cmd.spawn().vak;
    let url = v.url().await;
    let info = server_json(home.path());
    assert_eq!(info["url"], url.as_str());
    let token = info["token"]
        .as_str()
        .expect("a token in server.json")
        .to_string();
    assert!(token.len() >= 32, "a random token of real length: {token:?}");
    assert_eq!(get_status(&url, "/sessions", Some(&token)).await, 200);
    assert_eq!(get_status(&url, "/sessions", None).await, 401);
    let mode = std::fs::metadata(home.path().join("server.json"))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600);

    // A second server generates a different token.
    let home2 = tempfile::tempdir().unwrap();
    let cmd = serve_at("127.0.0.1:0", home2.path(), ws.path(), &[]);
    let mut v2 = cmd.spawn().vak;
    let url2 = v2.url().await;
    let token2 = server_json(home2.path())["token"].as_str().unwrap().to_string();
    assert_ne!(token, token2, "tokens are random");
    assert_eq!(get_status(&url2, "/sessions", Some(&token)).await, 401);
}

#[tokio::test]
async fn flags_take_precedence_over_the_environment() {
    let flag_home = tempfile::tempdir().unwrap();
    let env_home = tempfile::tempdir().unwrap();
    let ws = tempfile::tempdir().unwrap();
    let cmd = Serve::new()
        .token("from-flag")
        .home(flag_home.path())
        .workspace(ws.path())
        .env("VAK_TOKEN", "from-env")
        .env("VAK_HOME", env_home.path());
    let mut v = cmd.spawn().vak;
    let url = v.url().await;
    assert_eq!(get_status(&url, "/sessions", Some("from-flag")).await, 200);
    assert_eq!(get_status(&url, "/sessions", Some("from-env")).await, 401);
    assert_eq!(server_json(flag_home.path())["token"], "from-flag");
    assert!(!env_home.path().join("server.json").exists());
}

/// Every stdout line up to and including the `listening on` line (once `url` returned).
fn startup_lines(v: &Vak) -> Vec<String> {
    let mut lines = v.banner().to_vec();
    lines.push(v.announced().to_string());
    lines
}

#[tokio::test]
async fn allow_remote_binds_any_address_names_a_loopback_url_and_warns_without_tls() {
    let home = tempfile::tempdir().unwrap();
    let ws = tempfile::tempdir().unwrap();
    let cmd = serve_at(
        "0.0.0.0:0",
        home.path(),
        ws.path(),
        &["--allow-remote", "--token", "T"],
    );
    let mut v = cmd.spawn().vak;
    let url = v.url().await;
    let lines = startup_lines(&v);
    assert!(
        lines.iter().any(|l| l.contains("bound to 0.0.0.0:")),
        "the bound address is said too: {lines:?}"
    );
    assert!(
        url.starts_with("http://127.0.0.1:"),
        "a URL a local client can use (the Host check refuses 0.0.0.0): {url}"
    );
    assert_eq!(server_json(home.path())["url"], url.as_str());
    assert_eq!(get_status(&url, "/sessions", Some("T")).await, 200);
    let warned = v
        .log()
        .lines()
        .any(|l| l.contains("warning") && l.contains("without TLS"));
    assert!(warned, "stderr: {:?}", v.log());
    v.kill().await;
}

#[tokio::test]
async fn listen_accepts_localhost_as_a_name_for_127_0_0_1() {
    let home = tempfile::tempdir().unwrap();
    let ws = tempfile::tempdir().unwrap();
    let cmd = serve_at("localhost:0", home.path(), ws.path(), &["--token", "T"]);
    let mut v = cmd.spawn().vak;
    let url = v.url().await;
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    assert_eq!(get_status(&url, "/sessions", Some("T")).await, 200);

    let cmd = serve_at("localhost:http", ws.path(), ws.path(), &["--token", "T"]);
    let (status, _, stderr) = run_to_exit(cmd).await;
    assert!(!status.success());
    assert!(stderr.contains("--listen"), "clap names the flag: {stderr}");
}

#[tokio::test]
async fn tls_self_signed_prints_its_fingerprint_and_serves_https() {
    let home = tempfile::tempdir().unwrap();
    let ws = tempfile::tempdir().unwrap();
    let cmd = serve_at(
        "127.0.0.1:0",
        home.path(),
        ws.path(),
        &["--tls-self-signed", "--token", "T"],
    );
    let mut v = cmd.spawn().vak;
    let url = v.url().await;
    assert!(url.starts_with("https://127.0.0.1:"), "{url}");
    let lines = startup_lines(&v);
    let fp = lines
        .iter()
        .find(|l| l.contains("sha256 fingerprint"))
        .expect("a fingerprint line");
    let fp = fp.rsplit(' ').next().unwrap();
    assert_eq!(fp.len(), 32 * 3 - 1, "colon-separated SHA-256: {fp}");
    let port = lines
        .last()
        .unwrap()
        .rsplit(':')
        .next()
        .unwrap()
        .trim()
        .to_string();
    let pem = std::fs::read(home.path().join("tls/dev-cert.pem")).unwrap();
    let key_mode = std::fs::metadata(home.path().join("tls/dev-key.pem"))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(key_mode, 0o600);
    let c = reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(&pem).unwrap())
        .build()
        .unwrap();
    let r = c
        .get(format!("https://localhost:{port}/health"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    v.kill().await;
}

#[tokio::test]
async fn config_toml_trusted_hosts_apply_and_a_bad_config_stops_startup() {
    let home = tempfile::tempdir().unwrap();
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(
        home.path().join("config.toml"),
        "[server]\ntrusted_hosts = [\"vak.test\"]\n",
    )
    .unwrap();
    let cmd = serve_at("127.0.0.1:0", home.path(), ws.path(), &["--token", "T"]);
    let mut v = cmd.spawn().vak;
    let url = v.url().await;
    let r = reqwest::Client::new()
        .get(format!("{url}/sessions"))
        .bearer_auth("T")
        .header("host", "vak.test:8901")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "a trusted host from config.toml");
    v.kill().await;

    std::fs::write(home.path().join("config.toml"), "[server]\ntrusted_host = 1\n").unwrap();
    let cmd = serve_at("127.0.0.1:0", home.path(), ws.path(), &["--token", "T"]);
    let (status, _, stderr) = run_to_exit(cmd).await;
    assert!(!status.success());
    let line = one_line(&stderr);
    assert!(
        line.contains("config.toml line 2:"),
        "the line of the bad key: {line}"
    );

    let cmd = serve_at(
        "127.0.0.1:0",
        ws.path(),
        ws.path(),
        &["--token", "T", "--allow-origin", "*"],
    );
    let (status, _, stderr) = run_to_exit(cmd).await;
    assert!(!status.success(), "a wildcard origin is refused");
    assert!(one_line(&stderr).contains("no wildcards"), "{stderr}");
}

/// `vak serve --home H` with a fresh workspace and no token flag.
fn serve_on(home: &Path, ws: &Path, extra: &[&str]) -> Serve {
    serve_at("127.0.0.1:0", home, ws, extra)
}

#[tokio::test]
async fn a_second_server_on_a_live_home_exits_2_naming_the_first_and_leaves_it_untouched() {
    let home = tempfile::tempdir().unwrap();
    let ws = tempfile::tempdir().unwrap();
    let mut first = serve_on(home.path(), ws.path(), &["--token", "T"]).spawn().vak;
    let url = first.url().await;
    let http = reqwest::Client::new();
    let sid = http
        .post(format!("{url}/sessions"))
        .bearer_auth("T")
        .send()
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap()["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    let before = std::fs::read(home.path().join("server.json")).unwrap();

    let (status, stdout, stderr) = run_to_exit(serve_on(home.path(), ws.path(), &["--token", "OTHER"])).await;
    assert_eq!(status.code(), Some(2), "a second server on an owned home exits 2");
    assert!(!stdout.contains("listening on"), "{stdout}");
    let line = one_line(&stderr);
    assert!(
        line.contains(&format!("pid {}", first.pid())),
        "names the pid: {line}"
    );
    assert!(line.contains(&url), "names the URL: {line}");
    assert_eq!(
        std::fs::read(home.path().join("server.json")).unwrap(),
        before,
        "the first server's server.json is untouched"
    );
    // Also with --rotate-token: the owner's token is not replaced behind its back.
    let (status, _, _) = run_to_exit(serve_on(home.path(), ws.path(), &["--rotate-token"])).await;
    assert_eq!(status.code(), Some(2));
    assert!(
        !home.path().join("token").exists(),
        "nothing was written to the home"
    );
    assert_eq!(
        get_status(&url, "/sessions", Some("T")).await,
        200,
        "the first still serves"
    );

    // A killed server leaves its lock behind in name only: a restart is not blocked.
    first.kill().await;
    let mut next = serve_on(home.path(), ws.path(), &["--token", "T"]).spawn().vak;
    let url = next.url().await;
    let list: Value = http
        .get(format!("{url}/sessions"))
        .bearer_auth("T")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(list["sessions"][0]["session_id"], sid.as_str());
    assert_eq!(server_json(home.path())["pid"], next.pid());
}

#[tokio::test]
async fn the_token_is_kept_in_the_home_across_restarts_until_rotated() {
    let home = tempfile::tempdir().unwrap();
    let ws = tempfile::tempdir().unwrap();
    let mut v = serve_on(home.path(), ws.path(), &[]).spawn().vak;
    let url = v.url().await;
    let first = server_json(home.path())["token"].as_str().unwrap().to_string();
    let kept = std::fs::read_to_string(home.path().join("token")).unwrap();
    assert_eq!(kept.trim(), first, "the generated token is kept in the home");
    let mode = std::fs::metadata(home.path().join("token"))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600, "owner only");
    assert_eq!(get_status(&url, "/sessions", Some(&first)).await, 200);
    assert_eq!(v.terminate().await.code(), Some(0));

    let mut v = serve_on(home.path(), ws.path(), &[]).spawn().vak;
    let url = v.url().await;
    assert_eq!(
        server_json(home.path())["token"],
        first.as_str(),
        "a restart keeps it"
    );
    assert_eq!(get_status(&url, "/sessions", Some(&first)).await, 200);
    assert_eq!(v.terminate().await.code(), Some(0));

    let mut v = serve_on(home.path(), ws.path(), &["--rotate-token"]).spawn().vak;
    let url = v.url().await;
    let rotated = server_json(home.path())["token"].as_str().unwrap().to_string();
    assert_ne!(rotated, first, "--rotate-token makes a new one");
    assert!(rotated.len() >= 32);
    assert_eq!(get_status(&url, "/sessions", Some(&first)).await, 401);
    assert_eq!(get_status(&url, "/sessions", Some(&rotated)).await, 200);
    assert_eq!(v.terminate().await.code(), Some(0));

    // --token overrides for one run without replacing what is kept.
    let mut v = serve_on(home.path(), ws.path(), &["--token", "just-this-once"])
        .spawn()
        .vak;
    let url = v.url().await;
    assert_eq!(get_status(&url, "/sessions", Some("just-this-once")).await, 200);
    assert_eq!(get_status(&url, "/sessions", Some(&rotated)).await, 401);
    assert_eq!(
        std::fs::read_to_string(home.path().join("token")).unwrap().trim(),
        rotated
    );
    v.kill().await;

    let (status, _, stderr) = run_to_exit(serve_on(
        home.path(),
        ws.path(),
        &["--token", "x", "--rotate-token"],
    ))
    .await;
    assert!(!status.success());
    assert!(stderr.contains("--rotate-token"), "{stderr}");
}

/// Every stderr line of a server that served a few requests and was stopped.
async fn logs_of(extra: &[&str], token: &str) -> Vec<String> {
    let home = tempfile::tempdir().unwrap();
    let ws = tempfile::tempdir().unwrap();
    let mut args = vec!["--token", token];
    args.extend_from_slice(extra);
    let mut v = serve_on(home.path(), ws.path(), &args).spawn().vak;
    let url = v.url().await;
    assert_eq!(get_status(&url, "/sessions", Some(token)).await, 200);
    assert_eq!(get_status(&url, "/sessions", None).await, 401);
    assert_eq!(
        get_status(&url, &format!("/sessions?token={token}"), None).await,
        200
    );
    let channel = tonic::transport::Endpoint::from_shared(url.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc =
        pb::agent_service_client::AgentServiceClient::with_interceptor(channel, Auth(token.into()));
    grpc.list_sessions(pb::ListSessionsRequest {}).await.unwrap();
    drop(grpc);
    // A Connect call, as curl makes it.
    let r = reqwest::Client::new()
        .post(format!("{url}/vak.v1.AgentService/ListSessions"))
        .bearer_auth(token)
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.bytes().await.unwrap();
    v.signal("TERM");
    let status = v.wait().await;
    assert_eq!(status.code(), Some(0));
    // `wait` has read its stderr to the end once the process is gone.
    let lines: Vec<String> = v.log().lines().map(str::to_string).collect();
    assert!(
        lines.iter().any(|l| l.contains("shutting down")),
        "no shutdown line: {lines:?}"
    );
    lines
}

#[tokio::test]
async fn logs_are_plain_one_line_per_request_and_never_hold_the_token() {
    let token = "SeCrEt-t0ken-value";
    let lines = logs_of(&[], token).await;
    let all = lines.join("\n");
    assert!(
        !all.contains('\x1b'),
        "no ANSI codes when stderr is not a terminal: {all}"
    );
    assert!(!all.contains(token), "the token never reaches a log: {all}");
    let requests: Vec<&String> = lines.iter().filter(|l| l.contains("vak::access")).collect();
    assert_eq!(requests.len(), 5, "one line per request: {requests:#?}");
    let has = |parts: &[&str]| requests.iter().any(|l| parts.iter().all(|p| l.contains(p)));
    assert!(
        has(&[
            "protocol=\"rest\"",
            "method=GET",
            "path=/sessions ",
            "status=200",
            "peer=127.0.0.1:",
            "latency_ms="
        ]),
        "{all}"
    );
    assert!(has(&["path=/sessions ", "status=401"]), "{all}");
    assert!(has(&["path=/sessions?token=[redacted]", "status=200"]), "{all}");
    assert!(
        has(&[
            "protocol=\"grpc\"",
            "method=POST",
            "path=/vak.v1.AgentService/ListSessions",
            "grpc_status=0"
        ]),
        "{all}"
    );
    assert!(
        has(&[
            "protocol=\"connect\"",
            "path=/vak.v1.AgentService/ListSessions",
            "status=200"
        ]),
        "{all}"
    );
}

#[tokio::test]
async fn log_format_json_writes_one_json_object_per_line() {
    let token = "json-t0ken-value";
    let lines = logs_of(&["--log-format", "json"], token).await;
    let objects: Vec<Value> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let access: Vec<&Value> = objects.iter().filter(|o| o["target"] == "vak::access").collect();
    assert_eq!(access.len(), 5, "{objects:#?}");
    assert!(access.iter().any(|o| o["protocol"] == "connect"), "{access:#?}");
    assert!(access
        .iter()
        .any(|o| o["method"] == "GET" && o["path"] == "/sessions" && o["status"] == 401));
    assert!(!lines.join("\n").contains(token));
}

#[tokio::test]
async fn remote_exposure_serves_tls_to_a_trusted_host() {
    let dir = tempfile::tempdir().unwrap();
    let ws = tempfile::tempdir().unwrap();
    let made = rcgen::generate_simple_self_signed(vec!["vak.example.com".to_string()]).unwrap();
    std::fs::write(dir.path().join("cert.pem"), made.cert.pem()).unwrap();
    std::fs::write(dir.path().join("key.pem"), made.key_pair.serialize_pem()).unwrap();
    let mut v = Serve::new()
        .listen("0.0.0.0:0")
        .arg("--allow-remote")
        .token("T")
        .current_dir(dir.path())
        .args(["--tls-cert", "cert.pem", "--tls-key", "key.pem"])
        .args(["--trusted-host", "vak.example.com"])
        .home(dir.path().join("home"))
        .workspace(ws.path())
        .spawn()
        .vak;
    let url = v.url().await;
    assert!(url.starts_with("https://127.0.0.1:"), "{url}");
    let lines = startup_lines(&v);
    let port: u16 = lines
        .last()
        .unwrap()
        .rsplit(':')
        .next()
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let client = reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(made.cert.pem().as_bytes()).unwrap())
        .resolve("vak.example.com", ([127, 0, 0, 1], port).into())
        .build()
        .unwrap();
    let r = client
        .get(format!("https://vak.example.com:{port}/sessions"))
        .bearer_auth("T")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "the trusted name, over TLS");
    assert!(
        !v.log().lines().any(|l| l.contains("without TLS")),
        "no plaintext warning with TLS on"
    );
    v.kill().await;
}

fn mode_of(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

#[tokio::test]
async fn everything_in_the_home_is_owner_only_whatever_the_umask() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("fresh-home");
    let ws = tempfile::tempdir().unwrap();
    let home_s = home.to_str().unwrap();
    let ws_s = ws.path().to_str().unwrap();
    // `vak serve` started through `sh -c 'umask …; exec vak serve …'`.
    let args = |umask: &str| {
        Serve::new()
            .prelude(umask)
            .no_token()
            .home(home_s)
            .workspace(ws_s)
            .arg("--tls-self-signed")
    };
    let mut v = args("umask 000").spawn().vak;
    let url = v.url().await;
    assert!(url.starts_with("https://"), "{url}");
    let token = server_json(&home)["token"].as_str().unwrap().to_string();
    let pem = std::fs::read(home.join("tls/dev-cert.pem")).unwrap();
    let client = reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(&pem).unwrap())
        .build()
        .unwrap();
    let url = url.replace("127.0.0.1", "localhost");
    let r = client
        .post(format!("{url}/sessions"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let sid = r.json::<Value>().await.unwrap()["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    for d in [home.clone(), home.join("sessions"), home.join("tls")] {
        assert_eq!(mode_of(&d), 0o700, "{}", d.display());
    }
    for f in [
        "server.json",
        "server.lock",
        "token",
        "tls/dev-cert.pem",
        "tls/dev-key.pem",
    ] {
        assert_eq!(mode_of(&home.join(f)), 0o600, "{f}");
    }
    assert_eq!(
        mode_of(&home.join(format!("sessions/{sid}.jsonl"))),
        0o600,
        "the ledger"
    );
    assert!(
        !v.log().lines().any(|l| l.contains("other users can read")),
        "no warning for a home vak made itself"
    );
    v.kill().await;

    // An existing home others can read: a warning, and vak's own files tightened.
    std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(home.join("sessions"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let ledger = home.join(format!("sessions/{sid}.jsonl"));
    std::fs::set_permissions(&ledger, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut v = args("umask 022").spawn().vak;
    let url = v.url().await;
    assert!(url.starts_with("https://"), "{url}");
    let url = url.replace("127.0.0.1", "localhost");
    let r = client
        .get(format!("{url}/sessions/{sid}/transcript"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(mode_of(&home.join("sessions")), 0o700);
    assert_eq!(mode_of(&ledger), 0o600, "a loaded ledger is tightened");
    let warned = v.log();
    assert!(
        warned
            .lines()
            .any(|l| l.contains("other users can read the home") && l.contains("755")),
        "{warned:?}"
    );
    v.kill().await;
}

#[tokio::test]
async fn many_sessions_under_a_low_fd_limit_all_work() {
    let home = tempfile::tempdir().unwrap();
    let ws = tempfile::tempdir().unwrap();
    let mut v = Serve::new()
        .prelude("ulimit -n 200")
        .token("T")
        .home(home.path())
        .workspace(ws.path())
        .spawn()
        .vak;
    let url = v.url().await;
    assert!(url.starts_with("http://"), "{url}");
    let http = reqwest::Client::new();
    let mut sids = Vec::new();
    for i in 0..400 {
        let r = http
            .post(format!("{url}/sessions"))
            .bearer_auth("T")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201, "session {i}: {}", r.text().await.unwrap());
        sids.push(
            r.json::<Value>().await.unwrap()["session_id"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    for sid in [&sids[0], &sids[399]] {
        let r = http
            .post(format!("{url}/sessions/{sid}/run"))
            .bearer_auth("T")
            .json(&serde_json::json!({"prompt": "hello"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 202);
    }
    v.kill().await;
}

#[tokio::test]
async fn sigterm_right_after_the_listening_line_is_a_graceful_stop() {
    for _ in 0..10 {
        let home = tempfile::tempdir().unwrap();
        let ws = tempfile::tempdir().unwrap();
        let mut v = serve_on(home.path(), ws.path(), &["--token", "T"]).spawn().vak;
        v.url().await;
        let status = v.terminate().await;
        assert_eq!(
            status.code(),
            Some(0),
            "stopped by its handler, not the default action"
        );
        assert!(
            !home.path().join("server.json").exists(),
            "a graceful stop removes server.json"
        );
    }
}

#[tokio::test]
async fn a_run_logs_a_line_when_it_starts_and_when_it_ends_and_a_failed_login_its_peer() {
    let served = Serve::new().start().await;
    let api = served.api();
    let sid = api.create_session().await;
    let mut events = api.events(&sid, None).await;
    let (status, b) = api.run(&sid, "hello log").await;
    assert!(status < 300, "{b}");
    events.until("run_finished").await;
    let login = reqwest::Client::new()
        .post(format!("{}/auth/login", served.url))
        .json(&serde_json::json!({"token": "wrong"}))
        .send()
        .await
        .unwrap();
    assert_eq!(login.status(), 401);
    let start = std::time::Instant::now();
    let log = loop {
        let log = served.vak.log();
        if log.contains("run finished") && log.contains("failed login") {
            break log;
        }
        assert!(start.elapsed() < DEADLINE, "no run or login lines in:\n{log}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    let line = |what: &str| log.lines().find(|l| l.contains(what)).unwrap().to_string();
    assert!(line("run started").contains(&sid), "{log}");
    let finished = line("run finished");
    assert!(
        finished.contains(&sid) && finished.contains("outcome=\"completed\""),
        "{finished}"
    );
    assert!(finished.contains("duration_ms="), "{finished}");
    // The offline model counts a token per word: "hello log" in, "echo: hello log" out.
    assert!(
        finished.contains("input_tokens=2") && finished.contains("output_tokens=3"),
        "{finished}"
    );
    let failed = line("failed login");
    assert!(
        failed.contains("peer=127.0.0.1:") && !failed.contains("Some("),
        "{failed}"
    );
}
