//! Commitments against a real server (issue 35): the offline model's `/plan-items` calls update_plan,
//! each item becomes a commitment (a `commitment` event, a plan item in the presentation, a row of
//! GET /commitments); closing one as fulfilled without the evidence it requires is 409
//! `evidence_missing` naming what is missing, and with a successful `/bash` run it cites is 200;
//! abandoned always closes; priorities rank with reasons while the rows keep their order; the
//! listing survives a restart, also when its file is gone (rebuilt from the ledgers).

use crate::support::TestServer;
use serde_json::{json, Value};
use vak::core::PermissionMode;
use vak::proto::v1 as pb;

fn reason(e: &Value) -> &str {
    e["error"]["reason"].as_str().unwrap_or("")
}

/// Runs `prompt` in `sid` to its end; returns the `commitment` frames' bodies and the tool results.
async fn run(s: &TestServer, sid: &str, prompt: &str) -> (Vec<Value>, Vec<Value>) {
    let mut sse = s.events(sid, Some(s.latest_seq(sid).await)).await;
    let (status, a) = s.run(sid, prompt).await;
    assert_eq!(status, 202, "{a}");
    let frames = sse.until("run_finished").await;
    let of = |kind: &str| {
        frames
            .iter()
            .filter(|f| f.event == kind)
            .map(|f| f.body().clone())
            .collect::<Vec<_>>()
    };
    (of("commitment"), of("tool_result"))
}

fn ids(rows: &Value) -> Vec<String> {
    rows.as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap().to_string())
        .collect()
}

const PLAN: &str = r#"/plan-items [{"id": "tests", "text": "run the tests", "status": "pending", "requires": [{"kind": "tool_ok", "tool": "bash", "pattern": "^echo ok"}]}, {"id": "notes", "text": "write release notes", "status": "pending"}]"#;

#[tokio::test]
async fn plan_items_become_commitments_and_fulfilled_needs_the_cited_evidence() {
    let s = TestServer::start_with(|c| c.core.permission = PermissionMode::Bypass).await;
    let sid = s.create_session().await;
    let (made, results) = run(&s, &sid, PLAN).await;
    assert!(results.iter().all(|r| r["ok"] == true), "{results:?}");
    let changes: Vec<(&str, &str)> = made
        .iter()
        .map(|m| {
            (
                m["change"].as_str().unwrap(),
                m["commitment"]["item"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(changes, [("created", "tests"), ("created", "notes")]);
    let tests_id = format!("{sid}.tests");
    assert_eq!(made[0]["commitment"]["id"], tests_id.as_str());
    assert_eq!(made[0]["commitment"]["status"], "pending");
    assert_eq!(made[0]["commitment"]["requires"][0]["kind"], "tool_ok");

    let (status, list) = s.get("/commitments").await;
    assert_eq!(status, 200, "{list}");
    assert_eq!(
        ids(&list["commitments"]),
        [tests_id.clone(), format!("{sid}.notes")]
    );
    assert_eq!(list["priorities"].as_array().unwrap().len(), 2);

    // Fulfilled without the evidence: 409, naming the missing piece.
    let close = |id: &str| format!("/commitments/{id}/close");
    // A body naming another commitment than the path: 400, nothing closed.
    let (status, e) = s
        .post(&close(&tests_id), json!({"id": "x.y", "verdict": "abandoned"}))
        .await;
    assert_eq!(
        (status, &e["error"]["code"]),
        (400, &json!("invalid_argument")),
        "{e}"
    );
    let (status, e) = s.post(&close(&tests_id), json!({"verdict": "fulfilled"})).await;
    assert_eq!(status, 409, "{e}");
    assert_eq!(reason(&e), "evidence_missing", "{e}");
    let message = e["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("tool_ok") && message.contains("^echo ok") && message.contains("`bash`"),
        "{message}"
    );
    // A run that fails does not count; the item cites it all the same.
    let (_, results) = run(
        &s,
        &sid,
        "/bash echo ok; exit 3\n/plan-items [{\"id\": \"tests\", \"status\": \"in_progress\", \"evidence\": [\"$last\"]}]",
    )
    .await;
    assert_eq!(results[0]["ok"], false);
    let (status, e) = s.post(&close(&tests_id), json!({"verdict": "fulfilled"})).await;
    assert_eq!(status, 409, "{e}");
    assert!(e["error"]["message"].as_str().unwrap().contains("failed"), "{e}");
    // A successful run the item cites: 200.
    let (made, results) = run(
        &s,
        &sid,
        "/bash echo ok\n/plan-items [{\"id\": \"tests\", \"status\": \"done\", \"evidence\": [\"$last\"]}]",
    )
    .await;
    assert_eq!(results[0]["ok"], true, "{results:?}");
    assert_eq!(made[0]["change"], "updated");
    assert_eq!(made[0]["commitment"]["evidence"].as_array().unwrap().len(), 2);
    let (status, detail) = s.get(&format!("/commitments/{tests_id}")).await;
    assert_eq!(status, 200, "{detail}");
    assert_eq!(detail["missing"], json!([]), "a fulfilled close would pass now");
    let (status, closed) = s
        .post(
            &close(&tests_id),
            json!({"verdict": "fulfilled", "note": "green"}),
        )
        .await;
    assert_eq!(status, 200, "{closed}");
    assert_eq!(closed["closed"]["verdict"], "fulfilled");
    assert_eq!(closed["closed"]["note"], "green");
    // Abandoned always closes; a closed commitment is not closed again.
    let notes_id = format!("{sid}.notes");
    let (status, c) = s.post(&close(&notes_id), json!({"verdict": "abandoned"})).await;
    assert_eq!(status, 200, "{c}");
    let (status, e) = s.post(&close(&notes_id), json!({"verdict": "superseded"})).await;
    assert_eq!(status, 409, "{e}");
    assert_eq!(reason(&e), "already_closed");
    // And the model cannot change it any more.
    let (_, results) = run(
        &s,
        &sid,
        "/plan-items [{\"id\": \"notes\", \"status\": \"in_progress\"}]",
    )
    .await;
    assert_eq!(results[0]["ok"], false);
    assert!(
        results[0]["output"]
            .as_str()
            .unwrap()
            .contains("closed as abandoned"),
        "{results:?}"
    );

    // Its events, as the ledger holds them.
    let (_, detail) = s.get(&format!("/commitments/{tests_id}")).await;
    let changes: Vec<&str> = detail["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["change"].as_str().unwrap())
        .collect();
    assert_eq!(changes, ["created", "updated", "updated", "closed"]);
    assert!(detail["events"][0]["seq"].as_u64().unwrap() > 0);

    // The presentation shows each as a plan item with its status.
    let (_, timeline) = s.get(&format!("/sessions/{sid}/presentation")).await;
    let plan: Vec<(String, String)> = timeline["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["kind"] == "plan_item")
        .map(|i| {
            (
                i["id"].as_str().unwrap().into(),
                i["status"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(
        plan,
        [
            ("plan-tests".to_string(), "completed".to_string()),
            ("plan-notes".to_string(), "cancelled".to_string())
        ]
    );

    // Bad requests are clear errors.
    let (status, _) = s.get("/commitments/no-dot").await;
    assert_eq!(status, 400);
    let (status, _) = s.get(&format!("/commitments/{sid}.ghost")).await;
    assert_eq!(status, 404);
    let (status, e) = s
        .post(&close(&format!("{sid}.ghost")), json!({"verdict": "abandoned"}))
        .await;
    assert_eq!(status, 404, "{e}");
    let (status, e) = s.post(&close(&tests_id), json!({})).await;
    assert_eq!(status, 400, "{e}");
    let (status, _) = s.post(&close(&tests_id), json!({"verdict": "maybe"})).await;
    assert_eq!(status, 400);
    let (status, e) = s.get("/commitments?all=perhaps").await;
    assert_eq!(status, 400);
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("all must be true or false"),
        "{e}"
    );
    let (status, every) = s.get("/commitments?all=true").await;
    assert_eq!(status, 200, "{every}");
    assert_eq!(every["commitments"].as_array().unwrap().len(), 2);
    assert_eq!(every["workspace"], "");

    // gRPC answers the same.
    let mut g = s.grpc().await;
    let listed = g
        .list_commitments(pb::ListCommitmentsRequest { all: true })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.commitments.len(), 2);
    assert!(
        listed.priorities.is_empty(),
        "both are closed: nothing left to rank"
    );

    // A restart keeps the listing; without its file it is rebuilt from the ledgers.
    let (home, ws) = s.stop().await.unwrap();
    let file = home.path().join("sessions").join("commitments.json");
    assert!(file.exists());
    for round in 0..2 {
        if round == 1 {
            std::fs::remove_file(&file).unwrap();
        }
        let s = TestServer::start_in(home.path(), ws.path(), |_| {}).await;
        let (_, list) = s.get("/commitments").await;
        let verdicts: Vec<&str> = list["commitments"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["closed"]["verdict"].as_str().unwrap_or("open"))
            .collect();
        assert_eq!(verdicts, ["fulfilled", "abandoned"], "round {round}: {list}");
        s.stop().await;
    }
    drop((home, ws));
}

#[tokio::test]
async fn priorities_rank_with_reasons_while_the_rows_keep_their_order() {
    let s = TestServer::start().await;
    let sid = s.create_session().await;
    let plan = json!([
        {"id": "docs", "text": "fix a typo in the docs", "status": "pending"},
        {"id": "deploy", "text": "deploy the release", "status": "pending", "blocked_by": ["wipe"]},
        {"id": "wipe", "text": "delete the build folder", "status": "in_progress", "due": "2020-01-01T00:00:00Z"},
        {"id": "tests", "text": "add a test", "status": "pending"}
    ]);
    let (made, _) = run(&s, &sid, &format!("/plan-items {plan}")).await;
    assert_eq!(made.len(), 4);
    assert_eq!(
        made[2]["commitment"]["stakes"], "high",
        "read from the text: delete"
    );
    let (_, list) = s.get("/commitments").await;
    let rows = ids(&list["commitments"]);
    assert_eq!(
        rows,
        ["docs", "deploy", "wipe", "tests"].map(|i| format!("{sid}.{i}")),
        "rows keep their natural order"
    );
    let ranked = ids(&list["priorities"]);
    assert_eq!(
        ranked,
        ["wipe", "tests", "docs", "deploy"].map(|i| format!("{sid}.{i}"))
    );
    let reasons = |n: usize| -> Vec<String> {
        list["priorities"][n]["reasons"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r.as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(
        reasons(0),
        ["stakes: high (+30)", "due: overdue (+40)", "in progress (+5)"]
    );
    assert_eq!(list["priorities"][0]["score"], 75);
    assert_eq!(reasons(3), ["stakes: high (+30)", "blocked by wipe (-100)"]);
    // A bad item is the tool's error; nothing changes.
    let (made, results) = run(
        &s,
        &sid,
        "/plan-items [{\"id\": \"x\", \"status\": \"soon\", \"text\": \"t\"}]",
    )
    .await;
    assert!(made.is_empty());
    assert_eq!(results[0]["ok"], false);
    assert!(
        results[0]["output"].as_str().unwrap().contains("\"soon\""),
        "{results:?}"
    );
}
