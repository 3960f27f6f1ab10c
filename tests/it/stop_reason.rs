//! Honest run endings: a reply cut by the output limit, refused or filtered says so on
//! run_finished (`stop_reason`), in the transcript and over gRPC; the outcome stays completed.

use crate::support::fake_provider::{FakeProvider, Reply};
use crate::support::{grpc_subscribe, text_of, TestServer};
use serde_json::Value;
use vak::proto::v1 as pb;

/// Runs `prompt` in a new session; returns the session id and its run_finished body.
async fn finish(s: &TestServer, prompt: &str) -> (String, Value, String) {
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    let (code, body) = s.run(&sid, prompt).await;
    assert!(code < 300, "{code} {body}");
    let frames = sse.until("run_finished").await;
    (sid, frames.last().unwrap().body().clone(), text_of(&frames))
}

/// The transcript's "run" entries.
async fn run_entries(s: &TestServer, sid: &str) -> Vec<Value> {
    let (code, t) = s.get(&format!("/sessions/{sid}/transcript")).await;
    assert_eq!(code, 200, "{t}");
    t["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "run")
        .cloned()
        .collect()
}

#[tokio::test]
async fn openai_length_and_content_filter_stops_end_completed_with_their_stop_reason() {
    let fake = FakeProvider::start().await;
    let text = "openai/text.sse";
    let stop = r#""finish_reason":"stop""#;
    fake.script([
        Reply::fixture_with(text, stop, r#""finish_reason":"length""#),
        Reply::fixture_with(text, stop, r#""finish_reason":"content_filter""#),
        Reply::fixture(text),
    ]);
    let s = TestServer::start_with_route(fake.openai_route(), |_| {}).await;
    for (want, message) in [
        ("max_tokens", "cut at the output limit"),
        ("content_filter", "stopped by the provider's content filter"),
    ] {
        let (sid, end, said) = finish(&s, "say hello").await;
        assert_eq!(end["outcome"], "completed", "{end}");
        assert_eq!(end["stop_reason"], want, "{end}");
        assert_eq!(end["message"], message, "{end}");
        assert_eq!(said, "Hello! How can I help you today?", "the text stays");
        let runs = run_entries(&s, &sid).await;
        assert_eq!(runs.len(), 1, "{runs:?}");
        assert_eq!(
            (&runs[0]["outcome"], &runs[0]["stop_reason"], &runs[0]["text"]),
            (
                &Value::from("completed"),
                &Value::from(want),
                &Value::from(message)
            )
        );
    }
    // A reply that ends on its own says nothing more.
    let (sid, end, _) = finish(&s, "say hello").await;
    assert_eq!(end["message"], "completed");
    assert!(end.get("stop_reason").is_none(), "{end}");
    assert!(run_entries(&s, &sid).await.is_empty());
}

#[tokio::test]
async fn anthropic_max_tokens_and_refusal_stops_end_completed_with_their_stop_reason() {
    let fake = FakeProvider::start().await;
    let text = "anthropic/text.sse";
    let end_turn = r#""stop_reason":"end_turn""#;
    fake.script([
        Reply::fixture_with(text, end_turn, r#""stop_reason":"max_tokens""#),
        Reply::fixture_with(text, end_turn, r#""stop_reason":"refusal""#),
    ]);
    let s = TestServer::start_with_route(fake.anthropic_route(), |_| {}).await;
    for want in ["max_tokens", "refusal"] {
        let (sid, end, _) = finish(&s, "say hello").await;
        assert_eq!(
            (&end["outcome"], &end["stop_reason"]),
            (&Value::from("completed"), &Value::from(want))
        );
        assert_eq!(run_entries(&s, &sid).await[0]["stop_reason"], want);
    }
}

#[tokio::test]
async fn the_offline_model_cut_at_max_output_tokens_says_so_over_sse_grpc_and_the_transcript() {
    let s = TestServer::start_with(|c| c.core.max_output_tokens = 3).await;
    let (sid, end, said) = finish(&s, "one two three four five").await;
    assert_eq!(said, "echo: one two ", "three tokens, then the cut");
    assert_eq!(end["stop_reason"], "max_tokens", "{end}");
    assert_eq!(run_entries(&s, &sid).await[0]["stop_reason"], "max_tokens");

    // The same over gRPC: a typed enum on RunFinished and on the transcript's entry.
    let mut client = s.grpc().await;
    let (mut events, _) = grpc_subscribe(&mut client, &sid, Some(0)).await;
    let got = events.until("run_finished").await;
    match got.last().and_then(|e| e.kind.as_ref()) {
        Some(pb::event::Kind::RunFinished(r)) => {
            assert_eq!(r.stop_reason, Some(pb::StopReason::MaxTokens as i32));
            assert_eq!(r.outcome, pb::RunOutcome::Completed as i32);
        }
        other => panic!("{other:?}"),
    }
    let t = client
        .get_transcript(pb::GetTranscriptRequest {
            session_id: sid.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    let run = t
        .messages
        .iter()
        .find(|m| m.role == pb::MessageRole::Run as i32)
        .expect("a run entry");
    assert_eq!(run.stop_reason, Some(pb::StopReason::MaxTokens as i32));
}
