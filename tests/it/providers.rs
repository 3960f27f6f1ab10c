//! The OpenAI-compatible and Anthropic providers against a fake model service that serves recorded streams: what a user sees on the event stream, and what vak sends back to the model (tool results with the provider's ids, signed thinking), through retries, refusals, mid-stream failures and stalls.

use crate::support::fake_provider::{FakeProvider, Recorded, Reply};
use crate::support::{all_text, assert_completed, finished, text_of, Frame, HoldProxy, TestServer, DEADLINE};
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use vak::core::provider::http::ClientOptions;
use vak::core::provider::{
    connect_with, Endpoint, FailureKind, Provider, ProviderError, ProviderEvent, ProviderKind, Secret,
    StopReason, TokenUsage, TurnRequest,
};
use vak::core::session::live::Route;
use vak::core::PermissionMode;
use vak::proto::v1 as pb;

/// A key that must never reach a client.
const KEY: &str = "sk-test-7fQ2mZ9xK4pL1vR8wT3y";

fn options() -> ClientOptions {
    ClientOptions {
        connect_timeout: Duration::from_secs(5),
        response_timeout: Duration::from_secs(10),
        // Short, so the stall tests are quick; the recorded streams arrive in microseconds.
        idle_timeout: Duration::from_millis(500),
        ..ClientOptions::default()
    }
}

fn provider(kind: ProviderKind, base: &str, key: Option<&str>) -> Arc<dyn Provider> {
    let endpoint = Endpoint {
        kind,
        base_url: Some(base.to_string()),
        key: key.map(|k| Secret::new(k.to_string())),
    };
    connect_with(&endpoint, &options()).unwrap_or_else(|f| panic!("connect: {f:?}"))
}

fn openai(fake: &FakeProvider) -> Arc<dyn Provider> {
    // SDK convention: the base includes /v1.
    provider(ProviderKind::OpenAi, &format!("{}/v1/", fake.url), Some(KEY))
}

fn anthropic(fake: &FakeProvider) -> Arc<dyn Provider> {
    provider(ProviderKind::Anthropic, &fake.url, Some(KEY))
}

/// The internal retries of the servers these tests start: a turn that keeps
/// failing is attempted 1 + RETRIES times.
const RETRIES: u32 = 3;

/// vak in-process, routed to `provider`; tools run without approval and
/// retries wait 10 ms instead of 0.5 s.
async fn vak(provider: Arc<dyn Provider>, model: &str) -> TestServer {
    let route = Route {
        provider,
        model: model.to_string(),
        context_window: None,
    };
    TestServer::start_with_route(route, |c| {
        c.core.permission = PermissionMode::Allow;
        c.core.retry_backoff = Duration::from_millis(10);
        c.core.provider_retries = RETRIES;
    })
    .await
}

/// Runs `prompt` in a fresh session; returns the session id and the frames up to run_finished.
async fn run(s: &TestServer, prompt: &str) -> (String, Vec<Frame>) {
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    let (code, body) = s.run(&sid, prompt).await;
    assert!(code < 300, "run accepted: {code} {body}");
    let frames = sse.until("run_finished").await;
    (sid, frames)
}

fn of_kind<'a>(frames: &'a [Frame], kind: &str) -> Vec<&'a Value> {
    frames
        .iter()
        .filter(|f| f.event == kind)
        .map(|f| f.body())
        .collect()
}

// ---- OpenAI-compatible --------------------------------------------------------

#[tokio::test]
async fn openai_streams_text_and_sends_a_well_formed_request() {
    let fake = FakeProvider::start().await;
    fake.script([Reply::fixture("openai/text.sse")]);
    let s = vak(openai(&fake), "gpt-4.1").await;
    let (_, frames) = run(&s, "say hello").await;
    assert_completed(&frames);
    assert_eq!(text_of(&frames), "Hello! How can I help you today?");

    let reqs = fake.requests();
    assert_eq!(reqs.len(), 1);
    let r = &reqs[0];
    assert_eq!(
        (r.method.as_str(), r.path.as_str()),
        ("POST", "/v1/chat/completions")
    );
    assert_eq!(r.header("authorization"), Some(format!("Bearer {KEY}").as_str()));
    let b = &r.body;
    assert_eq!(b["model"], "gpt-4.1");
    assert_eq!(b["stream"], true);
    assert_eq!(b["stream_options"], json!({"include_usage": true}));
    // A local base URL gets the classic field (see openai::LimitField).
    assert!(b["max_tokens"].as_u64().unwrap() > 0, "{b}");
    let msgs = b["messages"].as_array().unwrap();
    assert_eq!(msgs[0]["role"], "system");
    assert!(!msgs[0]["content"].as_str().unwrap().is_empty());
    assert_eq!(
        msgs.last().unwrap(),
        &json!({"role": "user", "content": "say hello"})
    );
    let tools = b["tools"].as_array().unwrap();
    let names: Vec<&str> = tools
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"read_file"), "{names:?}");
    assert!(tools
        .iter()
        .all(|t| t["type"] == "function" && t["function"]["parameters"].is_object()));
}

#[tokio::test]
async fn openai_tool_call_result_goes_back_with_the_providers_call_id() {
    let fake = FakeProvider::start().await;
    fake.script([
        Reply::fixture("openai/tool_call.sse"),
        Reply::fixture("openai/after_tool.sse"),
    ]);
    let s = vak(openai(&fake), "gpt-4.1").await;
    std::fs::write(s.workspace.join("notes.txt"), "buy milk\n").unwrap();
    let (_, frames) = run(&s, "what do my notes say?").await;
    assert_completed(&frames);

    let calls = of_kind(&frames, "tool_call");
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0]["call_id"], "call_9pXc2Lr0sYtZ3bQ1mKfA8hJd");
    assert_eq!(calls[0]["tool"], "read_file");
    assert_eq!(calls[0]["input"], json!({"path": "notes.txt"}));
    let results = of_kind(&frames, "tool_result");
    assert_eq!(results[0]["call_id"], "call_9pXc2Lr0sYtZ3bQ1mKfA8hJd");
    assert_eq!(results[0]["ok"], true);
    assert!(results[0]["output"].as_str().unwrap().contains("buy milk"));
    assert_eq!(text_of(&frames), "The notes say: buy milk.");

    let reqs = fake.wait_requests(2).await;
    let msgs = reqs[1].body["messages"].as_array().unwrap().clone();
    let n = msgs.len();
    let (assistant, tool) = (&msgs[n - 2], &msgs[n - 1]);
    assert_eq!(assistant["role"], "assistant");
    let call = &assistant["tool_calls"][0];
    assert_eq!(call["id"], "call_9pXc2Lr0sYtZ3bQ1mKfA8hJd");
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "read_file");
    let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"path": "notes.txt"}));
    assert_eq!(tool["role"], "tool");
    assert_eq!(tool["tool_call_id"], "call_9pXc2Lr0sYtZ3bQ1mKfA8hJd");
    assert!(tool["content"].as_str().unwrap().contains("buy milk"));
}

#[tokio::test]
async fn openai_parallel_tool_calls_interleaved_by_index_both_run_and_return() {
    let fake = FakeProvider::start().await;
    fake.script([
        Reply::fixture("openai/parallel_tool_calls.sse"),
        Reply::fixture("openai/after_two_tools.sse"),
    ]);
    let s = vak(openai(&fake), "gpt-4.1").await;
    std::fs::write(s.workspace.join("a.txt"), "alpha").unwrap();
    std::fs::write(s.workspace.join("b.txt"), "beta").unwrap();
    let (_, frames) = run(&s, "read a and b").await;
    assert_completed(&frames);
    let calls: Vec<(Value, Value)> = of_kind(&frames, "tool_call")
        .iter()
        .map(|c| (c["call_id"].clone(), c["input"].clone()))
        .collect();
    assert_eq!(
        calls,
        vec![
            (json!("call_Ab3dE5fG7hJ9kL1mN3pQ5rSt"), json!({"path": "a.txt"})),
            (json!("call_Uv7wX9yZ1aB3cD5eF7gH9iJk"), json!({"path": "b.txt"})),
        ]
    );
    let reqs = fake.wait_requests(2).await;
    let msgs = reqs[1].body["messages"].as_array().unwrap();
    let n = msgs.len();
    let ids: Vec<&Value> = msgs[n - 3]["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| &c["id"])
        .collect();
    assert_eq!(
        ids,
        vec!["call_Ab3dE5fG7hJ9kL1mN3pQ5rSt", "call_Uv7wX9yZ1aB3cD5eF7gH9iJk"]
    );
    assert_eq!(msgs[n - 2]["tool_call_id"], "call_Ab3dE5fG7hJ9kL1mN3pQ5rSt");
    assert!(msgs[n - 2]["content"].as_str().unwrap().contains("alpha"));
    assert_eq!(msgs[n - 1]["tool_call_id"], "call_Uv7wX9yZ1aB3cD5eF7gH9iJk");
    assert!(msgs[n - 1]["content"].as_str().unwrap().contains("beta"));
}

#[tokio::test]
async fn openai_429_with_retry_after_is_retried_after_the_asked_wait() {
    let fake = FakeProvider::start().await;
    let body = r#"{"error":{"message":"Rate limit reached for gpt-4.1 in organization org-abc on tokens per min (TPM): Limit 30000, Used 30000, Requested 1200.","type":"tokens","param":null,"code":"rate_limit_exceeded"}}"#;
    fake.script([
        Reply::status(429, body)
            .header("retry-after", "30")
            .header("retry-after-ms", "300"),
        Reply::fixture("openai/text.sse"),
    ]);
    let s = vak(openai(&fake), "gpt-4.1").await;
    let (_, frames) = run(&s, "hi").await;
    assert_completed(&frames);
    assert_eq!(text_of(&frames), "Hello! How can I help you today?");
    let reqs = fake.requests();
    assert_eq!(reqs.len(), 2, "one refusal, one success");
    let waited = reqs[1].at - reqs[0].at;
    // retry-after-ms (300 ms) wins over retry-after (30 s) and over the 10 ms backoff.
    assert!(waited >= Duration::from_millis(300), "waited {waited:?}");
    assert!(waited < Duration::from_secs(10), "waited {waited:?}");
    assert!(!all_text(&frames).contains("Rate limit reached"));
}

#[tokio::test]
async fn openai_401_fails_at_once_without_leaking_the_key_or_the_body() {
    let fake = FakeProvider::start().await;
    let body = format!(
        r#"{{"error":{{"message":"Incorrect API key provided: {KEY}. You can find your API key at https://platform.openai.com/account/api-keys.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}}}"#
    );
    fake.script([Reply::status(401, &body), Reply::fixture("openai/text.sse")]);
    let s = vak(openai(&fake), "gpt-4.1").await;
    let (sid, frames) = run(&s, "hi").await;
    let fin = finished(&frames);
    assert_eq!(fin["outcome"], "failed");
    assert_eq!(fin["message"], "the model service refused the API key");
    assert_eq!(fake.requests().len(), 1, "an auth failure is not retried");
    let seen = all_text(&frames);
    assert!(!seen.contains(KEY), "the key reached a client: {seen}");
    assert!(
        !seen.contains("Incorrect API key"),
        "the raw body reached a client: {seen}"
    );
    let (_, transcript) = s.get(&format!("/sessions/{sid}/transcript")).await;
    assert!(!transcript.to_string().contains(KEY));
    // Nor does it reach the session's ledger on disk.
    let home = s.home.clone();
    let dirs = s.stop().await;
    let ledger = std::fs::read_to_string(home.join("sessions").join(format!("{sid}.jsonl"))).unwrap();
    assert!(
        ledger.contains("the model service refused the API key"),
        "{ledger}"
    );
    assert!(!ledger.contains(KEY), "the key reached the ledger: {ledger}");
    drop(dirs);
}

const CONTEXT_TOO_LONG: &str = r#"{"error":{"message":"This model's maximum context length is 128000 tokens. However, your messages resulted in 130412 tokens. Please reduce the length of the messages.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#;

#[tokio::test]
async fn openai_400_context_too_long_compacts_the_history_once_and_goes_on() {
    let fake = FakeProvider::start().await;
    // Too long; the summary (text.sse's text); the turn again, which fits now.
    fake.script([
        Reply::status(400, CONTEXT_TOO_LONG),
        Reply::fixture("openai/text.sse"),
        Reply::fixture("openai/text.sse"),
    ]);
    let s = vak(openai(&fake), "gpt-4.1").await;
    let (_, frames) = run(&s, "a very long prompt").await;
    assert_eq!(finished(&frames)["outcome"], "completed");
    // The summary was not streamed: clients see the answer once.
    assert_eq!(text_of(&frames), "Hello! How can I help you today?");
    let reqs = fake.requests();
    assert_eq!(reqs.len(), 3, "turn, compaction, turn");
    let last_user = |r: &Value| {
        r["messages"]
            .as_array()
            .unwrap()
            .iter()
            .rev()
            .find(|m| m["role"] == "user")
            .map(|m| m["content"].to_string())
            .unwrap_or_default()
    };
    assert!(
        last_user(&reqs[1].body).contains("exceed your context window"),
        "{}",
        reqs[1].raw
    );
    let after = reqs[2].body["messages"].as_array().unwrap();
    let roles: Vec<&str> = after.iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(
        roles,
        ["system", "user"],
        "the summary stands for the history: {}",
        reqs[2].raw
    );
    assert!(last_user(&reqs[2].body).contains("Hello! How can I help you today?"));

    // When even the compaction does not fit, the run fails with the fixed message.
    fake.script([
        Reply::status(400, CONTEXT_TOO_LONG),
        Reply::status(400, CONTEXT_TOO_LONG),
    ]);
    let (_, frames) = run(&s, "another very long prompt").await;
    let fin = finished(&frames);
    assert_eq!(fin["outcome"], "failed");
    assert_eq!(fin["message"], FailureKind::ContextTooLong.message());
    assert_eq!(fake.requests().len(), 5, "no retry past the failed compaction");
}

#[tokio::test]
async fn openai_error_mid_stream_after_text_restarts_the_turn_and_keeps_one_answer() {
    let fake = FakeProvider::start().await;
    fake.script([
        Reply::fixture("openai/midstream_error.sse"),
        Reply::fixture("openai/text.sse"),
    ]);
    let s = vak(openai(&fake), "gpt-4.1").await;
    let (sid, frames) = run(&s, "hi").await;
    assert_completed(&frames);
    assert_eq!(
        of_kind(&frames, "turn_started").len(),
        2,
        "the retry is a second turn_started"
    );
    assert_eq!(fake.requests().len(), 2);
    assert!(!all_text(&frames).contains("The server had an error"));
    // The model never sees its broken answer.
    let second = &fake.requests()[1].body;
    assert_eq!(
        second["messages"].as_array().unwrap().last().unwrap()["role"],
        "user"
    );
    let (_, transcript) = s.get(&format!("/sessions/{sid}/transcript")).await;
    let answers: Vec<&Value> = transcript["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["text"] == "Hello! How can I help you today?")
        .collect();
    assert_eq!(answers.len(), 1, "{transcript}");
}

#[tokio::test]
async fn openai_stalled_stream_times_out_and_is_retried() {
    let fake = FakeProvider::start().await;
    fake.script([
        Reply::stalling("openai/stalls.sse"),
        Reply::fixture("openai/text.sse"),
    ]);
    let s = vak(openai(&fake), "gpt-4.1").await;
    let (_, frames) = run(&s, "hi").await;
    assert_completed(&frames);
    assert_eq!(fake.requests().len(), 2);
    assert_eq!(of_kind(&frames, "turn_started").len(), 2);
}

/// A sink that keeps what it is sent.
fn collector() -> (
    Arc<Mutex<Vec<ProviderEvent>>>,
    impl Fn(ProviderEvent) + Send + Sync,
) {
    let got = Arc::new(Mutex::new(Vec::new()));
    let g = got.clone();
    (got, move |e| g.lock().unwrap().push(e))
}

fn request(model: &str, prompt: &str) -> TurnRequest {
    TurnRequest {
        model: model.into(),
        system: "sys".into(),
        messages: vec![vak::core::provider::ChatMessage::User {
            text: prompt.into(),
            images: Vec::new(),
        }],
        tools: vec![],
        max_tokens: 1024,
        temperature: Some(0.2),
    }
}

#[tokio::test]
async fn openai_turn_reports_usage_ollama_whole_calls_keyless_and_models() {
    let fake = FakeProvider::start().await;
    let p = openai(&fake);
    fake.script([Reply::fixture("openai/text.sse")]);
    let (_, sink) = collector();
    let cancel = CancellationToken::new();
    let out = p.turn(&request("gpt-4.1", "hi"), &sink, &cancel).await.unwrap();
    assert_eq!(out.stop, StopReason::EndTurn);
    assert_eq!(
        out.usage,
        TokenUsage {
            input_tokens: 1220,
            output_tokens: 10,
            cache_read_tokens: 1024,
            cache_write_tokens: 0
        }
    );
    assert_eq!(
        fake.requests()[0].body["temperature"]
            .as_f64()
            .map(|t| (t * 10.0).round()),
        Some(2.0)
    );

    // Ollama, keyless: reasoning, one whole tool call, finish_reason "stop".
    let local = provider(ProviderKind::OpenAi, &format!("{}/v1", fake.url), None);
    fake.script([Reply::fixture("openai/ollama_tool_call.sse")]);
    let (got, sink) = collector();
    let out = local
        .turn(&request("qwen3:8b", "notes?"), &sink, &cancel)
        .await
        .unwrap();
    assert_eq!(out.stop, StopReason::ToolUse);
    assert_eq!(out.tool_calls.len(), 1);
    assert_eq!(out.tool_calls[0].id, "call_x7k2m9p4");
    assert_eq!(out.tool_calls[0].input, json!({"path": "notes.txt"}));
    assert_eq!(
        got.lock().unwrap().clone(),
        vec![ProviderEvent::Thinking("The user wants the notes.".into())]
    );
    let r: Recorded = fake.requests()[1].clone();
    assert_eq!(r.header("authorization"), None, "keyless sends no Authorization");

    fake.script([Reply::status(
        200,
        r#"{"object":"list","data":[{"id":"gpt-4.1","object":"model","created":1744316542,"owned_by":"system"},{"id":"o3","object":"model","created":1744225308,"owned_by":"system"}]}"#,
    )]);
    let models = p.list_models().await.unwrap();
    let ids: Vec<&str> = models.iter().map(|m| m.id.as_str()).collect();
    assert_eq!(ids, vec!["gpt-4.1", "o3"]);
    assert_eq!(fake.requests()[2].path, "/v1/models");
    fake.script([Reply::status(401, r#"{"error":{"message":"bad key"}}"#)]);
    let f = p.list_models().await.unwrap_err();
    assert_eq!((f.kind, f.retryable), (FailureKind::Auth, false));

    // A server that answers 200 with a JSON error instead of a stream.
    fake.script([Reply::status(
        200,
        r#"{"error":{"message":"model 'llama9' not found","type":"invalid_request_error","code":"model_not_found"}}"#,
    )]);
    match p.turn(&request("llama9", "hi"), &sink, &cancel).await {
        Err(ProviderError::Failed(f)) => assert_eq!((f.kind, f.retryable), (FailureKind::BadResponse, false)),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_turn_is_cancelled_promptly_while_the_stream_is_silent() {
    let fake = FakeProvider::start().await;
    let slow = ClientOptions {
        idle_timeout: Duration::from_secs(600),
        ..options()
    };
    for (kind, fixture, base) in [
        (
            ProviderKind::OpenAi,
            "openai/stalls.sse",
            format!("{}/v1", fake.url),
        ),
        (ProviderKind::Anthropic, "anthropic/stalls.sse", fake.url.clone()),
    ] {
        let endpoint = Endpoint {
            kind,
            base_url: Some(base),
            key: Some(Secret::new(KEY.into())),
        };
        let p = connect_with(&endpoint, &slow).unwrap();
        fake.script([Reply::stalling(fixture)]);
        let (got, sink) = collector();
        let cancel = CancellationToken::new();
        let req = request("m", "hi");
        let turn = p.turn(&req, &sink, &cancel);
        tokio::pin!(turn);
        // Wait until the streamed text arrived, then cancel.
        let deadline = tokio::time::Instant::now() + DEADLINE;
        loop {
            tokio::select! {
                r = &mut turn => panic!("the turn ended on its own: {r:?}"),
                _ = tokio::task::yield_now() => {}
            }
            if !got.lock().unwrap().is_empty() {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "text within the deadline");
        }
        cancel.cancel();
        let r = tokio::time::timeout(Duration::from_secs(5), turn)
            .await
            .expect("cancelled promptly");
        assert_eq!(r.unwrap_err(), ProviderError::Cancelled);
    }
}

// ---- Anthropic ------------------------------------------------------------------

#[tokio::test]
async fn anthropic_thinking_text_and_tool_use_go_back_signed_and_with_the_tool_use_id() {
    let fake = FakeProvider::start().await;
    fake.script([
        Reply::fixture("anthropic/thinking_tool.sse"),
        Reply::fixture("anthropic/after_tool.sse"),
    ]);
    let s = vak(anthropic(&fake), "claude-sonnet-4-5").await;
    std::fs::write(s.workspace.join("notes.txt"), "buy milk\n").unwrap();
    let (_, frames) = run(&s, "what do my notes say?").await;
    assert_completed(&frames);

    let thinking: String = of_kind(&frames, "thinking_delta")
        .iter()
        .map(|t| t["text"].as_str().unwrap())
        .collect();
    assert_eq!(
        thinking,
        "The user wants to know what is in notes.txt. I should read it."
    );
    assert_eq!(text_of(&frames), "I'll read the notes.The notes say: buy milk.");
    let calls = of_kind(&frames, "tool_call");
    assert_eq!(calls[0]["call_id"], "toolu_01A09q90qw90lq917835lq9");
    assert_eq!(calls[0]["input"], json!({"path": "notes.txt"}));
    let results = of_kind(&frames, "tool_result");
    assert_eq!(results[0]["call_id"], "toolu_01A09q90qw90lq917835lq9");
    assert_eq!(results[0]["ok"], true);

    let reqs = fake.wait_requests(2).await;
    let first = &reqs[0];
    assert_eq!(first.path, "/v1/messages");
    assert_eq!(first.header("x-api-key"), Some(KEY));
    assert_eq!(first.header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(first.header("authorization"), None);
    assert_eq!(first.body["model"], "claude-sonnet-4-5");
    assert_eq!(first.body["stream"], true);
    assert!(first.body["max_tokens"].as_u64().unwrap() > 0);
    assert!(!first.body["system"][0]["text"].as_str().unwrap().is_empty());
    assert!(first.body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .any(|t| t["name"] == "read_file" && t["input_schema"].is_object()));
    // The last user message and the system prompt are prompt-cache breakpoints.
    assert_eq!(
        first.body["messages"],
        json!([{"role": "user", "content": [
            {"type": "text", "text": "what do my notes say?", "cache_control": {"type": "ephemeral"}}
        ]}])
    );
    assert_eq!(
        first.body["system"][0]["cache_control"],
        json!({"type": "ephemeral"})
    );

    let msgs = reqs[1].body["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), 3, "{msgs:?}");
    let sig = "EqoBCkgIBxABGAIiQL5Xk1bR2uCw3dOqg8mFh0vY7zT4pLs9eNc6aJrKx5iW1oQ2yHuG3fVt8nB0mSdEa4lZ7cR9kX6jP1qU2wT3vYMSDNv0hTc4pGYHtJ2sXRoMq8wF5aL1nK7bE3dJIjDVh9c0tBzH6m2rQ8x4pS1kW7yN3uG5fA0iL9eZ2oT6";
    assert_eq!(msgs[1]["role"], "assistant");
    assert_eq!(
        msgs[1]["content"],
        json!([
            {"type": "thinking", "thinking": "The user wants to know what is in notes.txt. I should read it.", "signature": sig},
            {"type": "text", "text": "I'll read the notes."},
            {"type": "tool_use", "id": "toolu_01A09q90qw90lq917835lq9", "name": "read_file", "input": {"path": "notes.txt"}},
        ])
    );
    assert_eq!(msgs[2]["role"], "user");
    let blocks = msgs[2]["content"].as_array().unwrap();
    assert_eq!(blocks.len(), 1);
    assert_eq!(blocks[0]["type"], "tool_result");
    assert_eq!(blocks[0]["tool_use_id"], "toolu_01A09q90qw90lq917835lq9");
    assert_eq!(blocks[0]["is_error"], false);
    assert!(blocks[0]["content"].as_str().unwrap().contains("buy milk"));
}

#[tokio::test]
async fn anthropic_two_tool_use_blocks_return_as_one_user_message() {
    let fake = FakeProvider::start().await;
    fake.script([
        Reply::fixture("anthropic/parallel_tool_use.sse"),
        Reply::fixture("anthropic/after_two_tools.sse"),
    ]);
    // A base that already ends in /v1 is tolerated.
    let p = provider(ProviderKind::Anthropic, &format!("{}/v1", fake.url), Some(KEY));
    let s = vak(p, "claude-sonnet-4-5").await;
    std::fs::write(s.workspace.join("a.txt"), "alpha").unwrap();
    let (_, frames) = run(&s, "read a and b").await;
    assert_completed(&frames);
    let results = of_kind(&frames, "tool_result");
    assert_eq!(results.len(), 2);
    assert_eq!(results[0]["ok"], true);
    assert_eq!(results[1]["ok"], false, "b.txt does not exist");

    let reqs = fake.wait_requests(2).await;
    assert!(reqs.iter().all(|r| r.path == "/v1/messages"));
    let msgs = reqs[1].body["messages"].as_array().unwrap();
    let ids: Vec<&Value> = msgs[1]["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| &b["id"])
        .collect();
    assert_eq!(
        ids,
        vec!["toolu_01Ab3dE5fG7hJ9kL1mN3pQ", "toolu_01Uv7wX9yZ1aB3cD5eF7gH"]
    );
    let blocks = msgs[2]["content"].as_array().unwrap();
    let back: Vec<(&Value, &Value)> = blocks
        .iter()
        .map(|b| (&b["tool_use_id"], &b["is_error"]))
        .collect();
    assert_eq!(
        back,
        vec![
            (&json!("toolu_01Ab3dE5fG7hJ9kL1mN3pQ"), &json!(false)),
            (&json!("toolu_01Uv7wX9yZ1aB3cD5eF7gH"), &json!(true)),
        ]
    );
}

#[tokio::test]
async fn anthropic_529_and_429_are_retried_then_the_run_completes() {
    let fake = FakeProvider::start().await;
    fake.script([
        Reply::status(529, r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"},"request_id":"req_011CSHoEeqs5C35K2UUqR7Fy"}"#),
        Reply::status(429, r#"{"type":"error","error":{"type":"rate_limit_error","message":"Number of request tokens has exceeded your per-minute rate limit"}}"#)
            .header("retry-after", "0")
            .header("anthropic-ratelimit-tokens-remaining", "0"),
        Reply::fixture("anthropic/text.sse"),
    ]);
    let s = vak(anthropic(&fake), "claude-sonnet-4-5").await;
    let (_, frames) = run(&s, "hi").await;
    assert_completed(&frames);
    assert_eq!(text_of(&frames), "Hello! How can I help you today?");
    assert_eq!(fake.requests().len(), 3);
    assert!(!all_text(&frames).contains("overloaded_error"));
}

#[tokio::test]
async fn anthropic_401_fails_without_retry_or_leak() {
    let fake = FakeProvider::start().await;
    fake.script([Reply::status(
        401,
        r#"{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"},"request_id":"req_011CSHpq9nN3wVhtKJ1oTuZz"}"#,
    )
    .header("x-should-retry", "false")]);
    let s = vak(anthropic(&fake), "claude-sonnet-4-5").await;
    let (_, frames) = run(&s, "hi").await;
    let fin = finished(&frames);
    assert_eq!(fin["outcome"], "failed");
    assert_eq!(fin["message"], "the model service refused the API key");
    assert_eq!(fake.requests().len(), 1);
    let seen = all_text(&frames);
    assert!(
        !seen.contains(KEY) && !seen.contains("invalid x-api-key"),
        "{seen}"
    );
}

#[tokio::test]
async fn anthropic_overloaded_error_mid_stream_restarts_the_turn() {
    let fake = FakeProvider::start().await;
    fake.script([
        Reply::fixture("anthropic/midstream_overloaded.sse"),
        Reply::fixture("anthropic/text.sse"),
    ]);
    let s = vak(anthropic(&fake), "claude-sonnet-4-5").await;
    let (sid, frames) = run(&s, "hi").await;
    assert_completed(&frames);
    assert_eq!(of_kind(&frames, "turn_started").len(), 2);
    assert_eq!(fake.requests().len(), 2);
    let (_, transcript) = s.get(&format!("/sessions/{sid}/transcript")).await;
    let answers = transcript["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["text"] == "Hello! How can I help you today?")
        .count();
    assert_eq!(answers, 1, "{transcript}");
}

#[tokio::test]
async fn anthropic_stalled_stream_times_out_and_is_retried() {
    let fake = FakeProvider::start().await;
    fake.script([
        Reply::stalling("anthropic/stalls.sse"),
        Reply::fixture("anthropic/text.sse"),
    ]);
    let s = vak(anthropic(&fake), "claude-sonnet-4-5").await;
    let (_, frames) = run(&s, "hi").await;
    assert_completed(&frames);
    assert_eq!(fake.requests().len(), 2);
}

#[tokio::test]
async fn anthropic_turn_usage_is_cumulative_and_models_list() {
    let fake = FakeProvider::start().await;
    let p = anthropic(&fake);
    fake.script([Reply::fixture("anthropic/thinking_tool.sse")]);
    let (got, sink) = collector();
    let cancel = CancellationToken::new();
    let out = p
        .turn(&request("claude-sonnet-4-5", "notes?"), &sink, &cancel)
        .await
        .unwrap();
    assert_eq!(out.stop, StopReason::ToolUse);
    assert_eq!(
        out.usage,
        TokenUsage {
            input_tokens: 2095,
            output_tokens: 112,
            cache_read_tokens: 0,
            cache_write_tokens: 1650
        }
    );
    let got = got.lock().unwrap().clone();
    let sig_at = got
        .iter()
        .position(|e| matches!(e, ProviderEvent::ThinkingSignature(_)))
        .unwrap();
    let first_text = got
        .iter()
        .position(|e| matches!(e, ProviderEvent::Text(_)))
        .unwrap();
    assert!(
        sig_at < first_text,
        "the signature closes the thinking before the text: {got:?}"
    );
    let body = &fake.requests()[0].body;
    assert_eq!(body["system"][0]["text"], "sys");
    assert!(body.get("tools").is_none());

    fake.script([Reply::status(
        200,
        r#"{"data":[{"type":"model","id":"claude-sonnet-4-5-20250929","display_name":"Claude Sonnet 4.5","created_at":"2025-09-29T00:00:00Z"}],"has_more":false,"first_id":"claude-sonnet-4-5-20250929","last_id":"claude-sonnet-4-5-20250929"}"#,
    )]);
    let models = p.list_models().await.unwrap();
    assert_eq!(models[0].id, "claude-sonnet-4-5-20250929");
    assert_eq!(models[0].display_name, "Claude Sonnet 4.5");
    let r = &fake.requests()[1];
    assert_eq!((r.method.as_str(), r.path.as_str()), ("GET", "/v1/models"));
    assert_eq!(r.header("x-api-key"), Some(KEY));
    fake.script([Reply::status(503, "upstream connect error")]);
    let f = p.list_models().await.unwrap_err();
    assert_eq!((f.kind, f.retryable), (FailureKind::Overloaded, true));
}

#[tokio::test]
async fn cancelling_a_run_aborts_a_silent_stream_at_once() {
    let fake = FakeProvider::start().await;
    fake.script([Reply::stalling("openai/stalls.sse")]);
    let endpoint = Endpoint {
        kind: ProviderKind::OpenAi,
        base_url: Some(format!("{}/v1", fake.url)),
        key: None,
    };
    let slow = ClientOptions {
        idle_timeout: Duration::from_secs(600),
        ..options()
    };
    let s = vak(connect_with(&endpoint, &slow).unwrap(), "llama").await;
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    s.run(&sid, "hi").await;
    sse.until("turn_started").await;
    fake.wait_requests(1).await;
    let (code, _) = s.post(&format!("/sessions/{sid}/cancel"), json!({})).await;
    assert!(code < 300);
    let frames = sse.until("run_finished").await;
    assert_eq!(finished(&frames)["outcome"], "cancelled");
    assert_eq!(fake.requests().len(), 1, "a cancelled turn is not retried");
}

// ---- Retries running out -------------------------------------------------------

/// Runs "hi" on `s` (whose fake is scripted to fail every attempt) and
/// checks what a user sees when retries run out: `run_finished{failed}` with
/// `message`, and `raw` (a piece of the service's own error) in no frame and
/// not in the transcript.
async fn fails_with(s: &TestServer, message: &str, raw: &str) -> Vec<Frame> {
    let (sid, frames) = run(s, "hi").await;
    let fin = finished(&frames);
    assert_eq!(
        (fin["outcome"].as_str(), fin["message"].as_str()),
        (Some("failed"), Some(message)),
        "{fin}"
    );
    let seen = all_text(&frames);
    assert!(!seen.contains(raw), "the raw error reached a client: {seen}");
    let (_, transcript) = s.get(&format!("/sessions/{sid}/transcript")).await;
    let transcript = transcript.to_string();
    assert!(transcript.contains(message), "{transcript}");
    assert!(
        !transcript.contains(raw),
        "the raw error is in the transcript: {transcript}"
    );
    frames
}

/// `reply` for every attempt a turn may take (and none more: a further
/// request would find the script exhausted and be counted).
fn every_attempt(reply: Reply) -> Vec<Reply> {
    vec![reply; 1 + RETRIES as usize]
}

/// `script` for a server routed to `p` (on `fake`): the run fails as
/// `fails_with` checks, after exactly 1 + RETRIES attempts.
async fn gives_up(
    fake: &FakeProvider,
    p: Arc<dyn Provider>,
    script: Vec<Reply>,
    message: &str,
    raw: &str,
) -> Vec<Frame> {
    fake.script(script);
    let s = vak(p, "m").await;
    let frames = fails_with(&s, message, raw).await;
    assert_eq!(fake.requests().len(), 1 + RETRIES as usize);
    frames
}

#[tokio::test]
async fn rate_limiting_past_the_retries_fails_with_the_rate_limit_message() {
    let fake = FakeProvider::start().await;
    let refusal = Reply::status(
        429,
        r#"{"error":{"message":"Rate limit reached for gpt-4.1 in organization org-q7Rk2 on requests per min (RPM): Limit 500, Used 500, Requested 1.","type":"requests","param":null,"code":"rate_limit_exceeded"}}"#,
    );
    let message = "the model service is rate limiting requests; try again later";
    gives_up(&fake, openai(&fake), every_attempt(refusal), message, "org-q7Rk2").await;
}

#[tokio::test]
async fn overload_past_the_retries_fails_with_the_overloaded_message() {
    let fake = FakeProvider::start().await;
    // 529 before the stream, then overloaded_error inside it: both are the
    // same kind, and the retries count across them.
    let mut script = every_attempt(Reply::status(
        529,
        r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"},"request_id":"req_011CVq8uXoWb3K7mTzQ2sJfN"}"#,
    ));
    script[1] = Reply::fixture("anthropic/midstream_overloaded.sse");
    let message = "the model service is overloaded; try again later";
    let frames = gives_up(
        &fake,
        anthropic(&fake),
        script,
        message,
        "req_011CVq8uXoWb3K7mTzQ2sJfN",
    )
    .await;
    assert!(!all_text(&frames).contains("overloaded_error"));
}

#[tokio::test]
async fn a_server_error_with_a_garbage_body_past_the_retries_fails_as_an_invalid_response() {
    let fake = FakeProvider::start().await;
    let garbage = Reply::Status {
        status: 502,
        headers: vec![("content-type".into(), "text/html".into())],
        body: "<html><head><title>502 Bad Gateway</title></head><body><center>nginx/1.25.3-q9</center></body></html>".into(),
    };
    let message = "the model service sent an invalid response";
    gives_up(
        &fake,
        openai(&fake),
        every_attempt(garbage),
        message,
        "nginx/1.25.3-q9",
    )
    .await;
}

#[tokio::test]
async fn a_malformed_stream_fails_as_an_invalid_response_without_a_retry() {
    // A 200 stream whose data is not JSON: the same request would get the
    // same answer, so it is not retried (docs/protocol.md section 7).
    for (kind, marker) in [
        (ProviderKind::OpenAi, "chatcmpl-garbled"),
        (ProviderKind::Anthropic, "msg_garbled"),
    ] {
        let fake = FakeProvider::start().await;
        let garbage = match kind {
            ProviderKind::OpenAi => format!("data: {{\"id\":\"{marker}\",\"choices\":[{{\"delta\":{{\"content\":\"Hel\n\n"),
            _ => format!("event: message_start\ndata: {{\"type\":\"message_start\",\"message\":{{\"id\":\"{marker}\"\n\n"),
        };
        fake.script(every_attempt(Reply::Sse {
            events: vec![garbage],
            stall: false,
        }));
        let p = match kind {
            ProviderKind::OpenAi => openai(&fake),
            _ => anthropic(&fake),
        };
        let s = vak(p, "m").await;
        fails_with(&s, "the model service sent an invalid response", marker).await;
        assert_eq!(fake.requests().len(), 1, "{kind:?}: not retried");
    }
}

#[tokio::test]
async fn connections_that_break_past_the_retries_fail_with_the_network_message() {
    // Every connection is cut before the service answers.
    let fake = FakeProvider::start().await;
    let gate = HoldProxy::start(fake.addr).await;
    gate.hold();
    let s = vak(
        provider(ProviderKind::OpenAi, &format!("{}/v1", gate.url), Some(KEY)),
        "gpt-4.1",
    )
    .await;
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    let (code, _) = s.run(&sid, "hi").await;
    assert_eq!(code, 202);
    for attempt in 1..=1 + RETRIES as usize {
        gate.wait_accepted(attempt).await;
        assert_eq!(gate.cut(), 1, "attempt {attempt} is held, then cut");
    }
    let frames = sse.until("run_finished").await;
    let fin = finished(&frames);
    let message = format!("could not reach the model service at {}", gate.addr);
    assert_eq!(
        (fin["outcome"].as_str(), fin["message"].as_str()),
        (Some("failed"), Some(message.as_str()))
    );
    assert!(!all_text(&frames).contains(&format!("{}/v1", gate.url)));
    assert_eq!(gate.accepted(), 1 + RETRIES as usize);
    assert!(fake.requests().is_empty());

    // Nothing listening at all: refused, every attempt.
    let addr = crate::route_feedback::dead_addr().await;
    let base = format!("http://{addr}/v1");
    let s = vak(provider(ProviderKind::OpenAi, &base, Some(KEY)), "gpt-4.1").await;
    fails_with(&s, &format!("could not reach the model service at {addr}"), &base).await;
}

#[tokio::test]
async fn a_connection_closed_before_the_answer_is_retried_and_the_run_completes() {
    let fake = FakeProvider::start().await;
    fake.script([Reply::fixture("openai/text.sse")]);
    let gate = HoldProxy::start(fake.addr).await;
    gate.hold();
    let s = vak(
        provider(ProviderKind::OpenAi, &format!("{}/v1", gate.url), Some(KEY)),
        "gpt-4.1",
    )
    .await;
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    s.run(&sid, "hi").await;
    gate.wait_accepted(1).await;
    assert_eq!(gate.cut(), 1);
    gate.release();
    let frames = sse.until("run_finished").await;
    assert_completed(&frames);
    assert_eq!(text_of(&frames), "Hello! How can I help you today?");
    assert_eq!(gate.accepted(), 2, "one broken connection, one that answered");
    assert_eq!(fake.requests().len(), 1);
}

#[tokio::test]
async fn a_service_that_never_answers_times_out_per_the_configured_header_wait() {
    // The route comes from PATCH /config, so the client is built with the
    // core config's provider_client options: 300 ms for the headers, not 300 s.
    let fake = FakeProvider::start().await;
    let gate = HoldProxy::start(fake.addr).await;
    gate.hold();
    let s = TestServer::start_with(|c| {
        c.core.provider_client.response_timeout = Duration::from_millis(300);
        c.core.retry_backoff = Duration::from_millis(10);
        c.core.provider_retries = 2;
    })
    .await;
    let (code, v) = s
        .send(
            reqwest::Method::PATCH,
            "/config",
            Some(json!({"provider": "openai", "model": "gpt-4.1", "base_url": format!("{}/v1", gate.url)})),
        )
        .await;
    assert_eq!(code, 200, "{v}");
    let started = std::time::Instant::now();
    let message = format!("could not reach the model service at {}", gate.addr);
    fails_with(&s, &message, "no response headers").await;
    assert_eq!(
        gate.accepted(),
        4,
        "the PATCH's probe, then tried, then retried twice"
    );
    assert!(started.elapsed() < DEADLINE, "{:?}", started.elapsed());
    assert!(fake.requests().is_empty());
}

// ---- Usage -----------------------------------------------------------------------

#[tokio::test]
async fn usage_is_kept_per_turn_in_the_transcript_and_per_session_in_the_listing() {
    let fake = FakeProvider::start().await;
    // A tool call, then the answer: two model turns with their own usage.
    fake.script([
        Reply::fixture("anthropic/thinking_tool.sse"),
        Reply::fixture("anthropic/after_tool.sse"),
    ]);
    let s = vak(anthropic(&fake), "claude-sonnet-4-5").await;
    std::fs::write(s.workspace.join("notes.txt"), "buy milk\n").unwrap();
    let (sid, frames) = run(&s, "what do my notes say?").await;
    assert_completed(&frames);
    let first = json!({"input_tokens": 2095, "output_tokens": 112, "cache_read_tokens": 0, "cache_write_tokens": 1650});
    let second =
        json!({"input_tokens": 2410, "output_tokens": 9, "cache_read_tokens": 2095, "cache_write_tokens": 0});
    let total = json!({"input_tokens": 4505, "output_tokens": 121, "cache_read_tokens": 2095, "cache_write_tokens": 1650});

    let (_, t) = s.get(&format!("/sessions/{sid}/transcript")).await;
    let turns = t["turns"].as_array().expect("turns");
    let usages: Vec<&Value> = turns.iter().map(|u| &u["usage"]).collect();
    assert_eq!(usages, vec![&first, &second], "{t}");
    let seqs: Vec<u64> = turns.iter().map(|u| u["seq"].as_u64().unwrap()).collect();
    assert!(seqs[0] < seqs[1] && seqs[1] <= t["seq"].as_u64().unwrap(), "{t}");
    assert_eq!(t["usage"], total);

    let (_, list) = s.get("/sessions").await;
    let mine = list["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["session_id"] == sid.as_str())
        .expect("the session is listed");
    assert_eq!(mine["usage"], total, "{list}");

    let mut g = s.grpc().await;
    let usage = |u: &pb::Usage| {
        json!({"input_tokens": u.input_tokens, "output_tokens": u.output_tokens,
               "cache_read_tokens": u.cache_read_tokens, "cache_write_tokens": u.cache_write_tokens})
    };
    let t = g
        .get_transcript(pb::GetTranscriptRequest {
            session_id: sid.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    let got: Vec<(u64, Value)> = t
        .turns
        .iter()
        .map(|u| (u.seq, usage(u.usage.as_ref().unwrap())))
        .collect();
    assert_eq!(got, vec![(seqs[0], first), (seqs[1], second)]);
    assert_eq!(usage(t.usage.as_ref().unwrap()), total);
    let list = g
        .list_sessions(pb::ListSessionsRequest {})
        .await
        .unwrap()
        .into_inner();
    let mine = list.sessions.iter().find(|x| x.session_id == sid).unwrap();
    assert_eq!(usage(mine.usage.as_ref().unwrap()), total);
}

// ---- The system prompt --------------------------------------------------------------

#[tokio::test]
async fn agents_md_at_the_workspace_root_reaches_the_system_prompt_bounded() {
    const RULE: &str = "Always run `make lint-q7` before proposing a change.";
    let fake = FakeProvider::start().await;
    fake.script([
        Reply::fixture("openai/text.sse"),
        Reply::fixture("openai/text.sse"),
    ]);
    let s = vak(openai(&fake), "gpt-4.1").await;
    std::fs::write(
        s.workspace.join("AGENTS.md"),
        format!("# Project rules\n\n{RULE}\n"),
    )
    .unwrap();
    let (_, frames) = run(&s, "hi").await;
    assert_completed(&frames);
    let system = |r: &Recorded| {
        r.body["messages"][0]["content"]
            .as_str()
            .unwrap_or("")
            .to_string()
    };
    let reqs = fake.wait_requests(1).await;
    assert_eq!(reqs[0].body["messages"][0]["role"], "system");
    let prompt = system(&reqs[0]);
    assert!(
        prompt.contains("AGENTS.md at the workspace root") && prompt.contains(RULE),
        "{prompt}"
    );

    // Read again for every run, and cut at its bound with a note.
    let max = vak::core::session::prompt::MAX_INSTRUCTIONS;
    std::fs::write(
        s.workspace.join("AGENTS.md"),
        format!("{}{}", "a".repeat(max), "TAIL-NOT-SENT"),
    )
    .unwrap();
    let (_, frames) = run(&s, "hi").await;
    assert_completed(&frames);
    let prompt = system(&fake.wait_requests(2).await[1]);
    assert!(prompt.contains(&"a".repeat(max)), "all of the bound is sent");
    assert!(!prompt.contains("TAIL-NOT-SENT"));
    assert!(
        prompt.contains(&format!(
            "[AGENTS.md is longer than {max} bytes; the rest is not shown]"
        )),
        "{}",
        &prompt[prompt.len().saturating_sub(300)..]
    );
    assert!(prompt.len() < max + 4096, "{}", prompt.len());

    // Anthropic carries it in `system`.
    let fake = FakeProvider::start().await;
    fake.script([Reply::fixture("anthropic/text.sse")]);
    let s = vak(anthropic(&fake), "claude-sonnet-4-5").await;
    std::fs::write(s.workspace.join("AGENTS.md"), format!("{RULE}\n")).unwrap();
    let (_, frames) = run(&s, "hi").await;
    assert_completed(&frames);
    let reqs = fake.wait_requests(1).await;
    let system = reqs[0].body["system"][0]["text"].as_str().unwrap();
    assert!(system.contains(RULE), "{system}");
}

// ---- Redirects ----------------------------------------------------------------------

/// A base URL that answers 307 with a Location on another port (another
/// origin): vak sends nothing there, so neither `Authorization` (OpenAI) nor
/// `x-api-key` (Anthropic) reaches it, and the run fails at once saying vak
/// follows no redirects; the model list fails the same way.
#[tokio::test]
async fn a_redirect_to_another_origin_is_never_followed_so_the_key_stays_home() {
    let routes: [(ProviderKind, &str, &str, &str); 2] = [
        (
            ProviderKind::OpenAi,
            "gpt-4.1",
            "/v1/chat/completions",
            "openai/text.sse",
        ),
        (
            ProviderKind::Anthropic,
            "claude-sonnet-4-5",
            "/v1/messages",
            "anthropic/text.sse",
        ),
    ];
    for (kind, model, path, fixture) in routes {
        let base = FakeProvider::start().await;
        let elsewhere = FakeProvider::start().await;
        // Followed, the redirect would succeed there.
        elsewhere.script([Reply::fixture(fixture), Reply::fixture(fixture)]);
        let to = |path: &str| Reply::status(307, "").header("location", &format!("{}{path}", elsewhere.url));
        base.script([to(path)]);
        let p = match kind {
            ProviderKind::OpenAi => openai(&base),
            _ => anthropic(&base),
        };
        let s = vak(p.clone(), model).await;
        let (_, frames) = run(&s, "hi").await;
        let fin = finished(&frames);
        assert_eq!(fin["outcome"], "failed", "{kind:?}: {frames:#?}");
        assert_eq!(
            fin["message"],
            "the model service answered with a redirect (HTTP 307); vak follows no redirects from a model service: set the base URL to the address the service answers at",
            "{kind:?}"
        );
        assert_eq!(base.requests().len(), 1, "{kind:?}: a redirect is not retried");

        base.script([to("/v1/models")]);
        let f = p.list_models().await.unwrap_err();
        assert_eq!(
            (f.kind, f.retryable),
            (FailureKind::Redirect(307), false),
            "{kind:?}"
        );

        let leaked: Vec<_> = elsewhere
            .requests()
            .iter()
            .map(|r| {
                (
                    r.path.clone(),
                    r.header("authorization").is_some(),
                    r.header("x-api-key").is_some(),
                )
            })
            .collect();
        assert!(leaked.is_empty(), "{kind:?}: the redirect target got {leaked:?}");
    }
}
