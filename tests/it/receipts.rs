//! Per-call receipts (`GET /sessions/:id/receipts`): a run whose first model request got a 429 from a fake OpenAI-compatible service shows one model call with two attempts, the tool call with its exit status and size, then the second model call; never the key, the prompt only with `include=prompt`, and nothing of it on the session's stream or transcript.

use crate::support::fake_provider::{fixture, FakeProvider, Reply};
use crate::support::TestServer;
use serde_json::{json, Value};
use std::time::Duration;
use vak::core::PermissionMode;
use vak::proto::v1 as pb;

/// The key the route uses: it must appear in no answer.
const KEY: &str = "sk-receipts-4f9c2a7b1e8d3c6a5b0f";

/// The recorded tool call turned into `bash` running `echo hi; exit 3`.
fn bash_call() -> Reply {
    let text = fixture("openai/tool_call.sse")
        .replace(r#""name":"read_file""#, r#""name":"bash""#)
        .replace(r#""arguments":"path""#, r#""arguments":"command""#)
        .replace(r#""arguments":"notes""#, r#""arguments":"echo hi; exit""#)
        .replace(r#""arguments":".txt""#, r#""arguments":" 3""#);
    Reply::Sse {
        events: text.split_inclusive("\n\n").map(str::to_string).collect(),
        stall: false,
    }
}

fn model_call(r: &Value) -> &Value {
    r.get("model_call").unwrap_or_else(|| panic!("a model call: {r}"))
}

#[tokio::test]
async fn a_retried_model_call_shows_both_attempts_the_tool_call_and_never_the_key() {
    let fake = FakeProvider::start().await;
    let s = TestServer::start_with(|c| {
        c.core.retry_backoff = Duration::from_millis(10);
        c.core.provider_retries = 2;
        c.core.permission = PermissionMode::Allow;
    })
    .await;
    s.store_key("openai", KEY).await;
    let base = format!("{}/v1", fake.url);
    let (code, cfg) = s
        .send(
            reqwest::Method::PATCH,
            "/config",
            Some(json!({"provider": "openai", "model": "gpt-4.1", "base_url": base})),
        )
        .await;
    assert_eq!(code, 200, "{cfg}");
    let revision = cfg["revision"].as_str().unwrap().to_string();
    // The PATCH probed the base URL: chat requests come after it.
    let before = fake.requests().len();
    fake.script([
        Reply::status(
            429,
            r#"{"error":{"message":"slow down","type":"rate_limit_exceeded"}}"#,
        )
        .header("retry-after", "0"),
        bash_call(),
        Reply::fixture("openai/after_tool.sse"),
    ]);

    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    let (code, admitted) = s.run(&sid, "run the command").await;
    assert_eq!(code, 202, "{admitted}");
    let frames = sse.until("run_finished").await;
    assert_eq!(
        frames.last().unwrap().body()["outcome"],
        "completed",
        "{frames:?}"
    );
    let chats = fake.wait_requests(before + 3).await;
    assert!(
        chats[before..]
            .iter()
            .all(|r| r.header("authorization") == Some(&format!("Bearer {KEY}"))),
        "the key reached the service"
    );
    let retrying = frames
        .iter()
        .find_map(|f| f.body().get("retrying"))
        .unwrap_or_else(|| panic!("a retrying status: {frames:?}"))["reason"]
        .clone();
    let result = frames
        .iter()
        .find(|f| f.event == "tool_result")
        .expect("a tool_result");

    let (code, list) = s.get(&format!("/sessions/{sid}/receipts")).await;
    assert_eq!(code, 200, "{list}");
    assert!(!list.to_string().contains(KEY), "{list}");
    let receipts = list["receipts"].as_array().unwrap();
    assert_eq!(receipts.len(), 3, "model call, tool call, model call: {list:#}");
    for r in receipts {
        assert_eq!(r["request_id"], admitted["request_id"]);
        assert!(r["started_at"].as_str().is_some_and(|t| t.ends_with('Z')), "{r}");
    }

    let first = model_call(&receipts[0]);
    assert_eq!(first["provider"], "openai");
    assert_eq!(first["model"], "gpt-4.1");
    assert_eq!(first["route_revision"], revision.as_str());
    assert!(
        first["tools_offered"]
            .as_array()
            .unwrap()
            .contains(&json!("bash")),
        "{first}"
    );
    assert_eq!(first["outcome"], "ok");
    assert_eq!(
        first["usage"]["input_tokens"], 1190,
        "the successful attempt's tokens"
    );
    assert_eq!(first["usage"]["output_tokens"], 18);
    assert!(
        first.get("prompt").is_none(),
        "the prompt only when asked: {first}"
    );
    let attempts = first["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2, "{first:#}");
    assert_eq!(
        (
            &attempts[0]["number"],
            &attempts[0]["outcome"],
            &attempts[0]["http_status"]
        ),
        (&json!(1), &json!("failed"), &json!(429))
    );
    assert_eq!(attempts[0]["failure"], "rate_limit");
    assert_eq!(
        attempts[0]["retry_reason"], retrying,
        "as status.retrying said it"
    );
    assert!(attempts[0]["latency_ms"].as_u64().is_some());
    assert_eq!(
        (
            &attempts[1]["number"],
            &attempts[1]["outcome"],
            &attempts[1]["http_status"]
        ),
        (&json!(2), &json!("ok"), &json!(200))
    );
    assert!(attempts[1].get("failure").is_none() && attempts[1].get("retry_reason").is_none());

    let tool = &receipts[1]["tool_call"];
    assert_eq!(tool["call_id"], result.body()["call_id"]);
    assert_eq!(tool["tool"], "bash");
    assert_eq!(tool["exit_code"], 3);
    assert_eq!(tool["outcome"], "failed");
    let output = result.body()["output"].as_str().unwrap();
    assert!(output.starts_with("hi\n"), "{output}");
    assert_eq!(tool["output_bytes"], output.len());
    assert!(tool["duration_ms"].as_u64().is_some());
    assert!(
        receipts[1]["seq"].as_u64().unwrap() >= result.seq(),
        "recorded after its tool_result"
    );

    let second = model_call(&receipts[2]);
    assert_eq!(second["attempts"].as_array().unwrap().len(), 1);
    assert_eq!(second["outcome"], "ok");
    assert_eq!(second["usage"]["input_tokens"], 1310);
    assert_eq!(second["usage"]["cache_read_tokens"], 1152);

    // With include=prompt: each model call's request, still no key.
    let (code, full) = s.get(&format!("/sessions/{sid}/receipts?include=prompt")).await;
    assert_eq!(code, 200, "{full}");
    assert!(!full.to_string().contains(KEY));
    let prompt = |i: usize| -> Value {
        let text = full["receipts"][i]["model_call"]["prompt"]
            .as_str()
            .unwrap_or_else(|| panic!("{full}"));
        serde_json::from_str(text).unwrap()
    };
    let p0 = prompt(0);
    assert_eq!(p0["model"], "gpt-4.1");
    assert!(p0["system"].as_str().is_some_and(|s| !s.is_empty()));
    assert!(p0["tools"]
        .as_array()
        .unwrap()
        .iter()
        .any(|t| t["name"] == "bash"));
    assert_eq!(
        p0["messages"],
        json!([{"role": "user", "text": "run the command", "images": []}])
    );
    let p2 = prompt(2);
    let last = p2["messages"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["role"], "tool", "{p2:#}");
    assert_eq!(last["call_id"], tool["call_id"]);
    assert_eq!(p2["messages"][0], p0["messages"][0], "the whole history, rebuilt");
    assert_eq!((&p2["system"], &p2["tools"]), (&p0["system"], &p0["tools"]));
    assert!(full["receipts"][1]["tool_call"].get("prompt").is_none());

    // Over gRPC: the same receipts with typed outcomes.
    let mut client = s.grpc().await;
    let got = client
        .list_receipts(pb::ListReceiptsRequest {
            session_id: sid.clone(),
            include: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.receipts.len(), 3);
    match &got.receipts[0].kind {
        Some(pb::receipt::Kind::ModelCall(m)) => {
            assert_eq!(m.attempts[0].http_status, Some(429));
            assert_eq!(m.attempts[0].outcome, pb::ReceiptOutcome::Failed as i32);
            assert_eq!(m.outcome, pb::ReceiptOutcome::Ok as i32);
            assert_eq!(m.prompt, None);
        }
        other => panic!("{other:?}"),
    }

    // Nothing of it reaches a client stream or the transcript.
    for f in &frames {
        let text = f.data.to_string();
        assert!(
            !text.contains("route_revision") && !text.contains("attempts") && !text.contains("receipt"),
            "{text}"
        );
    }
    let mut replay = s.events(&sid, Some(0)).await;
    let replayed = replay.until("run_finished").await;
    assert_eq!(replayed.len(), frames.len(), "a replay is the same stream");
    let (code, transcript) = s.get(&format!("/sessions/{sid}/transcript")).await;
    assert_eq!(code, 200);
    let t = transcript.to_string();
    assert!(!t.contains("route_revision") && !t.contains("attempts"), "{t}");

    // Unknown session, bad include.
    let (code, v) = s.get("/sessions/nosuchsession/receipts").await;
    assert_eq!(code, 404, "{v}");
    let (code, v) = s
        .get(&format!("/sessions/{sid}/receipts?include=everything"))
        .await;
    assert_eq!(code, 400, "{v}");
    assert_eq!(v["error"]["reason"], "unknown_include", "{v}");

    // The ledger that holds the receipts (and their prompts) holds no key.
    let ledger = std::fs::read_to_string(s.home.join(format!("sessions/{sid}.jsonl"))).unwrap();
    assert!(ledger.contains("{\"receipt\":") && !ledger.contains(KEY));
    // Each model call stores only what changed since the one before: the
    // second neither the system prompt nor the first message again.
    let stored: Vec<Value> = ledger
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|v| {
            v["receipt"]["call"]["model_call"]["prompt"]
                .as_object()
                .cloned()
                .map(Value::Object)
        })
        .collect();
    assert_eq!(stored.len(), 2, "{ledger}");
    assert_eq!(stored[0]["base"], 0);
    assert!(stored[0]["system"].is_string());
    assert!(stored[1]["base"].as_u64().unwrap() >= 1, "{:#}", stored[1]);
    assert!(stored[1].get("system").is_none() && stored[1].get("tools").is_none());
    assert!(!stored[1].to_string().contains("run the command"));

    // A restart loads the session with its receipts in the ledger: the same
    // transcript, the same receipts.
    let (home, ws) = s.stop().await.unwrap();
    let s = TestServer::start_in(home.path(), ws.path(), |_| {}).await;
    let (code, again) = s.get(&format!("/sessions/{sid}/transcript")).await;
    assert_eq!(code, 200);
    assert_eq!(again["messages"], transcript["messages"]);
    let (_, relisted) = s.get(&format!("/sessions/{sid}/receipts")).await;
    assert_eq!(relisted, list);
    let (_, relisted) = s.get(&format!("/sessions/{sid}/receipts?include=prompt")).await;
    assert_eq!(relisted, full, "the prompts rebuild the same after a restart");
}
