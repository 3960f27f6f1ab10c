//! Learned skills against a real server (issue 35): a tool sequence run twice yields one proposal;
//! promoting it writes `.vak/skills/<name>.md` and makes `skill__<name>` a tool the model calls (a
//! script skill runs its commands; a `/<name>` prompt line is that call); a near-copy of a promoted skill carries `duplicate-of`; a person
//! can ask for a proposal from a session; settled proposals and taken names are 409s.

use crate::support::TestServer;
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use vak::core::PermissionMode;

async fn run(s: &TestServer, sid: &str, prompt: &str) -> Value {
    let (status, a) = s
        .post(
            &format!("/sessions/{sid}/run"),
            json!({"prompt": prompt, "wait": true}),
        )
        .await;
    assert_eq!(status, 200, "{a}");
    assert_eq!(a["result"]["outcome"], "completed", "{a}");
    a
}

/// The proposals once there are `n`, within a deadline (the server matches runs on a thread of its own).
async fn proposals(s: &TestServer, n: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, list) = s.get("/skills/proposals").await;
        assert_eq!(status, 200, "{list}");
        let got = list["proposals"].as_array().unwrap().clone();
        if got.len() >= n {
            return got;
        }
        assert!(
            Instant::now() < deadline,
            "{n} proposals within the deadline: {list}"
        );
        crate::support::poll::pause().await;
    }
}

#[tokio::test]
async fn a_repeated_tool_sequence_is_proposed_and_once_promoted_its_tool_runs() {
    let s = TestServer::start_with(|c| c.core.permission = PermissionMode::Bypass).await;
    let sid = s.create_session().await;
    let prompt = "/bash echo one\n/bash echo two";
    let first = run(&s, &sid, prompt).await;
    run(&s, &sid, "/bash echo something else").await;
    run(&s, &sid, prompt).await;
    let found = proposals(&s, 1).await;
    assert_eq!(found.len(), 1, "{found:?}");
    let p = &found[0];
    assert_eq!(p["kind"], "script");
    assert_eq!(p["body"], "echo one\necho two");
    assert_eq!(p["state"], "pending");
    assert_eq!(p["source"]["session"], sid.as_str());
    assert_eq!(p["tags"], json!([]));
    let id = p["id"].as_str().unwrap().to_string();

    let (status, skill) = s
        .post(
            &format!("/skills/proposals/{id}/promote"),
            json!({"name": "echo-twice"}),
        )
        .await;
    assert_eq!(status, 200, "{skill}");
    assert_eq!(skill["scope"], "workspace");
    let path = std::path::PathBuf::from(skill["path"].as_str().unwrap());
    assert!(path.ends_with(".vak/skills/echo-twice.md"), "{path:?}");
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(
        text.starts_with("---\nname: echo-twice\n")
            && text.contains("kind: script")
            && text.ends_with("echo one\necho two\n"),
        "{text}"
    );
    let (_, listed) = s.get("/skills").await;
    assert_eq!(listed["skills"][0]["name"], "echo-twice");
    // A session's skills are its workspace's (here the server's).
    let (status, of) = s.get(&format!("/skills?session_id={sid}")).await;
    assert_eq!((status, &of["skills"]), (200, &listed["skills"]), "{of}");
    assert_eq!(of["workspace"], listed["workspace"]);
    let (status, _) = s.get("/skills?session_id=nosuch").await;
    assert_eq!(status, 404);

    // The model can call it: a script skill runs its commands as one bash call.
    let ran = run(&s, &sid, "/call skill__echo-twice {}").await;
    assert_eq!(ran["result"]["answer"], "result: one\ntwo\n", "{ran}");
    // And a person types it as a slash command: `/echo-twice` is that call.
    let slash = run(&s, &sid, "/echo-twice").await;
    assert_eq!(slash["result"]["answer"], "result: one\ntwo\n", "{slash}");
    let (_, t) = s.get(&format!("/sessions/{sid}/transcript")).await;
    let last_call = t["messages"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|m| m["role"] == "tool")
        .unwrap();
    assert_eq!(last_call["tool"], "skill__echo-twice", "{last_call}");

    // A near-copy of it, asked for from the first run's messages, is screened as one.
    let range = json!({"from": first["after_seq"].as_u64().unwrap() + 1, "to": first["result"]["seq"]});
    let (status, near) = s
        .post(
            "/skills/proposals",
            json!({"from_session": sid, "seq_range": range}),
        )
        .await;
    assert_eq!(status, 201, "{near}");
    assert_eq!(near["duplicate_of"], "echo-twice", "{near}");
    assert_eq!(near["tags"], json!(["duplicate-of:echo-twice"]));
    let near_id = near["id"].as_str().unwrap();
    let (status, e) = s
        .post(
            &format!("/skills/proposals/{near_id}/promote"),
            json!({"name": "echo-twice"}),
        )
        .await;
    assert_eq!(status, 409, "{e}");
    assert_eq!(e["error"]["reason"], "skill_exists");
    // A body naming another proposal than the path is refused; naming the same one is fine.
    let (status, e) = s
        .post(
            &format!("/skills/proposals/{near_id}/reject"),
            json!({"id": "sp_000000000000"}),
        )
        .await;
    assert_eq!(status, 400, "{e}");
    assert_eq!(e["error"]["message"], "id in the body does not match the path");
    let (status, r) = s
        .post(
            &format!("/skills/proposals/{near_id}/reject"),
            json!({"id": near_id}),
        )
        .await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["state"], "rejected");

    // Settled proposals, unknown ids and bad input are clear errors.
    let (status, e) = s
        .post(&format!("/skills/proposals/{id}/promote"), json!({}))
        .await;
    assert_eq!(status, 409, "{e}");
    assert_eq!(e["error"]["reason"], "proposal_settled");
    let (status, _) = s
        .post("/skills/proposals/sp_000000000000/reject", json!({}))
        .await;
    assert_eq!(status, 404);
    let (status, _) = s.post("/skills/proposals/nope/reject", json!({})).await;
    assert_eq!(status, 400);
    let (status, _) = s
        .post("/skills/proposals", json!({"from_session": "nosuch"}))
        .await;
    assert_eq!(status, 404);
    let (status, e) = s
        .post(
            "/skills/proposals",
            json!({"from_session": sid, "name": "Not A Name"}),
        )
        .await;
    assert_eq!(status, 400, "{e}");
    let (status, e) = s
        .post(
            "/skills/proposals",
            json!({"from_session": sid, "seq_range": {"from": 9, "to": 3}}),
        )
        .await;
    assert_eq!(status, 400, "{e}");
}

#[tokio::test]
async fn a_prompt_skill_answers_its_instructions_and_proposals_survive_a_restart() {
    let s = TestServer::start().await;
    let sid = s.create_session().await;
    run(&s, &sid, "summarise the open issues").await;
    run(&s, &sid, "summarise the open issues").await;
    let found = proposals(&s, 1).await;
    assert_eq!(found[0]["kind"], "prompt");
    assert_eq!(found[0]["name"], "summarise-the-open-issues");
    let id = found[0]["id"].as_str().unwrap().to_string();
    let (home, ws) = s.stop().await.unwrap();
    let s = TestServer::start_in(home.path(), ws.path(), |_| {}).await;
    let kept = proposals(&s, 1).await;
    assert_eq!(kept[0]["id"], id.as_str(), "kept across the restart");
    let (status, skill) = s
        .post(
            &format!("/skills/proposals/{id}/promote"),
            json!({"scope": "global"}),
        )
        .await;
    assert_eq!(status, 200, "{skill}");
    assert!(home.path().join("skills/summarise-the-open-issues.md").exists());
    // A prompt skill reads: it runs without asking, even in the default mode.
    let ran = run(
        &s,
        &sid,
        "/call skill__summarise-the-open-issues {\"arguments\": \"this week\"}",
    )
    .await;
    assert_eq!(
        ran["result"]["answer"],
        "result: skill summarise-the-open-issues:\nsummarise the open issues\n\narguments: this week"
    );
}
