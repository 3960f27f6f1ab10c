//! Always-allow rules as a user meets them: `{approve: true, always: true}`
//! stores a rule (kept per workspace in the home, so a restart keeps it),
//! later calls it covers run without asking and others still ask, compound
//! commands are never generalised, plan mode still refuses, rules are listed
//! and deleted over REST and gRPC, and a rule that cannot be stored answers
//! `persisted: false` with a notice event while the approval still counts.

use crate::support::{Frame, SecondWorkspace, Sse, TestServer};
use serde_json::{json, Value};
use vak::core::PermissionMode;
use vak::proto::v1 as pb;

/// What one run did: the approvals it asked (and the answers' bodies), its frames.
struct Ran {
    asked: Vec<Value>,
    answers: Vec<(u16, Value)>,
    frames: Vec<Frame>,
}

impl Ran {
    fn results(&self) -> Vec<&Value> {
        self.frames
            .iter()
            .filter(|f| f.event == "tool_result")
            .map(|f| f.body())
            .collect()
    }

    fn of(&self, kind: &str) -> Vec<&Value> {
        self.frames
            .iter()
            .filter(|f| f.event == kind)
            .map(|f| f.body())
            .collect()
    }
}

/// Runs `prompt` in session `sid` to its run_finished, answering every
/// approval with `answer`.
async fn run_answering(s: &TestServer, sid: &str, sse: &mut Sse, prompt: &str, answer: Value) -> Ran {
    assert_eq!(s.run(sid, prompt).await.0, 202);
    let mut ran = Ran {
        asked: Vec::new(),
        answers: Vec::new(),
        frames: Vec::new(),
    };
    loop {
        let f = sse.next().await.expect("the stream goes on until run_finished");
        if f.event == "approval_requested" {
            let body = f.body().clone();
            let rid = body["request_id"].as_str().unwrap();
            let a = s
                .post(&format!("/sessions/{sid}/approvals/{rid}"), answer.clone())
                .await;
            ran.asked.push(body);
            ran.answers.push(a);
        }
        let done = f.event == "run_finished";
        ran.frames.push(f);
        if done {
            return ran;
        }
    }
}

/// How many approvals running `prompt` asks (each denied).
async fn asks(s: &TestServer, sid: &str, sse: &mut Sse, prompt: &str) -> usize {
    let ran = run_answering(s, sid, sse, prompt, json!({"approve": false})).await;
    ran.asked.len()
}

fn always() -> Value {
    json!({"approve": true, "always": true})
}

fn once() -> Value {
    json!({"approve": true})
}

async fn rules(s: &TestServer) -> Vec<Value> {
    let (code, v) = s.get("/permissions/rules").await;
    assert_eq!(code, 200, "{v}");
    v["rules"].as_array().unwrap().clone()
}

#[tokio::test]
async fn an_always_rule_runs_matching_calls_without_asking_and_survives_a_restart() {
    let s = TestServer::start().await;
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;

    let ran = run_answering(&s, &sid, &mut sse, "/bash ls", always()).await;
    assert_eq!(ran.asked.len(), 1);
    let (code, v) = &ran.answers[0];
    assert_eq!(*code, 200, "{v}");
    assert_eq!(
        (&v["outcome"], &v["persisted"]),
        (&json!("approved"), &json!(true)),
        "{v}"
    );
    let rule = &v["rule"];
    assert_eq!(
        (&rule["tool"], &rule["kind"], &rule["pattern"]),
        (&json!("bash"), &json!("prefix"), &json!("ls")),
        "{v}"
    );
    assert!(rule["id"].as_str().unwrap().starts_with("rule_"));
    assert!(rule["created_at"].as_str().unwrap().ends_with('Z'));
    assert_eq!(ran.results()[0]["ok"], true);

    // A call the rule covers (the program and plain words) runs without
    // asking; others still ask, an option or a path included.
    std::fs::write(s.workspace.join("seen.txt"), "x").unwrap();
    let ran = run_answering(&s, &sid, &mut sse, "/bash ls seen.txt\n/bash ls", once()).await;
    assert!(ran.asked.is_empty(), "{:?}", ran.asked);
    assert!(ran.results().iter().all(|r| r["ok"] == true));
    let ran = run_answering(
        &s,
        &sid,
        &mut sse,
        "/bash echo hi\n/bash lsblk\n/bash ls -a\n/bash ls /",
        once(),
    )
    .await;
    assert_eq!(
        ran.asked.len(),
        4,
        "another program asks, ls is a word, not a prefix, and an option or a path is not a plain word"
    );

    // A file tool's rule is its path, normalised.
    let ran = run_answering(&s, &sid, &mut sse, "/write ./notes/a.txt one", always()).await;
    assert_eq!(ran.answers[0].1["rule"]["pattern"], "notes/a.txt");
    assert_eq!(ran.answers[0].1["rule"]["kind"], "path");
    let ran = run_answering(&s, &sid, &mut sse, "/write notes/a.txt two", once()).await;
    assert!(ran.asked.is_empty());
    let ran = run_answering(&s, &sid, &mut sse, "/write notes/b.txt three", once()).await;
    assert_eq!(ran.asked.len(), 1);
    assert_eq!(rules(&s).await.len(), 2);
    let (_, v) = s.get("/permissions/rules").await;
    assert_eq!(v["max_rules"], 256);
    let ws = std::fs::canonicalize(&s.workspace).unwrap();
    assert_eq!(v["workspace"], ws.display().to_string());

    // The rules live in the home: a restart finds them.
    let before = rules(&s).await;
    let (home, ws) = s.stop().await.unwrap();
    let s = TestServer::start_in(home.path(), ws.path(), |_| {}).await;
    assert_eq!(rules(&s).await, before);
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    let ran = run_answering(
        &s,
        &sid,
        &mut sse,
        "/bash ls seen.txt\n/write notes/a.txt four",
        once(),
    )
    .await;
    assert!(ran.asked.is_empty(), "{:?}", ran.asked);
    assert_eq!(
        std::fs::read_to_string(ws.path().join("notes/a.txt")).unwrap(),
        "four"
    );

    // Plan mode refuses what a rule covers; accept-edits still runs it.
    assert_eq!(s.post("/config/mode", json!({"mode": "plan"})).await.0, 200);
    let ran = run_answering(&s, &sid, &mut sse, "/bash ls\n/write notes/a.txt five", once()).await;
    assert!(ran.asked.is_empty());
    for r in ran.results() {
        assert_eq!(r["ok"], false, "{r}");
        assert!(r["output"].as_str().unwrap().contains("plan mode"), "{r}");
    }
    assert_eq!(
        std::fs::read_to_string(ws.path().join("notes/a.txt")).unwrap(),
        "four"
    );
    assert_eq!(
        s.post("/config/mode", json!({"mode": "accept-edits"})).await.0,
        200
    );
    let ran = run_answering(&s, &sid, &mut sse, "/bash ls", once()).await;
    assert!(ran.asked.is_empty() && ran.results()[0]["ok"] == true);
    drop(s);
    drop((home, ws));
}

#[tokio::test]
async fn compound_commands_are_never_generalised() {
    let s = TestServer::start().await;
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    for cmd in ["ls && echo hi", "FOO=1 ls", "ls | wc -l", "bash -c ls"] {
        let ran = run_answering(&s, &sid, &mut sse, &format!("/bash {cmd}"), always()).await;
        let v = &ran.answers[0].1;
        assert_eq!(
            (&v["rule"]["kind"], &v["rule"]["pattern"]),
            (&json!("exact"), &json!(cmd)),
            "{v}"
        );
    }
    // Only the same command line runs unasked: not its program, not a longer line.
    let ran = run_answering(&s, &sid, &mut sse, "/bash ls && echo hi", once()).await;
    assert!(ran.asked.is_empty());
    for cmd in ["ls", "ls && echo hi && rm -rf x", "ls; echo hi", "bash -c 'rm x'"] {
        assert_eq!(
            asks(&s, &sid, &mut sse, &format!("/bash {cmd}")).await,
            1,
            "{cmd}"
        );
    }
    // Nor does a prefix rule cover a compound command that starts like it.
    let ran = run_answering(&s, &sid, &mut sse, "/bash cat x", always()).await;
    assert_eq!(ran.answers[0].1["rule"]["kind"], "prefix");
    assert_eq!(asks(&s, &sid, &mut sse, "/bash cat x; rm -rf y").await, 1);
}

/// The bypasses an audit found: `always` on the first command stored a
/// prefix rule that then let the second (which writes a file outside the
/// workspace or runs code) run unasked. Now each still asks, and the
/// approved command itself still runs unasked.
#[tokio::test]
async fn a_rule_never_covers_options_that_write_files_or_run_code() {
    let s = TestServer::start().await;
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    let outside = tempfile::tempdir().unwrap();
    let file = outside.path().join("written");
    let file = file.display();
    for (approved, kind, bypasses) in [
        (
            "git log --oneline",
            "exact",
            vec![format!("git log --output={file} --format=x")],
        ),
        (
            "curl -s http://127.0.0.1:9/",
            "exact",
            vec![format!("curl -o {file} http://127.0.0.1:9/")],
        ),
        (
            "tar -tf x.tar",
            "exact",
            vec!["tar -xf x.tar --to-command=sh".to_string()],
        ),
        ("busybox sh -c ls", "exact", vec!["busybox sh -c id".to_string()]),
        (
            "cargo test",
            "prefix",
            vec![
                "cargo test --config=build.rustc-wrapper=x".to_string(),
                "cargo test --manifest-path=/etc/x".to_string(),
            ],
        ),
    ] {
        let ran = run_answering(&s, &sid, &mut sse, &format!("/bash {approved}"), always()).await;
        let v = &ran.answers[0].1;
        assert_eq!(
            (&v["rule"]["kind"], &v["rule"]["pattern"]),
            (&json!(kind), &json!(approved)),
            "{v}"
        );
        assert_eq!(asks(&s, &sid, &mut sse, &format!("/bash {approved}")).await, 0);
        for b in bypasses {
            assert_eq!(
                asks(&s, &sid, &mut sse, &format!("/bash {b}")).await,
                1,
                "always on `{approved}` covered `{b}`"
            );
        }
    }
    assert!(!outside.path().join("written").exists());
}

#[tokio::test]
async fn always_answers_only_approvals_of_calls_a_rule_can_cover() {
    let s = TestServer::start_with(|c| c.core.permission = PermissionMode::Plan).await;
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    s.run(&sid, "/plan 1. nothing").await;
    let ask = sse.next_ask().await;
    let rid = ask["request_id"].as_str().unwrap();
    let path = format!("/sessions/{sid}/approvals/{rid}");
    let (code, v) = s.post(&path, always()).await;
    assert_eq!(code, 400, "{v}");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("a plan is approved once"));
    let (code, v) = s.post(&path, json!({"approve": false, "always": true})).await;
    assert_eq!(code, 400, "{v}");
    // Still pending: a plain answer settles it.
    let (code, v) = s.post(&path, once()).await;
    assert_eq!(
        (code, &v["persisted"], &v["rule"]),
        (200, &json!(false), &Value::Null),
        "{v}"
    );
    sse.until("run_finished").await;
    assert!(rules(&s).await.is_empty());
}

#[tokio::test]
async fn rules_are_listed_and_deleted_over_rest_and_grpc() {
    let s = TestServer::start().await;
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    run_answering(&s, &sid, &mut sse, "/bash cargo-ish test lib", always()).await;

    // gRPC: Approve with always, ListRules.
    let mut grpc = s.grpc().await;
    s.run(&sid, "/write g.txt G").await;
    let ask = sse.next_ask().await;
    let r = grpc
        .approve(pb::ApproveRequest {
            session_id: sid.clone(),
            request_id: ask["request_id"].as_str().unwrap().into(),
            approve: Some(true),
            reason: String::new(),
            mode: None,
            always: Some(true),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(r.persisted);
    let write_rule = r.rule.unwrap();
    assert_eq!(
        (write_rule.tool.as_str(), write_rule.pattern.as_str()),
        ("write_file", "g.txt")
    );
    sse.until("run_finished").await;
    let listed = grpc
        .list_rules(pb::ListRulesRequest { workspace: None })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.rules.len(), 2);
    assert_eq!(listed.max_rules, 256);
    assert_eq!(listed.rules[0].pattern, "cargo-ish test");
    assert_eq!(listed.rules[1], write_rule);

    // REST delete: the rule deleted, then 404 with the structured error.
    let id = listed.rules[0].id.clone();
    let (code, v) = s.delete(&format!("/permissions/rules/{id}")).await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["rule"]["id"], id.as_str());
    let (code, v) = s.delete(&format!("/permissions/rules/{id}")).await;
    assert_eq!(code, 404, "{v}");
    assert_eq!(v["error"]["code"], "not_found");
    assert!(v["error"]["message"].as_str().unwrap().contains(&id));
    let (code, v) = s.delete("/permissions/rules/not.an.id").await;
    assert_eq!(
        (code, v["error"]["code"].as_str()),
        (400, Some("invalid_argument"))
    );
    // The deleted rule no longer applies.
    assert_eq!(asks(&s, &sid, &mut sse, "/bash cargo-ish test").await, 1);

    // gRPC delete: the same table.
    let gone = grpc
        .delete_rule(pb::DeleteRuleRequest {
            id: write_rule.id.clone(),
            workspace: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(gone.rule.unwrap().id, write_rule.id);
    let e = grpc
        .delete_rule(pb::DeleteRuleRequest {
            id: write_rule.id,
            workspace: None,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
    assert!(rules(&s).await.is_empty());
}

#[tokio::test]
async fn a_rule_that_cannot_be_stored_answers_persisted_false_with_a_notice() {
    let (home, ws) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    // Where the rules file would go is a file: nothing can be stored under it.
    std::fs::write(home.path().join("permissions"), "in the way").unwrap();
    let s = TestServer::start_in(home.path(), ws.path(), |_| {}).await;
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    let mut watcher = s.events(&sid, None).await;
    let ran = run_answering(&s, &sid, &mut sse, "/bash ls -la", always()).await;
    let (code, v) = &ran.answers[0];
    assert_eq!(*code, 200, "{v}");
    assert_eq!(
        (&v["outcome"], &v["persisted"], &v["rule"]),
        (&json!("approved"), &json!(false), &Value::Null),
        "{v}"
    );
    // The approval counted: the command ran.
    assert_eq!(ran.results()[0]["ok"], true);
    // Every client of the session is told, without the server's paths.
    let notices = ran.of("notice");
    assert_eq!(notices.len(), 1, "{:?}", ran.frames);
    assert_eq!(notices[0]["level"], "warning");
    let text = notices[0]["text"].as_str().unwrap();
    assert!(
        text.contains("approved once") && text.contains("bash `ls -la`") && text.contains("not saved"),
        "{text}"
    );
    assert!(!text.contains(home.path().to_str().unwrap()), "{text}");
    let seen = watcher.until("notice").await.pop().unwrap();
    assert_eq!(seen.body()["text"], text);
    // The notice is not part of the conversation.
    let (_, t) = s.get(&format!("/sessions/{sid}/transcript")).await;
    assert!(!t.to_string().contains("not saved"), "{t}");
    let (_, p) = s.get(&format!("/sessions/{sid}/presentation")).await;
    assert!(!p.to_string().contains("not saved"), "{p}");
    // Nothing was stored: the next call asks again.
    assert!(rules(&s).await.is_empty());
    let ran = run_answering(&s, &sid, &mut sse, "/bash ls", once()).await;
    assert_eq!(ran.asked.len(), 1);

    // Once the way is clear, storing works again.
    std::fs::remove_file(home.path().join("permissions")).unwrap();
    let ran = run_answering(&s, &sid, &mut sse, "/bash ls -a", always()).await;
    assert_eq!(ran.answers[0].1["persisted"], true);
    assert!(ran.of("notice").is_empty());
}

/// `workspace` as a query value.
fn q(v: &str) -> String {
    v.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[tokio::test]
async fn the_rules_of_every_opened_workspace_are_listed_and_deleted() {
    let SecondWorkspace {
        s, root, other, sid, ..
    } = TestServer::with_second_workspace(|_| {}).await;
    let mut sse = s.events(&sid, None).await;
    let ran = run_answering(&s, &sid, &mut sse, "/bash ls", always()).await;
    let rule = ran.answers[0].1["rule"].clone();
    assert_eq!(rule["pattern"], "ls", "{rule}");
    let id = rule["id"].as_str().unwrap().to_string();

    // Listed under its workspace, not the server's own.
    let (code, v) = s
        .get(&format!("/permissions/rules?workspace={}", q(&other)))
        .await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["workspace"], other.as_str());
    assert_eq!(v["rules"], json!([rule]));
    assert!(rules(&s).await.is_empty());
    let (_, v) = s.get("/permissions/rules").await;
    assert_eq!(v["workspace"], root.join("main").display().to_string());
    let main = root.join("main").display().to_string();
    let (code, v) = s.get(&format!("/permissions/rules?workspace={}", q(&main))).await;
    assert_eq!((code, &v["rules"]), (200, &json!([])), "{v}");
    // Over gRPC the same.
    let mut grpc = s.grpc().await;
    let listed = grpc
        .list_rules(pb::ListRulesRequest {
            workspace: Some(other.clone()),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (listed.workspace.as_str(), listed.rules.len()),
        (other.as_str(), 1)
    );

    // A workspace that is not open is 404 with its reason; an empty one 400.
    let elsewhere = root.join("never-opened").display().to_string();
    std::fs::create_dir_all(&elsewhere).unwrap();
    for path in [
        format!("/permissions/rules?workspace={}", q(&elsewhere)),
        "/permissions/rules?workspace=relative".to_string(),
    ] {
        let (code, v) = s.get(&path).await;
        assert_eq!(
            (code, v["error"]["code"].as_str(), v["error"]["reason"].as_str()),
            (404, Some("not_found"), Some("workspace_not_open")),
            "{v}"
        );
    }
    let (code, v) = s
        .delete(&format!("/permissions/rules/{id}?workspace={}", q(&elsewhere)))
        .await;
    assert_eq!(
        (code, v["error"]["reason"].as_str()),
        (404, Some("workspace_not_open")),
        "{v}"
    );
    let (code, v) = s.get("/permissions/rules?workspace=").await;
    assert_eq!(
        (code, v["error"]["code"].as_str()),
        (400, Some("invalid_argument")),
        "{v}"
    );
    let e = grpc
        .list_rules(pb::ListRulesRequest {
            workspace: Some(elsewhere.clone()),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);

    // The server's own workspace has no such rule; the other's deletes it.
    let (code, v) = s.delete(&format!("/permissions/rules/{id}")).await;
    assert_eq!(code, 404, "{v}");
    let (code, v) = s
        .delete(&format!("/permissions/rules/{id}?workspace={}", q(&other)))
        .await;
    assert_eq!((code, &v["rule"]), (200, &rule), "{v}");
    let (_, v) = s
        .get(&format!("/permissions/rules?workspace={}", q(&other)))
        .await;
    assert_eq!(v["rules"], json!([]));
    // Gone for good: the session there asks again.
    assert_eq!(asks(&s, &sid, &mut sse, "/bash ls").await, 1);
}
