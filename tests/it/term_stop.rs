//! `vak term` and a reply that did not end on its own: a fake OpenAI-compatible service cuts the answer (`finish_reason: "length"`), and vak term says so once after the answer, one-shot over both transports and interactive, and again from the transcript when the session is attached anew.

use crate::support::fake_provider::{fixture, FakeProvider, Reply};
use crate::support::term::{attached, idle};
use crate::support::*;
use std::time::Duration;
use vak::core::provider::http::ClientOptions;
use vak::core::provider::{connect_with, Endpoint, ProviderKind, Secret};
use vak::core::session::live::Route;

const ANSWER: &str = "Hello! How can I help you today?";
const CUT: &str = "⚠ cut at the output limit";

/// The recorded OpenAI text stream, ending with the length stop instead of "stop".
fn cut_reply() -> Reply {
    let text =
        fixture("openai/text.sse").replace("\"finish_reason\":\"stop\"", "\"finish_reason\":\"length\"");
    assert!(
        text.contains("\"finish_reason\":\"length\""),
        "the fixture ends with a stop"
    );
    Reply::Sse {
        events: text.split_inclusive("\n\n").map(str::to_string).collect(),
        stall: false,
    }
}

async fn server_on(fake: &FakeProvider) -> TestServer {
    let endpoint = Endpoint {
        kind: ProviderKind::OpenAi,
        base_url: Some(format!("{}/v1/", fake.url)),
        key: Some(Secret::new("sk-test-term-stop".to_string())),
    };
    let options = ClientOptions {
        connect_timeout: Duration::from_secs(5),
        response_timeout: Duration::from_secs(10),
        ..ClientOptions::default()
    };
    let route = Route {
        provider: connect_with(&endpoint, &options).unwrap_or_else(|f| panic!("connect: {f:?}")),
        model: "gpt-4.1".into(),
        context_window: None,
    };
    TestServer::start_with_route(route, |_| {}).await
}

#[tokio::test]
async fn a_cut_reply_is_said_once_after_the_answer_one_shot_and_interactive() {
    let fake = FakeProvider::start().await;
    fake.script([cut_reply(), cut_reply(), cut_reply()]);
    let server = server_on(&fake).await;

    for t in ["sse", "grpc"] {
        let mut cmd = crate::support::process::vak(&["term"]);
        cmd.env_remove("VAK_URL").args([
            "--url",
            &server.url,
            "--token",
            TOKEN,
            "--transport",
            t,
            "-p",
            "say hello",
        ]);
        let out = tokio::time::timeout(DEADLINE, cmd.output())
            .await
            .expect("vak term exits within the deadline")
            .unwrap();
        let (stdout, stderr) = (
            String::from_utf8(out.stdout).unwrap(),
            String::from_utf8(out.stderr).unwrap(),
        );
        assert_eq!(out.status.code(), Some(0), "{t}: the run completed: {stderr}");
        assert_eq!(stdout, format!("{ANSWER}\n"), "{t}: the answer as it came");
        assert_eq!(stderr.matches(CUT).count(), 1, "{t}: {stderr}");
        assert_eq!(
            stderr.lines().last(),
            Some(format!("vak: {CUT}").as_str()),
            "{t}: {stderr}"
        );
    }

    let (st, v) = server.post("/sessions", serde_json::json!({})).await;
    assert_eq!(st, 201, "{v}");
    let sid = v["session_id"].as_str().unwrap().to_string();
    let mut pty = Pty::spawn(attached(&server, "sse", &sid), 30, 120);
    idle(&pty).await;
    pty.send("say hello\r");
    pty.wait_for(CUT).await;
    let screen = idle(&pty).await;
    assert_eq!(screen.matches(CUT).count(), 1, "said once:\n{screen}");
    let (answer, cut) = (screen.find(ANSWER).unwrap(), screen.find(CUT).unwrap());
    assert!(answer < cut, "after the answer:\n{screen}");
    pty.send("\x04");
    assert_eq!(pty.wait_exit().await, 0);

    // Attached anew, the session is drawn from its transcript: its run entry says it too.
    let mut again = Pty::spawn(attached(&server, "grpc", &sid), 30, 120);
    let screen = again.wait_for(CUT).await;
    assert_eq!(screen.matches(CUT).count(), 1, "{screen}");
    again.send("\x04");
    assert_eq!(again.wait_exit().await, 0);
}
