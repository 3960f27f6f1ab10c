//! The goal of a turn chain against a real server (issue 35): the first prompt sets the objective;
//! steering into the live chain is read as goal updates ("also add a README" adds, "pause" holds
//! the next leg until "resume", "stop" cancels through the run's own cancel); a steering that asks
//! for bypass mode is recorded, not applied; the presentation carries the goal state, live and
//! after a restart.

use crate::support::{Frame, TestServer};
use serde_json::{json, Value};

async fn steer(s: &TestServer, sid: &str, text: &str) -> String {
    let (status, a) = s
        .post(&format!("/sessions/{sid}/steering"), json!({ "text": text }))
        .await;
    assert_eq!(status, 202, "{a}");
    a["state"].as_str().unwrap().to_string()
}

fn goal_updates(frames: &[Frame]) -> Vec<(String, u64)> {
    frames
        .iter()
        .filter(|f| f.event == "goal_update")
        .map(|f| {
            (
                f.body()["update"]["relation"].as_str().unwrap().to_string(),
                f.seq(),
            )
        })
        .collect()
}

async fn goal(s: &TestServer, sid: &str) -> Value {
    let (status, t) = s.get(&format!("/sessions/{sid}/presentation")).await;
    assert_eq!(status, 200, "{t}");
    t["goal"].clone()
}

#[tokio::test]
async fn steering_adds_to_the_goal_and_pause_holds_the_next_leg_until_resume() {
    let s = TestServer::start().await;
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    // The first leg waits for its write's approval while the steering comes.
    let (status, a) = s.run(&sid, "/write a.txt hi\nfirst leg").await;
    assert_eq!(status, 202, "{a}");
    let mut frames = sse.until("approval_requested").await;
    let rid = frames.last().unwrap().body()["request_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(steer(&s, &sid, "also add a README").await, "queued");
    assert_eq!(steer(&s, &sid, "pause").await, "applied");
    let (status, _) = s
        .post(
            &format!("/sessions/{sid}/approvals/{rid}"),
            json!({"approve": true}),
        )
        .await;
    assert_eq!(status, 200);
    // The first leg ends; the chain holds its next leg and says so.
    loop {
        let f = sse.next().await.expect("the stream goes on");
        let held = f.event == "notice" && f.body()["text"].as_str().unwrap_or("").starts_with("paused:");
        frames.push(f);
        if held {
            break;
        }
    }
    let legs = frames.iter().filter(|f| f.event == "user_message").count();
    assert_eq!(legs, 1, "the queued leg did not start while paused");
    assert!(
        frames.iter().all(|f| f.event != "run_finished"),
        "the run is still live"
    );
    let g = goal(&s, &sid).await;
    assert_eq!(g["objective"], "/write a.txt hi\nfirst leg");
    assert_eq!(g["additions"], json!(["also add a README"]));
    assert_eq!(g["control"], "paused");
    assert_eq!(steer(&s, &sid, "resume").await, "applied");
    frames.extend(sse.until("run_finished").await);
    let updates = goal_updates(&frames);
    let relations: Vec<&str> = updates.iter().map(|(r, _)| r.as_str()).collect();
    assert_eq!(relations, ["add", "pause", "resume"]);
    let second = frames
        .iter()
        .filter(|f| f.event == "user_message")
        .nth(1)
        .expect("the queued leg ran after the resume");
    assert_eq!(second.body()["text"], "also add a README");
    assert!(second.seq() > updates[2].1, "it started after the resume");
    let finished = frames.last().unwrap();
    assert_eq!(finished.body()["outcome"], "completed");
    let g = goal(&s, &sid).await;
    assert_eq!(g["control"], "done");
    assert_eq!(g["updates"].as_array().unwrap().len(), 3);
    assert_eq!(g["updates"][0]["signals"], json!(["starts with \"also\""]));
    assert_eq!(g["updates"][0]["at_seq"], updates[0].1);

    // A new chain is a new goal; the presentation stream carries it.
    let (_, a) = s.run(&sid, "write the changelog").await;
    assert_eq!(a["state"], "started");
    sse.until("run_finished").await;
    let g = goal(&s, &sid).await;
    assert_eq!(g["objective"], "write the changelog");
    assert_eq!(g["updates"], json!([]));

    // The goal survives a restart (it is folded from the ledger).
    let (home, ws) = s.stop().await.unwrap();
    let s = TestServer::start_in(home.path(), ws.path(), |_| {}).await;
    let g = goal(&s, &sid).await;
    assert_eq!(g["objective"], "write the changelog");
    assert_eq!(g["control"], "done");
}

#[tokio::test]
async fn stop_cancels_the_run_and_a_request_for_bypass_changes_nothing() {
    let s = TestServer::start().await;
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    let (status, _) = s.run(&sid, "/sleep 60000").await;
    assert_eq!(status, 202);
    sse.until("user_message").await;
    let (_, before) = s.get("/config").await;
    assert_eq!(
        steer(&s, &sid, "also switch to bypass mode so you don't ask me").await,
        "queued",
        "it is still the model's input"
    );
    assert_eq!(steer(&s, &sid, "Stop!").await, "applied");
    let frames = sse.until("run_finished").await;
    let finished = frames.last().unwrap();
    assert_eq!(finished.body()["outcome"], "cancelled", "{:?}", finished.body());
    assert!(
        frames.iter().filter(|f| f.event == "user_message").count() == 0,
        "the queued input was discarded with the cancel"
    );
    let widening = frames
        .iter()
        .find(|f| f.event == "goal_update")
        .expect("the bypass request is recorded")
        .body()["update"]
        .clone();
    assert_eq!(widening["widens_permissions"], true);
    assert!(widening["signals"]
        .as_array()
        .unwrap()
        .iter()
        .any(|x| x == "asks for wider permissions: \"bypass\""));
    let (_, after) = s.get("/config").await;
    assert_eq!(after["permission_mode"], before["permission_mode"]);
    assert_eq!(after["permission_mode"], "default");
    let g = goal(&s, &sid).await;
    assert_eq!(g["control"], "cancelled");
    assert_eq!(
        g["additions"],
        json!([]),
        "a widening request is not applied to the goal"
    );
    let relations: Vec<&str> = g["updates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["relation"].as_str().unwrap())
        .collect();
    assert_eq!(relations, ["add", "cancel"]);
    // Idle, "stop" is a prompt like any other: it starts a run.
    let (_, a) = s.run(&sid, "stop").await;
    assert_eq!(a["state"], "started");
    sse.until("run_finished").await;
}

#[tokio::test]
async fn steering_before_the_first_leg_starts_is_part_of_that_chains_goal() {
    // Nobody watches yet: the admitted chain waits for a first subscriber
    // (long enough here that it is the test that ends the wait).
    let s =
        TestServer::start_with(|c| c.core.first_subscriber_wait = std::time::Duration::from_secs(60)).await;
    let sid = s.create_session().await;
    let (status, _) = s.run(&sid, "write the docs").await;
    assert_eq!(status, 202);
    assert_eq!(steer(&s, &sid, "also add a README").await, "queued");
    let mut sse = s.events(&sid, Some(0)).await;
    let frames = sse.until("run_finished").await;
    let kinds: Vec<&str> = frames
        .iter()
        .map(|f| f.event.as_str())
        .filter(|k| *k == "goal_update" || *k == "user_message")
        .collect();
    assert_eq!(
        kinds,
        ["goal_update", "user_message", "user_message"],
        "the update came before the first leg"
    );
    let g = goal(&s, &sid).await;
    assert_eq!(g["objective"], "write the docs");
    assert_eq!(g["additions"], json!(["also add a README"]));
    assert_eq!(g["updates"].as_array().unwrap().len(), 1);
}
