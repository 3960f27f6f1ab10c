//! Image attachments against a real server (issue 15): what vak sends the
//! model service carries them as native image blocks (OpenAI `image_url`
//! data URLs, Anthropic base64 `image` blocks), also for history after a
//! restart; events, the transcript and the ledger hold a reference to the
//! content-addressed file in the home, never the bytes; a queued steering
//! input keeps its image; bad media types, oversized or too many images and
//! bad base64 are refused with 400 and a reason, admitting nothing.

use crate::support;
use crate::support::fake_provider::{FakeProvider, Reply};
use crate::support::TestServer;
use base64::Engine;
use serde_json::{json, Value};

const PNG: &[u8] = b"\x89PNG\r\n\x1a\n not really a picture";

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn sha(bytes: &[u8]) -> String {
    vak::core::host::files::sha256_hex(bytes)
}

fn png() -> Value {
    json!({"media_type": "image/png", "data": b64(PNG), "name": "shot.png"})
}

/// Runs `body` (a run request) to its run_finished; returns the user_message's body.
async fn run_with(s: &TestServer, sid: &str, body: Value) -> Value {
    let latest = s.latest_seq(sid).await;
    let mut sse = s.events(sid, Some(latest)).await;
    let (status, a) = s.post(&format!("/sessions/{sid}/run"), body).await;
    assert_eq!(status, 202, "{a}");
    let frames = sse.until("run_finished").await;
    assert_eq!(
        frames.last().unwrap().body()["outcome"],
        "completed",
        "{frames:?}"
    );
    frames
        .iter()
        .find(|f| f.event == "user_message")
        .unwrap()
        .body()
        .clone()
}

/// The reference every surface shows for PNG.
fn png_ref() -> Value {
    json!({"sha256": sha(PNG), "media_type": "image/png", "name": "shot.png", "size": PNG.len()})
}

#[tokio::test]
async fn openai_gets_image_url_data_urls_also_for_history_after_a_restart() {
    let fake = FakeProvider::start().await;
    fake.script((0..2).map(|_| Reply::fixture("openai/text.sse")));
    let s = TestServer::start_with_route(fake.openai_route(), |_| {}).await;
    let sid = s.create_session().await;
    let user = run_with(
        &s,
        &sid,
        json!({"prompt": "what is this?", "attachments": [png()]}),
    )
    .await;
    assert_eq!(user["attachments"], json!([png_ref()]));
    let reqs = fake.wait_requests(1).await;
    let url = format!("data:image/png;base64,{}", b64(PNG));
    let expected = json!({"role": "user", "content": [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": url}},
    ]});
    let messages = reqs[0].body["messages"].as_array().unwrap();
    assert_eq!(messages.last().unwrap(), &expected);

    // Stored once, owner-only, under its hash; the ledger has the reference only.
    let file = s.home.join("attachments").join(sha(PNG));
    assert_eq!(std::fs::read(&file).unwrap(), PNG);
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let ledger = std::fs::read_to_string(s.home.join("sessions").join(format!("{sid}.jsonl"))).unwrap();
    assert!(ledger.contains(&sha(PNG)) && !ledger.contains(&b64(PNG)));
    let (_, t) = s.get(&format!("/sessions/{sid}/transcript")).await;
    assert_eq!(
        t["messages"][0]["attachments"],
        json!({"items": [png_ref()]}),
        "{t}"
    );
    assert!(t["messages"][1].get("attachments").is_none(), "{t}");

    // A restart keeps the reference and the file: the model sees the image again.
    let (home, ws) = s.stop().await.unwrap();
    let s = TestServer::start_in_with_route(home.path(), ws.path(), fake.openai_route(), |_| {}).await;
    let (_, t2) = s.get(&format!("/sessions/{sid}/transcript")).await;
    assert_eq!(t2["messages"], t["messages"]);
    run_with(&s, &sid, json!({"prompt": "and now?"})).await;
    let reqs = fake.wait_requests(2).await;
    let messages = reqs[1].body["messages"].as_array().unwrap();
    assert!(messages.contains(&expected), "{messages:?}");
}

#[tokio::test]
async fn anthropic_gets_base64_image_blocks_before_the_text() {
    let fake = FakeProvider::start().await;
    fake.script([Reply::fixture("anthropic/text.sse")]);
    let s = TestServer::start_with_route(fake.anthropic_route(), |_| {}).await;
    let sid = s.create_session().await;
    let gif = b"GIF89a tiny";
    let body = json!({"prompt": "compare", "attachments": [
        png(),
        {"media_type": "image/gif", "data": b64(gif)},
    ]});
    run_with(&s, &sid, body).await;
    let reqs = fake.wait_requests(1).await;
    let messages = reqs[0].body["messages"].as_array().unwrap();
    assert_eq!(
        messages.last().unwrap(),
        &json!({"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(PNG)}},
            {"type": "image", "source": {"type": "base64", "media_type": "image/gif", "data": b64(gif)}},
            // The prompt cache breakpoint stays on the last block.
            {"type": "text", "text": "compare", "cache_control": {"type": "ephemeral"}},
        ]})
    );
}

#[tokio::test]
async fn a_queued_steering_input_keeps_its_image() {
    let s = TestServer::start().await;
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    // Default mode: the write waits for an approval, so the steering queues.
    s.run(&sid, "/write a.txt x").await;
    let ask = sse.next_ask().await;
    let (status, a) = s
        .post(
            &format!("/sessions/{sid}/steering"),
            json!({"text": "look at this", "attachments": [png()]}),
        )
        .await;
    assert_eq!((status, a["state"].as_str()), (202, Some("queued")), "{a}");
    let rid = ask["request_id"].as_str().unwrap();
    s.post(
        &format!("/sessions/{sid}/approvals/{rid}"),
        json!({"approve": true}),
    )
    .await;
    let frames = sse.until("run_finished").await;
    let user = frames
        .iter()
        .find(|f| f.event == "user_message")
        .expect("the queued input's leg");
    assert_eq!(user.body()["text"], "look at this");
    assert_eq!(user.body()["attachments"], json!([png_ref()]));
    // The offline model acknowledges what it was sent (section 14).
    let text = support::text_of(&frames);
    assert!(
        text.ends_with("seen 1 image: image/png\necho: look at this"),
        "{text:?}"
    );
}

#[tokio::test]
async fn bad_media_types_oversized_or_too_many_images_and_bad_base64_are_refused() {
    let s = TestServer::start().await;
    let sid = s.create_session().await;
    let big = vec![0u8; 2 * 1024 * 1024 + 1];
    let cases = [
        (
            json!([{"media_type": "image/svg+xml", "data": b64(b"<svg/>")}]),
            "unsupported_media_type",
        ),
        (
            json!([{"media_type": "image/png", "data": "not base64!"}]),
            "bad_base64",
        ),
        (
            json!([{"media_type": "image/png", "data": b64(&big)}]),
            "attachment_too_large",
        ),
        (json!([png(), png(), png(), png(), png()]), "too_many_attachments"),
    ];
    for (attachments, reason) in cases {
        for (path, body) in [
            ("run", json!({"prompt": "p", "attachments": attachments})),
            ("steering", json!({"text": "p", "attachments": attachments})),
        ] {
            let (status, e) = s.post(&format!("/sessions/{sid}/{path}"), body).await;
            assert_eq!(status, 400, "{path} {reason}: {e}");
            assert_eq!(
                (e["error"]["code"].as_str(), e["error"]["reason"].as_str()),
                (Some("invalid_argument"), Some(reason)),
                "{e}"
            );
        }
    }
    assert_eq!(s.latest_seq(&sid).await, 0, "nothing was admitted");
    assert!(!s.home.join("attachments").join(sha(PNG)).exists());
    let mut g = s.grpc().await;
    let e = g
        .run(vak::proto::v1::RunRequest {
            session_id: sid.clone(),
            prompt: "p".into(),
            attachments: vec![vak::proto::v1::Attachment {
                media_type: "text/plain".into(),
                data: b64(b"x"),
                name: String::new(),
            }],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert_eq!(
        e.metadata().get("vak-error-reason").and_then(|v| v.to_str().ok()),
        Some("unsupported_media_type")
    );
}
