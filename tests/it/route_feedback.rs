//! Model route feedback: `PATCH /config` (and gRPC UpdateConfig) probes a new base URL and warns when nothing answers there, a run retrying the model service shows `status.retrying` to SSE and gRPC clients, its failure names the host, and a keyless local route is configured for `/providers` and lists its models.

use crate::support::fake_provider::{FakeProvider, Reply};
use crate::support::term::{attached, idle};
use crate::support::{finished, grpc_subscribe, kind_of, Pty, TestServer};
use serde_json::{json, Value};
use std::time::Duration;
use vak::proto::v1 as pb;

/// The retries of the servers these tests start.
const RETRIES: u32 = 2;

async fn server() -> TestServer {
    TestServer::start_with(|c| {
        c.core.retry_backoff = Duration::from_millis(10);
        c.core.provider_retries = RETRIES;
    })
    .await
}

/// A loopback address nothing listens at: a port bound, then released.
pub(crate) async fn dead_addr() -> std::net::SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    addr
}

async fn patch(s: &TestServer, body: Value) -> (u16, Value) {
    s.send(reqwest::Method::PATCH, "/config", Some(body)).await
}

#[tokio::test]
async fn a_dead_base_url_is_applied_with_a_warning_and_a_run_shows_its_retries_then_names_the_host() {
    let s = server().await;
    let addr = dead_addr().await;
    let base = format!("http://{addr}/v1");
    let started = std::time::Instant::now();
    let (code, cfg) = patch(
        &s,
        json!({"provider": "openai", "model": "llama-3", "base_url": base}),
    )
    .await;
    assert_eq!(code, 200, "{cfg}");
    assert_eq!(
        cfg["warnings"],
        json!([format!("{base} not reachable: connection refused")]),
        "{cfg}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "a refusal is known at once"
    );
    // Applied all the same: a server may start there later.
    assert_eq!(cfg["route"]["base_url"], base.as_str());
    let (_, now) = s.get("/config").await;
    assert_eq!(now["route"]["base_url"], base.as_str());
    assert_eq!(now["revision"], cfg["revision"]);
    assert!(
        now.get("warnings").is_none_or(|w| w == &json!([])),
        "warnings belong to the change's answer only: {now}"
    );

    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    let mut c = s.grpc().await;
    let (mut grpc, _) = grpc_subscribe(&mut c, &sid, None).await;
    let (code, body) = s.run(&sid, "hi").await;
    assert_eq!(code, 202, "{body}");

    let host = addr.to_string();
    let reason = format!("could not reach the model service at {host} (connection refused)");
    let frames = sse.until("run_finished").await;
    let retrying: Vec<&Value> = frames
        .iter()
        .filter(|f| f.event == "status" && f.body().get("retrying").is_some())
        .map(|f| f.body())
        .collect();
    assert_eq!(
        retrying,
        (1..=RETRIES)
            .map(|a| json!({"busy": true, "retrying": {"attempt": a, "of": RETRIES, "reason": reason}}))
            .collect::<Vec<_>>()
            .iter()
            .collect::<Vec<_>>(),
        "one status per retry, before its wait"
    );
    let fin = finished(&frames);
    assert_eq!(fin["outcome"], "failed");
    assert_eq!(
        fin["message"],
        format!("could not reach the model service at {host}").as_str()
    );
    assert!(!fin.to_string().contains("/v1"), "no path in the message: {fin}");
    // Numbered like every event: the retry statuses sit between the run's
    // start and its end.
    let seqs: Vec<u64> = frames.iter().map(|f| f.seq()).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");

    let events = grpc.until("run_finished").await;
    let grpc_retrying: Vec<pb::Retrying> = events
        .iter()
        .filter_map(|e| match &e.kind {
            Some(pb::event::Kind::Status(st)) => st.retrying.clone().map(|r| (st.busy, r)),
            _ => None,
        })
        .map(|(busy, r)| {
            assert!(busy, "a retrying status is busy");
            r
        })
        .collect();
    assert_eq!(
        grpc_retrying,
        (1..=RETRIES)
            .map(|attempt| pb::Retrying {
                attempt,
                of: RETRIES,
                reason: reason.clone(),
            })
            .collect::<Vec<_>>()
    );
    match &events.last().unwrap().kind {
        Some(pb::event::Kind::RunFinished(r)) => {
            assert_eq!(r.message, format!("could not reach the model service at {host}"))
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(kind_of(events.last().unwrap()), "run_finished");

    // Its models listing says where it looked too.
    let (code, v) = s.get("/providers/openai/models").await;
    assert_eq!(
        (code, v["error"]["reason"].as_str()),
        (502, Some("network")),
        "{v}"
    );
    assert_eq!(
        v["error"]["message"],
        format!("could not reach the model service at {host}").as_str()
    );

    // The presentation timeline shows no item for a retry status.
    let (_, t) = s.get(&format!("/sessions/{sid}/presentation")).await;
    assert!(
        !t.to_string().contains("rate limiting") && !t.to_string().contains("connection refused"),
        "{t}"
    );
}

#[tokio::test]
async fn grpc_update_config_warns_about_a_dead_base_url_too() {
    let s = server().await;
    let addr = dead_addr().await;
    let mut c = s.grpc().await;
    let cfg = c
        .update_config(pb::UpdateConfigRequest {
            provider: Some("anthropic".into()),
            model: Some("claude-x".into()),
            base_url: Some(format!("http://{addr}")),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        cfg.warnings,
        [format!("http://{addr} not reachable: connection refused")]
    );
    assert_eq!(
        cfg.route.unwrap().base_url.as_deref(),
        Some(format!("http://{addr}").as_str())
    );
    // A change naming no base URL probes nothing.
    let cfg = c
        .update_config(pb::UpdateConfigRequest {
            model: Some("claude-y".into()),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(cfg.warnings.is_empty(), "{:?}", cfg.warnings);
}

#[tokio::test]
async fn a_live_base_url_gets_no_warning_even_when_it_answers_401() {
    let s = server().await;
    let fake = FakeProvider::start().await;
    fake.script([Reply::status(401, r#"{"error":{"message":"no key"}}"#)]);
    let (code, cfg) = patch(
        &s,
        json!({"provider": "openai", "model": "llama-3", "base_url": format!("{}/v1", fake.url)}),
    )
    .await;
    assert_eq!(code, 200, "{cfg}");
    assert!(
        cfg.get("warnings").is_none_or(|w| w == &json!([])),
        "an HTTP answer is reachable: {cfg}"
    );
    let probe = &fake.requests()[0];
    assert_eq!(
        (probe.method.as_str(), probe.path.as_str()),
        ("GET", "/v1/models")
    );
    assert_eq!(probe.header("authorization"), None, "keyless: no key sent");

    // An Anthropic base: its models listing, answered with a redirect
    // (not followed, still an answer).
    fake.script([Reply::status(307, "").header("location", "http://127.0.0.1:9/elsewhere")]);
    let (code, cfg) = patch(
        &s,
        json!({"provider": "anthropic", "model": "claude-x", "base_url": fake.url}),
    )
    .await;
    assert_eq!(code, 200, "{cfg}");
    assert!(cfg.get("warnings").is_none_or(|w| w == &json!([])), "{cfg}");
    let reqs = fake.requests();
    assert_eq!(reqs.len(), 2, "the redirect was not followed: {reqs:?}");
    assert_eq!(reqs[1].path, "/v1/models");
}

#[tokio::test]
async fn a_keyless_local_route_is_configured_and_lists_its_models() {
    let s = server().await;
    let fake = FakeProvider::start().await;
    let (_, before) = s.get("/providers").await;
    let configured = |v: &Value, name: &str| {
        v["providers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name || p["provider"] == name)
            .map(|p| p["configured"] == true)
            .unwrap_or_else(|| panic!("{name} in {v}"))
    };
    assert!(!configured(&before, "openai"), "no key, no route: {before}");
    let (code, v) = s.get("/providers/openai/models").await;
    assert_eq!(
        (code, v["error"]["kind"].as_str()),
        (400, Some("no_ai_service")),
        "no key and no base URL: {v}"
    );

    fake.script([Reply::status(200, r#"{"object":"list","data":[]}"#)]);
    let (code, cfg) = patch(
        &s,
        json!({"provider": "openai", "model": "llama-3", "base_url": format!("{}/v1", fake.url)}),
    )
    .await;
    assert_eq!(code, 200, "{cfg}");
    let (_, after) = s.get("/providers").await;
    assert!(configured(&after, "openai"), "a keyless local route: {after}");
    assert!(!configured(&after, "anthropic"), "{after}");

    fake.script([Reply::status(
        200,
        r#"{"object":"list","data":[{"id":"llama-3","object":"model"},{"id":"qwen-2.5","object":"model"}]}"#,
    )]);
    let (code, models) = s.get("/providers/openai/models").await;
    assert_eq!(code, 200, "{models}");
    let ids: Vec<&str> = models["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["llama-3", "qwen-2.5"]);
    let listing = fake.requests().pop().unwrap();
    assert_eq!(listing.path, "/v1/models", "the route's base URL");
    assert_eq!(listing.header("authorization"), None);
}

#[tokio::test]
async fn a_silent_base_url_warns_that_it_timed_out_and_each_retry_says_so() {
    // Accepts connections and never answers.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = silent.local_addr().unwrap();
    let held = tokio::spawn(async move {
        let mut conns = Vec::new();
        while let Ok((c, _)) = silent.accept().await {
            conns.push(c);
        }
    });
    let s = TestServer::start_with(|c| {
        c.core.provider_client.response_timeout = Duration::from_millis(200);
        c.core.retry_backoff = Duration::from_millis(10);
        c.core.provider_retries = 1;
    })
    .await;
    let base = format!("http://{addr}/v1");
    let started = std::time::Instant::now();
    let (code, cfg) = patch(&s, json!({"provider": "openai", "model": "m", "base_url": base})).await;
    assert_eq!(code, 200, "{cfg}");
    assert_eq!(
        cfg["warnings"],
        json!([format!("{base} not reachable: timed out")])
    );
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(2900) && waited < Duration::from_secs(10),
        "the probe waits 3 s: {waited:?}"
    );

    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    s.run(&sid, "hi").await;
    let frames = sse.until("run_finished").await;
    let message = format!("could not reach the model service at {addr}");
    let reasons: Vec<&Value> = frames
        .iter()
        .filter_map(|f| f.body().get("retrying"))
        .map(|r| &r["reason"])
        .collect();
    assert_eq!(reasons, [&json!(format!("{message} (timed out)"))]);
    assert_eq!(finished(&frames)["message"], message.as_str());
    held.abort();
}

#[tokio::test]
async fn interactive_vak_term_shows_each_retry_as_one_dim_line() {
    let server = TestServer::start().await;
    for t in ["sse", "grpc"] {
        let sid = server.create_session().await;
        let mut pty = Pty::spawn(attached(&server, t, &sid), 30, 120);
        idle(&pty).await;
        // The offline model's /fail is retried (4 times by default), soon.
        pty.send("/fail x\r");
        let screen = pty.wait_for("retrying 4/4: the model failed: x").await;
        for a in 1..=4 {
            let line = format!("retrying {a}/4: the model failed: x");
            assert_eq!(
                screen.lines().filter(|l| l.contains(&line)).count(),
                1,
                "{t}: one line per retry:\n{screen}"
            );
            assert_eq!(pty.is_dim(&line), Some(true), "{t}: {line} is dim");
        }
        idle(&pty).await;
        pty.send("\x04");
        assert_eq!(pty.wait_exit().await, 0, "{t}");
    }
}

#[tokio::test]
async fn a_keyless_local_route_from_the_flags_is_configured_and_lists_its_models_too() {
    let fake = FakeProvider::start().await;
    let base = format!("{}/v1", fake.url);
    let s = TestServer::start_with(|c| {
        c.core.route_flags = vak::core::host::config::RouteLayer {
            provider: Some(vak::core::provider::ProviderKind::OpenAi),
            model: Some("llama-3".into()),
            base_url: Some(base.clone()),
        };
    })
    .await;
    let (_, cfg) = s.get("/config").await;
    assert_eq!(
        (&cfg["route"]["source"], &cfg["route"]["base_url"]),
        (&json!("flag"), &json!(base))
    );
    let (_, providers) = s.get("/providers").await;
    let openai = providers["providers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "openai")
        .unwrap();
    assert_eq!(openai["configured"], true, "{providers}");
    fake.script([Reply::status(
        200,
        r#"{"object":"list","data":[{"id":"llama-3"}]}"#,
    )]);
    let (code, models) = s.get("/providers/openai/models").await;
    assert_eq!(
        (code, &models["models"][0]["id"]),
        (200, &json!("llama-3")),
        "{models}"
    );
}
