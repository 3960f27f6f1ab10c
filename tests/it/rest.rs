//! REST + SSE end to end: runs, admission, cancel, approvals, tools, errors, transcripts.

use crate::support::*;
use serde_json::json;

const KNOWN: &[&str] = &[
    "user_message",
    "turn_started",
    "text_delta",
    "thinking_delta",
    "tool_call",
    "tool_result",
    "approval_requested",
    "approval_resolved",
    "status",
    "run_finished",
];

#[tokio::test]
async fn a_prompt_streams_its_echo_and_finishes_once() {
    let s = TestServer::start().await;
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    assert_eq!(sse.opened.as_ref().unwrap().body()["latest_seq"], 0);
    let (code, adm) = s.run(&sid, "hello world").await;
    assert_eq!(code, 202);
    assert_eq!(adm["state"], "started");
    let frames = sse.until("run_finished").await;
    assert_kinds(
        &frames,
        &[
            "status",
            "user_message",
            "turn_started",
            "text_delta",
            "text_delta",
            "text_delta",
            "status",
            "run_finished",
        ],
    );
    assert_numbered(&frames);
    assert_eq!(frames[0].seq(), 1, "the first event of a session is seq 1");
    assert_eq!(text_of(&frames), "echo: hello world");
    assert!(frames.iter().all(|f| f.data["session_id"] == sid.as_str()));
    assert_eq!(frames[1].body()["request_id"], adm["request_id"]);
    assert_eq!(frames[6].body()["busy"], false);
    assert_eq!(frames[7].body()["outcome"], "completed");
}

#[tokio::test]
async fn a_sized_burst_streams_deltas_of_that_many_bytes_and_refuses_a_bad_size() {
    let s = TestServer::start().await;
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    s.run(&sid, "/burst 3 1024").await;
    let frames = sse.until("run_finished").await;
    let deltas: Vec<String> = frames
        .iter()
        .filter(|f| f.event == "text_delta")
        .map(|f| f.body()["text"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(deltas.len(), 3, "one delta per token");
    for (i, d) in deltas.iter().enumerate() {
        assert_eq!(d.len(), 1024);
        assert!(
            d.starts_with(&format!("t{i}_")) && d.ends_with("_ "),
            "{}",
            &d[..8]
        );
    }
    s.run(&sid, "/burst 3 1048577").await;
    let frames = sse.until("run_finished").await;
    assert_eq!(
        text_of(&frames),
        "error: /burst expects a whole number up to 1048576, got \"1048577\""
    );
}

#[tokio::test]
async fn admission_queues_dedups_and_cancel_settles_the_chain_once() {
    let s = TestServer::start().await;
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    let (code, a) = s.run(&sid, "/sleep 60000").await;
    assert_eq!((code, a["state"].as_str()), (202, Some("started")));
    sse.until("turn_started").await;
    let (_, b) = s
        .post(
            &format!("/sessions/{sid}/run"),
            json!({"prompt": "two", "request_id": "r-2"}),
        )
        .await;
    assert_eq!((&b["request_id"], &b["state"]), (&json!("r-2"), &json!("queued")));
    let (code, dup) = s
        .post(
            &format!("/sessions/{sid}/run"),
            json!({"prompt": "two", "request_id": "r-2"}),
        )
        .await;
    assert_eq!(
        (code, &dup["request_id"], &dup["state"]),
        (202, &json!("r-2"), &json!("duplicate"))
    );
    let (code, st) = s
        .post(&format!("/sessions/{sid}/steering"), json!({"text": "steer"}))
        .await;
    assert_eq!((code, st["state"].as_str()), (202, Some("queued")));

    let (code, c) = s.post(&format!("/sessions/{sid}/cancel"), json!({})).await;
    assert_eq!((code, c), (200, json!({"cancelled": true, "discarded": 2})));
    let frames = sse.until("run_finished").await;
    let last = frames.last().unwrap();
    assert_eq!(last.body()["outcome"], "cancelled");
    assert!(
        !frames.iter().any(|f| f.event == "user_message"),
        "queued input was discarded: {frames:?}"
    );

    // Idle again: steering starts a run, and the dedup memory still holds.
    let (_, again) = s
        .post(&format!("/sessions/{sid}/steering"), json!({"text": "fresh"}))
        .await;
    assert_eq!(again["state"], "started");
    let frames = sse.until("run_finished").await;
    assert_eq!(text_of(&frames), "echo: fresh");
    let (_, dup) = s
        .post(
            &format!("/sessions/{sid}/run"),
            json!({"prompt": "x", "request_id": "r-2"}),
        )
        .await;
    assert_eq!(dup["state"], "duplicate");
    let (code, idle) = s.post(&format!("/sessions/{sid}/cancel"), json!({})).await;
    assert_eq!((code, idle), (200, json!({"cancelled": false, "discarded": 0})));
}

#[tokio::test]
async fn queued_input_runs_as_the_next_leg_of_the_same_chain() {
    let s = TestServer::start().await;
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    s.run(&sid, "/sleep 300\nfirst").await;
    sse.until("turn_started").await;
    let (_, q) = s
        .post(&format!("/sessions/{sid}/steering"), json!({"text": "second"}))
        .await;
    assert_eq!(q["state"], "queued");
    let frames = sse.until("run_finished").await;
    assert_eq!(frames.iter().filter(|f| f.event == "run_finished").count(), 1);
    assert_eq!(frames.iter().filter(|f| f.event == "user_message").count(), 1);
    assert_eq!(text_of(&frames), "echo: firstecho: second");
    assert_eq!(frames.last().unwrap().body()["outcome"], "completed");
    let busy: Vec<bool> = frames
        .iter()
        .filter(|f| f.event == "status")
        .map(|f| f.body()["busy"].as_bool().unwrap())
        .collect();
    assert_eq!(busy, [false], "one chain: busy stays true across legs");
}

#[tokio::test]
async fn approvals_resolve_exactly_once_and_gate_the_tool() {
    let s = TestServer::start().await;
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    s.run(&sid, "/write notes/a.txt hello there\n/write b.txt nope")
        .await;
    let frames = sse.until("approval_requested").await;
    let call = frames
        .iter()
        .find(|f| f.event == "tool_call")
        .unwrap()
        .body()
        .clone();
    assert_eq!(call["tool"], "write_file");
    assert_eq!(
        call["input"],
        json!({"path": "notes/a.txt", "content": "hello there"})
    );
    let ask = frames.last().unwrap().body().clone();
    assert_eq!(ask["tool"], "write_file");
    assert_eq!(ask["input"]["path"], "notes/a.txt");
    assert!(!ask["reason"].as_str().unwrap().is_empty());
    let rid = ask["request_id"].as_str().unwrap().to_string();
    assert!(
        !s.workspace.join("notes/a.txt").exists(),
        "nothing written before approval"
    );

    let (code, bad) = s
        .post(&format!("/sessions/{sid}/approvals/{rid}"), json!({}))
        .await;
    assert_eq!(
        (code, bad["error"]["code"].as_str()),
        (400, Some("invalid_argument"))
    );
    let (code, ok) = s
        .post(
            &format!("/sessions/{sid}/approvals/{rid}"),
            json!({"approve": true}),
        )
        .await;
    assert_eq!(
        (code, ok),
        (
            200,
            json!({"request_id": rid, "outcome": "approved", "persisted": false})
        )
    );
    let (code, again) = s
        .post(
            &format!("/sessions/{sid}/approvals/{rid}"),
            json!({"approve": false}),
        )
        .await;
    assert_eq!((code, again["error"]["code"].as_str()), (409, Some("conflict")));
    let (code, _) = s
        .post(
            &format!("/sessions/{sid}/approvals/ap_nope"),
            json!({"approve": true}),
        )
        .await;
    assert_eq!(code, 404);

    let frames = sse.until("approval_requested").await;
    assert_kinds(&frames[..2], &["approval_resolved", "tool_result"]);
    assert_eq!(frames[0].body()["outcome"], "approved");
    assert_eq!(frames[1].body()["ok"], true);
    assert_eq!(
        std::fs::read_to_string(s.workspace.join("notes/a.txt")).unwrap(),
        "hello there"
    );

    let rid2 = frames.last().unwrap().body()["request_id"]
        .as_str()
        .unwrap()
        .to_string();
    let (code, no) = s
        .post(
            &format!("/sessions/{sid}/approvals/{rid2}"),
            json!({"approve": false, "reason": "not now"}),
        )
        .await;
    assert_eq!((code, no["outcome"].as_str()), (200, Some("denied")));
    let frames = sse.until("run_finished").await;
    let result = frames.iter().find(|f| f.event == "tool_result").unwrap().body();
    assert_eq!(result["ok"], false);
    assert!(result["output"].as_str().unwrap().contains("not now"));
    assert!(!s.workspace.join("b.txt").exists());
}

#[tokio::test]
async fn a_pending_approval_expires_when_its_run_is_cancelled() {
    let s = TestServer::start().await;
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    s.run(&sid, "/bash echo hi > out.txt").await;
    let frames = sse.until("approval_requested").await;
    let rid = frames.last().unwrap().body()["request_id"]
        .as_str()
        .unwrap()
        .to_string();
    s.post(&format!("/sessions/{sid}/cancel"), json!({})).await;
    let frames = sse.until("run_finished").await;
    let resolved = frames.iter().find(|f| f.event == "approval_resolved").unwrap();
    assert_eq!(resolved.body()["outcome"], "expired");
    assert_eq!(resolved.body()["request_id"], rid.as_str());
    assert_eq!(frames.last().unwrap().body()["outcome"], "cancelled");
    let (code, _) = s
        .post(
            &format!("/sessions/{sid}/approvals/{rid}"),
            json!({"approve": true}),
        )
        .await;
    assert_eq!(code, 409, "an expired approval cannot be answered");
    assert!(!s.workspace.join("out.txt").exists());
}

#[tokio::test]
async fn tools_read_and_run_inside_the_workspace_only() {
    let s = TestServer::start_with(|c| c.core.permission = vak::core::PermissionMode::Allow).await;
    std::fs::write(s.workspace.join("a.txt"), "file body").unwrap();
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    s.run(
        &sid,
        "/read a.txt\n/read ../etc/passwd\n/read /etc/passwd\n/bash pwd; echo made > made.txt",
    )
    .await;
    let frames = sse.until("run_finished").await;
    let results: Vec<_> = frames
        .iter()
        .filter(|f| f.event == "tool_result")
        .map(|f| f.body().clone())
        .collect();
    assert_eq!(results.len(), 4);
    assert_eq!(
        (results[0]["ok"].clone(), results[0]["output"].clone()),
        (json!(true), json!("file body"))
    );
    for escaped in &results[1..3] {
        assert_eq!(escaped["ok"], false);
        assert!(!escaped["output"].as_str().unwrap().contains("root:"));
    }
    assert_eq!(results[3]["ok"], true);
    assert_eq!(
        std::fs::read_to_string(s.workspace.join("made.txt")).unwrap(),
        "made\n"
    );
    assert!(
        !frames.iter().any(|f| f.event == "approval_requested"),
        "allow mode asks nobody"
    );
}

#[tokio::test]
async fn a_failing_provider_fails_the_run_without_leaking_internal_events() {
    let s = TestServer::start().await;
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    s.run(&sid, "/think first\n/fail upstream exploded").await;
    let frames = sse.until("run_finished").await;
    let fin = frames.last().unwrap().body();
    assert_eq!(fin["outcome"], "failed");
    assert!(fin["message"].as_str().unwrap().contains("upstream exploded"));
    for f in &frames {
        assert!(KNOWN.contains(&f.event.as_str()), "internal event leaked: {f:?}");
    }
    // The retries' raw errors are invisible; each retry is a status with
    // `retrying` (the user's words, as the final message says them), and
    // each attempt that streamed something before failing is closed by a
    // fresh turn_started, so the thinking streamed once per attempt (1 + 4 retries).
    let count = |kind: &str| frames.iter().filter(|f| f.event == kind).count();
    assert_eq!(count("thinking_delta"), 5);
    assert_eq!(count("turn_started"), 5);
    let retrying: Vec<&serde_json::Value> = frames.iter().filter_map(|f| f.body().get("retrying")).collect();
    assert_eq!(retrying.len(), 4, "{retrying:?}");
    assert_eq!(
        (
            &retrying[3]["attempt"],
            &retrying[3]["of"],
            &retrying[3]["reason"]
        ),
        (
            &json!(4),
            &json!(4),
            &json!("the model failed: upstream exploded")
        )
    );
    let (_, t) = s.get(&format!("/sessions/{sid}/transcript")).await;
    let msgs = t["messages"].as_array().unwrap();
    let interrupted: Vec<_> = msgs.iter().map(|m| m["interrupted"] == true).collect();
    assert_eq!(
        interrupted,
        [false, true, true, true, true, false, false],
        "user, 4 interrupted attempts, the last attempt, run: {t}"
    );
}

#[tokio::test]
async fn transcripts_say_how_a_failed_or_cancelled_run_ended() {
    let s = TestServer::start().await;
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    s.run(&sid, "/fail upstream exploded").await;
    let failed = sse.until("run_finished").await.last().unwrap().body().clone();
    s.run(&sid, "/sleep 60000").await;
    sse.until("turn_started").await;
    s.post(&format!("/sessions/{sid}/cancel"), json!({})).await;
    let cancelled = sse.until("run_finished").await.last().unwrap().body().clone();
    s.run(&sid, "fine").await;
    sse.until("run_finished").await;

    let (_, t) = s.get(&format!("/sessions/{sid}/transcript")).await;
    let msgs = t["messages"].as_array().unwrap();
    let roles: Vec<&str> = msgs.iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["user", "run", "user", "run", "user", "assistant"], "{t}");
    assert_eq!(msgs[1]["outcome"], "failed");
    assert_eq!(msgs[1]["text"], failed["message"]);
    assert!(msgs[1]["text"].as_str().unwrap().contains("upstream exploded"));
    assert_eq!(msgs[3]["outcome"], "cancelled");
    assert_eq!(msgs[3]["text"], cancelled["message"]);
    let mut keys: Vec<&String> = msgs[1].as_object().unwrap().keys().collect();
    keys.sort();
    assert_eq!(keys, ["outcome", "role", "seq", "text"]);

    let (_, _, md) = s.get_text(&format!("/sessions/{sid}/transcript.md")).await;
    let failed_at = md.find("## Run failed").expect("the failure is in transcript.md");
    assert!(md[failed_at..].contains("upstream exploded"), "{md}");
    assert!(
        md.contains(&format!(
            "## Run cancelled\n\n{}",
            cancelled["message"].as_str().unwrap()
        )),
        "{md}"
    );
}

#[tokio::test]
async fn transcripts_list_and_markdown() {
    let s = TestServer::start_with(|c| c.core.permission = vak::core::PermissionMode::Allow).await;
    std::fs::write(s.workspace.join("x.md"), "X").unwrap();
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    s.run(&sid, "/think pondering\nhi there\n/read x.md").await;
    sse.until("run_finished").await;
    let (code, t) = s.get(&format!("/sessions/{sid}/transcript")).await;
    assert_eq!(code, 200);
    let roles: Vec<&str> = t["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["user", "assistant", "tool"]);
    // Each entry carries its role's fields and no empty others.
    let keys = |i: usize| -> Vec<String> {
        let mut k: Vec<String> = t["messages"][i].as_object().unwrap().keys().cloned().collect();
        k.sort();
        k
    };
    assert_eq!(
        keys(0),
        ["role", "seq", "text"],
        "a user message: {}",
        t["messages"][0]
    );
    assert_eq!(keys(1), ["role", "seq", "text", "thinking"]);
    assert_eq!(keys(2), ["call_id", "input", "ok", "role", "seq", "text", "tool"]);
    assert_eq!(t["messages"][1]["text"], "echo: hi there");
    assert_eq!(t["messages"][1]["thinking"], "pondering");
    assert_eq!(t["messages"][2]["text"], "X");
    assert!(t["usage"]["output_tokens"].as_u64().unwrap() > 0);
    let (_, list) = s.get("/sessions").await;
    assert_eq!(
        t["seq"], list["sessions"][0]["latest_seq"],
        "the transcript is exact as of the latest seq"
    );

    let md = s
        .http()
        .get(format!("{}/sessions/{sid}/transcript.md", s.url))
        .send()
        .await
        .unwrap();
    assert_eq!(md.status(), 200);
    assert!(md.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/markdown"));
    let md = md.text().await.unwrap();
    assert!(md.contains("echo: hi there") && md.contains("read_file"));

    let (code, list) = s.get("/sessions").await;
    assert_eq!(code, 200);
    let entry = &list["sessions"][0];
    assert_eq!(entry["session_id"], sid.as_str());
    assert_eq!(entry["title"], "/think pondering");
    assert!(entry["latest_seq"].as_u64().unwrap() > 5);
}

#[tokio::test]
async fn bad_requests_get_structured_errors() {
    let s = TestServer::start_with(|c| c.max_body = 64 * 1024).await;
    let sid = s.create_session().await;
    let h = s.http();
    let u = &s.url;

    for path in ["run", "events", "transcript", "transcript.md"] {
        let method = if path == "run" {
            reqwest::Method::POST
        } else {
            reqwest::Method::GET
        };
        let r = h
            .request(method, format!("{u}/sessions/nosuch/{path}"))
            .json(&json!({"prompt": "x"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 404, "{path}");
        let v: serde_json::Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], "not_found", "{path}");
        assert!(v["error"]["message"].as_str().unwrap().contains("nosuch"));
    }
    for (path, body) in [
        ("attach", json!({})),
        ("cancel", json!({})),
        ("steering", json!({"text": "x"})),
    ] {
        let (code, _) = s.post(&format!("/sessions/nosuch/{path}"), body).await;
        assert_eq!(code, 404, "{path}");
    }
    let r = h
        .post(format!("{u}/sessions/{sid}/run"))
        .body("{\"prompt\":")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let (code, e) = s.post(&format!("/sessions/{sid}/run"), json!({})).await;
    assert_eq!(
        (code, e["error"]["code"].as_str()),
        (400, Some("invalid_argument"))
    );
    let (code, _) = s
        .post(&format!("/sessions/{sid}/run"), json!({"prompt": 5}))
        .await;
    assert_eq!(code, 400);
    let (code, _) = s
        .post(
            &format!("/sessions/{sid}/run"),
            json!({"prompt": "x", "session_id": "other"}),
        )
        .await;
    assert_eq!(code, 400);
    let (code, _) = s
        .post("/sessions/..%2F..%2Fetc/run", json!({"prompt": "x"}))
        .await;
    assert_eq!(code, 400, "session ids are validated before touching the disk");

    let big = "x".repeat(100 * 1024);
    let (code, e) = s
        .post(&format!("/sessions/{sid}/run"), json!({"prompt": big}))
        .await;
    assert_eq!(
        (code, e["error"]["code"].as_str()),
        (413, Some("payload_too_large"))
    );

    for cursor in ["abc", "-1", "99999999999999999999999"] {
        let r = h
            .get(format!("{u}/sessions/{sid}/events"))
            .header("last-event-id", cursor)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "{cursor}");
    }
    let r = h
        .get(format!("{u}/sessions/{sid}/events?after=1x"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    // A malformed ?after= is refused also when a valid Last-Event-ID wins.
    let r = h
        .get(format!("{u}/sessions/{sid}/events?after=false"))
        .header("last-event-id", "0")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);

    let r = h.get(format!("{u}/no/such/route")).send().await.unwrap();
    assert_eq!(r.status(), 404);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "not_found");
    let r = h.delete(format!("{u}/sessions")).send().await.unwrap();
    assert_eq!(r.status(), 405);
}

#[tokio::test]
async fn auth_and_host_rules() {
    let s = TestServer::start().await;
    let plain = reqwest::Client::new();
    let r = plain.get(format!("{}/health", s.url)).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<serde_json::Value>().await.unwrap()["status"], "ok");
    let r = plain.head(format!("{}/health", s.url)).send().await.unwrap();
    assert_eq!(r.status(), 200, "HEAD /health needs no token either");
    let r = plain.post(format!("{}/health", s.url)).send().await.unwrap();
    assert_eq!(r.status(), 405, "a wrong method on /health is a 405, not a 401");
    let r = plain.get(format!("{}/sessions", s.url)).send().await.unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(
        r.json::<serde_json::Value>().await.unwrap()["error"]["code"],
        "unauthenticated"
    );
    let r = plain
        .get(format!("{}/sessions", s.url))
        .bearer_auth("wrong")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = plain
        .get(format!("{}/sessions", s.url))
        .bearer_auth(TOKEN)
        .header("host", "attacker.example:8901")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403, "DNS rebinding: a foreign Host is refused");
    let r = plain
        .get(format!("http://localhost:{}/sessions", s.addr.port()))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // The auth scheme is case-insensitive (RFC 9110), on REST and in /auth/session.
    for scheme in ["bearer", "BEARER", "Bearer"] {
        let r = plain
            .get(format!("{}/sessions", s.url))
            .header("authorization", format!("{scheme} {TOKEN}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{scheme}");
    }
    let r = plain
        .get(format!("{}/auth/session", s.url))
        .header("authorization", format!("bearer {TOKEN}"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.json::<serde_json::Value>().await.unwrap()["authenticated"],
        true
    );
}

#[tokio::test]
async fn unknown_query_parameters_are_refused_with_their_name() {
    let s = TestServer::start().await;
    let sid = s.create_session().await;
    let h = s.http();
    let status_and_message = |path: String| {
        let h = h.clone();
        let url = format!("{}{path}", s.url);
        async move {
            let r = h.get(url).send().await.unwrap();
            let status = r.status().as_u16();
            let body: serde_json::Value = r.json().await.unwrap_or_default();
            (
                status,
                body["error"]["message"].as_str().unwrap_or("").to_string(),
            )
        }
    };
    // The gRPC field name on the REST route: refused, not an empty stream.
    let (status, message) = status_and_message(format!("/stream?sessions={sid}")).await;
    assert_eq!(status, 400);
    assert!(message.contains("\"sessions\""), "names the parameter: {message}");
    for path in [
        "/sessions?limit=5".to_string(),
        format!("/sessions/{sid}/transcript?format=md"),
        format!("/sessions/{sid}/events?afterr=3"),
        "/health?verbose=1".to_string(),
    ] {
        let (status, message) = status_and_message(path.clone()).await;
        assert_eq!(status, 400, "{path}");
        assert!(message.contains("unknown query parameter"), "{path}: {message}");
    }
    // What a route reads is accepted, and so is the loopback token everywhere.
    let r = h
        .get(format!("{}/sessions/{sid}/transcript?token={TOKEN}", s.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let _stream = s
        .open_stream(&s.url, &format!("session={sid}&host=1"), None)
        .await;
    let mut events = Sse::new(
        h.get(format!("{}/sessions/{sid}/events?after=0", s.url))
            .send()
            .await
            .unwrap(),
    );
    assert_eq!(events.next().await.unwrap().event, "stream_opened");
}

#[tokio::test]
async fn a_failed_leg_ends_its_run_and_a_client_reacting_to_run_finished_starts_the_next() {
    let s = TestServer::start().await;
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    s.run(&sid, "/sleep 200\n/fail broken").await;
    sse.until("turn_started").await;
    let (_, q) = s
        .post(&format!("/sessions/{sid}/steering"), json!({"text": "after"}))
        .await;
    assert_eq!(q["state"], "queued");
    let first = sse.until("run_finished").await;
    let finished = first.last().unwrap().body();
    assert_eq!(finished["outcome"], "failed", "the failure is not hidden");
    assert!(
        finished["message"]
            .as_str()
            .unwrap()
            .ends_with("(1 queued input discarded)"),
        "{finished}"
    );
    let idle = &first[first.len() - 2];
    assert_eq!(
        (idle.event.as_str(), &idle.body()["busy"]),
        ("status", &json!(false))
    );
    // Reacting to run_finished: the session is idle, so the next run starts.
    let (_, again) = s.run(&sid, "again").await;
    assert_eq!(again["state"], "started");
    let second = sse.until("run_finished").await;
    assert_eq!(text_of(&second), "echo: again");
    let (_, t) = s.get(&format!("/sessions/{sid}/transcript")).await;
    assert!(
        !t.to_string().contains("\"after\""),
        "the discarded steering never ran: {t}"
    );
}

#[tokio::test]
async fn echoed_ids_are_plain_and_bounded() {
    let s = TestServer::start().await;
    let sid = s.create_session().await;
    for bad in ["r\u{202e}1", "a b", "x\ny", &"r".repeat(129)] {
        let (code, body) = s
            .post(
                &format!("/sessions/{sid}/run"),
                json!({"prompt": "hi", "request_id": bad}),
            )
            .await;
        assert_eq!(code, 400, "{bad:?}");
        assert!(
            !body.to_string().contains('\u{202e}'),
            "a bidi control is never echoed: {body}"
        );
    }
    for good in ["r1", "req_0f5a-1e00.fd:6c", &"r".repeat(128)] {
        let (code, _) = s
            .post(
                &format!("/sessions/{sid}/run"),
                json!({"prompt": "hi", "request_id": good}),
            )
            .await;
        assert_eq!(code, 202, "{good:?}");
    }
    // An approval id of 10 000 characters is refused, and not echoed whole.
    let long = "a".repeat(10_000);
    let (code, body) = s
        .post(
            &format!("/sessions/{sid}/approvals/{long}"),
            json!({"approve": true}),
        )
        .await;
    assert_eq!(code, 400);
    assert!(
        body.to_string().len() < 500,
        "{} bytes echoed",
        body.to_string().len()
    );
    let (code, _) = s
        .post(
            &format!("/sessions/{sid}/approvals/ap_nope"),
            json!({"approve": true}),
        )
        .await;
    assert_eq!(code, 404, "a well-formed unknown id is still a 404");
}

#[tokio::test]
async fn a_prompt_of_two_million_words_is_thousands_of_events_not_millions() {
    // The offline model honours the output limit: lift it past the echo.
    let s = TestServer::start_with(|c| c.core.max_output_tokens = u32::MAX).await;
    let sid = s.create_session().await;
    let prompt = "a ".repeat(1_900_000);
    let mut sse = s.events(&sid, None).await;
    let (code, _) = s
        .post(&format!("/sessions/{sid}/run"), json!({ "prompt": prompt }))
        .await;
    assert_eq!(code, 202);
    let frames = sse.until("run_finished").await;
    assert_eq!(frames.last().unwrap().body()["outcome"], "completed");
    let latest = frames.last().unwrap().seq();
    assert!(latest < 10_000, "{latest} events for one echo");
    assert_eq!(
        text_of(&frames),
        format!("echo: {}", prompt.trim_end()),
        "the whole text, once"
    );
    let ledger = std::fs::metadata(s.home.join(format!("sessions/{sid}.jsonl")))
        .unwrap()
        .len();
    assert!(ledger < 20 << 20, "a ledger of {ledger} bytes");
}

#[tokio::test]
async fn a_full_steering_queue_refuses_with_429_queue_full_and_frees_up() {
    let s = TestServer::start_with(|c| c.core.max_queued_inputs = 2).await;
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    s.run(&sid, "/sleep 60000").await;
    sse.until("turn_started").await;
    for i in 0..2 {
        let (code, body) = s
            .post(
                &format!("/sessions/{sid}/steering"),
                json!({"text": format!("q{i}")}),
            )
            .await;
        assert_eq!((code, body["state"].as_str()), (202, Some("queued")));
    }
    let (code, body) = s
        .post(
            &format!("/sessions/{sid}/steering"),
            json!({"text": "one too many", "request_id": "late"}),
        )
        .await;
    assert_eq!(code, 429, "{body}");
    assert_eq!(body["error"]["code"], "resource_exhausted");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("queue_full"),
        "{body}"
    );
    // The refused request id was not remembered: once the queue has room it is admitted.
    s.post(&format!("/sessions/{sid}/cancel"), json!({})).await;
    sse.until("run_finished").await;
    let (code, body) = s
        .post(
            &format!("/sessions/{sid}/steering"),
            json!({"text": "now", "request_id": "late"}),
        )
        .await;
    assert_eq!((code, body["state"].as_str()), (202, Some("started")), "{body}");
}

#[tokio::test]
async fn admission_says_where_to_subscribe_so_a_late_stream_misses_nothing() {
    // No first-subscriber grace: the run starts at once, before anyone watches.
    let s = TestServer::start_with(|c| c.core.first_subscriber_wait = std::time::Duration::ZERO).await;
    let sid = s.create_session().await;
    let (_, first) = s.run(&sid, "one").await;
    assert_eq!(first["after_seq"], 0, "a fresh session");
    let mut sse = s.events(&sid, Some(0)).await;
    let done = sse.until("run_finished").await.last().unwrap().seq();
    drop(sse);
    // Admitted while nobody watches; the stream opened afterwards with
    // after = after_seq sees the whole run from its first event.
    let (code, a) = s.run(&sid, "two words").await;
    assert_eq!((code, a["state"].as_str()), (202, Some("started")));
    let after = a["after_seq"].as_u64().expect("after_seq is a number");
    assert_eq!(after, done, "the seq just before this run's first event");
    let mut late = s.events(&sid, Some(after)).await;
    let frames = late.until("run_finished").await;
    assert_eq!(frames[0].seq(), after + 1);
    assert_eq!(frames[0].event, "status");
    assert_eq!(text_of(&frames), "echo: two words");
}
