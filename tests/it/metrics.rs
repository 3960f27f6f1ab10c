//! `GET /metrics`: scraped as Prometheus would and parsed with a third-party parser (the Python `prometheus_client`'s), its counters move as a run, a tool call, a retry and a lagging subscriber happen; the token guards it on the main port, and `--metrics-listen` serves it without one, on loopback only.
//!
//! The metrics are process-wide (one recorder per process), so the test that
//! checks what moved runs in a process of its own (`support::own_process`).
//! Needs VAK_MCP_PYTHON (`make mcp`: the venv with prometheus_client) and, for
//! the `--bus` test, VAK_NATS_SERVER (`make nats`).

use crate::support::fake_provider::{FakeProvider, Reply};
use crate::support::shared::own_process;
use crate::support::*;
use prost::Message;
use serde_json::Value;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use vak::core::PermissionMode;

/// Reads the exposition on stdin and prints its samples as JSON, through
/// `prometheus_client`'s own text parser (which rejects a malformed exposition).
const PARSE: &str = r#"
import json, sys
from prometheus_client.parser import text_string_to_metric_families
out = []
for fam in text_string_to_metric_families(sys.stdin.read()):
    for s in fam.samples:
        out.append({"family": fam.name, "type": fam.type, "name": s.name, "labels": s.labels, "value": s.value})
print(json.dumps(out))
"#;

/// The samples of one scrape, as the Python parser read them.
struct Samples(Vec<Value>);

impl Samples {
    /// The sum of the samples named `name` whose labels include `labels`.
    fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.0
            .iter()
            .filter(|s| s["name"] == name)
            .filter(|s| labels.iter().all(|(k, v)| s["labels"][*k] == *v))
            .map(|s| s["value"].as_f64().unwrap())
            .sum()
    }

    /// The type the exposition gives the family of `name`.
    fn type_of(&self, family: &str) -> Option<String> {
        self.0
            .iter()
            .find(|s| s["family"] == family)
            .map(|s| s["type"].as_str().unwrap().to_string())
    }

    fn label_values(&self, name: &str, label: &str) -> Vec<String> {
        let mut v: Vec<String> = self
            .0
            .iter()
            .filter(|s| s["name"] == name)
            .filter_map(|s| s["labels"][label].as_str().map(str::to_string))
            .collect();
        v.sort();
        v.dedup();
        v
    }
}

fn python() -> String {
    std::env::var("VAK_MCP_PYTHON").unwrap_or_else(|_| {
        panic!(
            "VAK_MCP_PYTHON is not set: `make mcp` installs prometheus_client (and the MCP SDK) into target/mcp-venv; \
             run with VAK_MCP_PYTHON=$PWD/target/mcp-venv/bin/python"
        )
    })
}

/// Parses an exposition with prometheus_client.
async fn parse(text: &str) -> Samples {
    let mut child = tokio::process::Command::new(python())
        .args(["-c", PARSE])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python runs");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(text.as_bytes()).await.unwrap();
    drop(stdin);
    let out = tokio::time::timeout(DEADLINE, child.wait_with_output())
        .await
        .expect("the parser ends within the deadline")
        .unwrap();
    assert!(
        out.status.success(),
        "prometheus_client could not parse the exposition: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    Samples(serde_json::from_slice(&out.stdout).expect("the parser prints JSON"))
}

/// GET `url` (with the test token when `token`): (status, content type, body).
async fn get(url: &str, token: bool) -> (u16, String, String) {
    let mut req = reqwest::Client::new().get(url);
    if token {
        req = req.bearer_auth(TOKEN);
    }
    let r = tokio::time::timeout(DEADLINE, req.send())
        .await
        .expect("an answer within the deadline")
        .unwrap();
    crate::support::response_text(r).await
}

async fn scrape(s: &TestServer) -> Samples {
    let (status, ct, body) = get(&format!("{}/metrics", s.url), true).await;
    assert_eq!(status, 200, "{body}");
    assert!(ct.starts_with("text/plain; version=0.0.4"), "{ct}");
    parse(&body).await
}

/// Runs `prompt` in a new session of `s` and waits for its run_finished.
async fn run_to_end(s: &TestServer, prompt: &str) -> (String, Vec<Frame>) {
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    let (status, body) = s.run(&sid, prompt).await;
    assert!(status < 300, "{status} {body}");
    let frames = sse.until("run_finished").await;
    (sid, frames)
}

/// Opens the session's event stream on a socket with a tiny receive
/// buffer and never reads it: the server's writes stall, and its queue fills.
async fn stalled_reader(s: &TestServer, sid: &str) -> tokio::net::TcpStream {
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    let mut tcp = sock.connect(s.addr).await.unwrap();
    let head = format!(
        "GET /sessions/{sid}/events HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {TOKEN}\r\nAccept: text/event-stream\r\n\r\n",
        s.addr
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    tcp
}

#[tokio::test]
async fn counters_move_with_a_run_a_tool_call_a_retry_and_a_lagging_subscriber() {
    if !own_process("metrics::counters_move_with_a_run_a_tool_call_a_retry_and_a_lagging_subscriber") {
        return;
    }
    // The offline model, with a tiny queue and budget per subscriber and a small ring.
    let s = TestServer::start_with(|c| {
        c.core.permission = PermissionMode::Allow;
        c.core.bus.ring = 8;
        c.core.bus.queue = 2;
        c.core.bus.max_queued_bytes = 16 * 1024;
    })
    .await;
    let before = scrape(&s).await;
    for (family, kind) in [
        ("vak_runs", "counter"),
        ("vak_connections_open", "gauge"),
        ("vak_subscribers", "gauge"),
    ] {
        // Described and registered once the first scrape came in.
        if let Some(t) = before.type_of(family) {
            assert_eq!(t, kind, "{family}");
        }
    }

    // A run with a tool call.
    let (_, frames) = run_to_end(&s, "/bash echo hi").await;
    assert_completed(&frames);
    // A lagging subscriber: a reader that never reads while a burst goes by.
    let sid = s.create_session().await;
    let stalled = stalled_reader(&s, &sid).await;
    let mut watching = s.events(&sid, None).await;
    let (status, body) = s.run(&sid, "/burst 2000 4096").await;
    assert!(status < 300, "{status} {body}");
    let frames = watching.until("run_finished").await;
    assert_completed(&frames);
    // A cursor older than the ring replays from the ledger on disk.
    let mut replay = s.events(&sid, Some(1)).await;
    replay.until("run_finished").await;
    // A cursor ahead of the session resyncs.
    let latest = frames.last().unwrap().seq();
    let mut ahead = s.events(&sid, Some(latest + 5)).await;
    assert_eq!(ahead.next().await.unwrap().event, "resync");
    // A wrong token.
    let (status, _, _) = get(&format!("{}/metrics", s.url), false).await;
    assert_eq!(status, 401);

    // An approval, denied (the default mode asks before a write).
    let asking = TestServer::start().await;
    let asked = asking.create_session().await;
    let mut sse = asking.events(&asked, None).await;
    asking.run(&asked, "/write a.txt A").await;
    let ask = sse.next_ask().await;
    let rid = ask["request_id"].as_str().unwrap();
    let (code, v) = asking
        .post(
            &format!("/sessions/{asked}/approvals/{rid}"),
            serde_json::json!({"approve": false}),
        )
        .await;
    assert_eq!((code, &v["outcome"]), (200, &serde_json::json!("denied")), "{v}");
    assert_completed(&sse.until("run_finished").await);

    // A retry: a fake OpenAI-compatible service answers 429 once, then the answer.
    let fake = FakeProvider::start().await;
    fake.script([
        Reply::status(
            429,
            r#"{"error":{"message":"slow down","type":"requests","code":"rate_limit_exceeded"}}"#,
        )
        .header("retry-after-ms", "1"),
        Reply::fixture("openai/text.sse"),
    ]);
    let routed = TestServer::start_with_route(fake.openai_route(), |c| {
        c.core.retry_backoff = Duration::from_millis(10);
    })
    .await;
    let (_, frames) = run_to_end(&routed, "hi").await;
    assert_completed(&frames);
    assert_eq!(fake.requests().len(), 2, "one refusal, one answer");

    // A stream of each other transport, open while the scrape is taken.
    let mut grpc = s.grpc().await;
    let (_grpc_stream, _) = grpc_subscribe(&mut grpc, &sid, None).await;
    let msg = vak::proto::v1::SubscribeRequest {
        session_id: sid.clone(),
        after: None,
    }
    .encode_to_vec();
    let mut framed = vec![0u8];
    framed.extend((msg.len() as u32).to_be_bytes());
    framed.extend(msg);
    let web = reqwest::Client::new()
        .post(format!("{}/vak.v1.AgentService/Subscribe", s.url))
        .header("content-type", "application/grpc-web+proto")
        .bearer_auth(TOKEN)
        .body(framed)
        .send()
        .await
        .unwrap();
    assert_eq!(web.status(), 200);

    let after = scrape(&s).await;
    let moved = |name: &str, labels: &[(&str, &str)]| after.sum(name, labels) - before.sum(name, labels);
    for transport in ["grpc", "grpc_web"] {
        assert_eq!(
            after.sum(
                "vak_streams_open",
                &[("transport", transport), ("surface", "session")]
            ),
            1.0,
            "{transport}"
        );
    }
    assert!(moved("vak_runs_total", &[("outcome", "completed")]) >= 3.0);
    assert!(moved("vak_run_duration_seconds_count", &[("outcome", "completed")]) >= 3.0);
    assert_eq!(
        moved("vak_tool_calls_total", &[("tool", "bash"), ("outcome", "ok")]),
        1.0
    );
    assert_eq!(
        moved(
            "vak_provider_retries_total",
            &[("provider", "openai"), ("reason", "rate_limit")]
        ),
        1.0
    );
    assert_eq!(
        moved("vak_provider_request_seconds_count", &[("provider", "openai")]),
        2.0,
        "both attempts are timed"
    );
    assert_eq!(
        moved(
            "vak_provider_request_seconds_count",
            &[("provider", "openai"), ("outcome", "error")]
        ),
        1.0
    );
    assert!(
        moved(
            "vak_tokens_total",
            &[
                ("provider", "openai"),
                ("model", "gpt-4.1"),
                ("direction", "input")
            ]
        ) > 0.0
    );
    assert!(
        moved(
            "vak_tokens_total",
            &[
                ("provider", "openai"),
                ("model", "gpt-4.1"),
                ("direction", "output")
            ]
        ) > 0.0
    );
    assert!(moved("vak_events_published_total", &[]) >= 2000.0);
    assert!(moved("vak_events_delivered_total", &[]) > 0.0);
    assert!(
        moved("vak_lags_total", &[]) >= 1.0,
        "the stalled reader's queue was dropped"
    );
    assert!(
        moved("vak_merges_total", &[]) >= 1.0,
        "deltas merged in the full queue"
    );
    assert!(moved("vak_replays_from_disk_total", &[]) >= 1.0);
    assert!(moved("vak_ledger_append_seconds_count", &[]) >= 1.0);
    assert!(moved("vak_ledger_append_bytes_total", &[]) >= 2000.0 * 4096.0);
    assert!(moved("vak_ledger_batch_records_count", &[]) >= 1.0);
    // The batch sizes add up to at least every event published.
    assert!(moved("vak_ledger_batch_records_sum", &[]) >= moved("vak_events_published_total", &[]));
    assert_eq!(moved("vak_resyncs_total", &[("reason", "cursor_ahead")]), 1.0);
    assert_eq!(moved("vak_approvals_total", &[("outcome", "denied")]), 1.0);
    assert_eq!(
        moved(
            "vak_tool_calls_total",
            &[("tool", "write_file"), ("outcome", "error")]
        ),
        1.0,
        "a denied call is an error result"
    );
    assert!(moved("vak_rejections_total", &[("cause", "auth")]) >= 1.0);
    assert!(moved("vak_connections_total", &[]) >= 1.0);
    assert!(after.sum("vak_connections_open", &[]) >= 1.0);
    // The open streams: the stalled reader, the replay and the watcher (SSE, one session each).
    assert!(
        after.sum(
            "vak_streams_open",
            &[("transport", "sse"), ("surface", "session")]
        ) >= 1.0
    );
    assert!(after.sum("vak_subscribers", &[]) >= 1.0);
    assert_eq!(
        after.type_of("vak_ledger_append_seconds").as_deref(),
        Some("histogram")
    );
    assert_eq!(after.type_of("vak_streams_open").as_deref(), Some("gauge"));
    assert_eq!(after.type_of("vak_runs").as_deref(), Some("counter"));
    // Labels are closed sets: no session id anywhere.
    let text = get(&format!("{}/metrics", s.url), true).await.2;
    assert!(!text.contains(&sid), "a session id in the exposition");
    assert_eq!(
        after.label_values("vak_tool_calls_total", "tool"),
        vec!["bash".to_string(), "write_file".to_string()]
    );
    drop(stalled);
    asking.stop().await;
    routed.stop().await;
    s.stop().await;
}

#[tokio::test]
async fn the_main_port_needs_the_token_for_metrics() {
    let s = TestServer::start().await;
    let (status, _, body) = get(&format!("{}/metrics", s.url), false).await;
    assert_eq!(status, 401, "{body}");
    let (_, frames) = run_to_end(&s, "hello").await;
    assert_completed(&frames);
    let (status, _, body) = get(&format!("{}/metrics", s.url), true).await;
    assert_eq!(status, 200);
    // What the process recorded so far parses (other tests' servers share it).
    let samples = parse(&body).await;
    assert!(
        samples.sum("vak_runs_total", &[("outcome", "completed")]) >= 1.0,
        "{body}"
    );
    s.stop().await;
}

#[tokio::test]
async fn metrics_listen_on_a_non_loopback_address_is_refused() {
    let out = Serve::new()
        .args(["--metrics-listen", "0.0.0.0:0"])
        .output()
        .await;
    assert!(!out.status.success(), "{:?}", out.status);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stdout.contains("listening on"), "{stdout}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("refusing to serve metrics on 0.0.0.0:0") && stderr.contains("loopback"),
        "{stderr}"
    );
}

#[tokio::test]
async fn metrics_listen_on_loopback_serves_metrics_without_a_token_and_nothing_else() {
    let mut served = Serve::new()
        .args(["--metrics-listen", "127.0.0.1:0"])
        .start()
        .await;
    let url = loop {
        let line = served.vak.next_line().await;
        if let Some(rest) = line.strip_prefix("vak: metrics ") {
            break rest.split_whitespace().next().unwrap().to_string();
        }
    };
    assert!(
        url.starts_with("http://127.0.0.1:") && url.ends_with("/metrics"),
        "{url}"
    );
    // The main port still asks for the token.
    let (status, _, _) = get(&format!("{}/metrics", served.url), false).await;
    assert_eq!(status, 401);
    let (status, ct, body) = get(&url, false).await;
    assert_eq!(status, 200, "{body}");
    assert!(ct.starts_with("text/plain; version=0.0.4"), "{ct}");
    let samples = parse(&body).await;
    assert!(
        samples.sum("vak_rejections_total", &[("cause", "auth")]) >= 1.0,
        "the refused scrape on the main port is counted: {body}"
    );
    // Only /metrics, and only for a loopback Host.
    let (status, _, _) = get(&url.replace("/metrics", "/sessions"), false).await;
    assert_eq!(status, 404);
    let rebound = reqwest::Client::new()
        .get(&url)
        .header("host", "evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(rebound.status().as_u16(), 403);
    drop(served);
}

/// With `--bus` the JetStream log's appends are timed, and the writer's
/// group commits (to the stream now) are counted as ledger appends too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_bus_jetstream_appends_are_timed() {
    if !own_process("metrics::with_a_bus_jetstream_appends_are_timed") {
        return;
    }
    use vak::core::cluster::jetstream::{self, StreamOptions};
    let nats = crate::support::nats::Cluster::single().await;
    let client = jetstream::connect(&nats.url(), &StreamOptions::default())
        .await
        .unwrap();
    let s = TestServer::start_with(move |c| c.core.nats = Some(client)).await;
    let before = scrape(&s).await;
    let (_, frames) = run_to_end(&s, "hello").await;
    assert_completed(&frames);
    let after = scrape(&s).await;
    let moved = |name: &str| after.sum(name, &[]) - before.sum(name, &[]);
    assert_eq!(
        after.type_of("vak_jetstream_append_seconds").as_deref(),
        Some("histogram")
    );
    assert!(moved("vak_jetstream_append_seconds_count") >= 1.0);
    // The writer's group commits go to the stream.
    assert!(moved("vak_ledger_append_seconds_count") >= 1.0);
    s.stop().await;
}
