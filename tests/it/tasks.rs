//! Scheduled tasks end to end (issue 29): CRUD and validation, a script task's output and alerts delivered as `background_result` and `background` transcript messages, a prompt task's run, and a result that arrives during a run delivered after its run_finished, once, also across a restart.

use crate::support::serve::Serve;
use crate::support::{self, Frame, TestServer, DEADLINE};
use serde_json::{json, Value};

fn of_kind<'a>(frames: &'a [Frame], kind: &str) -> Vec<&'a Value> {
    frames
        .iter()
        .filter(|f| f.event == kind)
        .map(|f| f.body())
        .collect()
}

async fn create(s: &TestServer, body: Value) -> Value {
    let (st, v) = s.post("/tasks", body).await;
    assert_eq!(st, 201, "{v}");
    v["task"].clone()
}

/// Waits (bounded) until the task's last fire is the one run-now answered
/// `fire` for (its slot is newer than the one `fire` shows) and has this
/// outcome; the task.
async fn fired(s: &TestServer, fire: &Value, outcome: &str) -> Value {
    let id = fire["id"].as_str().unwrap();
    let before = fire["last_fire"]["slot"].clone();
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let (st, v) = s.get(&format!("/tasks/{id}")).await;
        assert_eq!(st, 200, "{v}");
        let last = &v["task"]["last_fire"];
        if last["slot"] != before && last["outcome"] == outcome {
            return v["task"].clone();
        }
        assert!(tokio::time::Instant::now() < deadline, "never {outcome}: {v}");
        support::poll::pause().await;
    }
}

async fn run_now(s: &TestServer, id: &str) -> Value {
    let (st, v) = s.post(&format!("/tasks/{id}/run-now"), json!({})).await;
    assert_eq!(st, 202, "{v}");
    v["task"].clone()
}

async fn transcript_roles(s: &TestServer, sid: &str) -> Vec<(String, String)> {
    let (st, t) = s.get(&format!("/sessions/{sid}/transcript")).await;
    assert_eq!(st, 200, "{t}");
    t["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["role"].as_str().unwrap_or("").to_string(),
                m["text"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

#[tokio::test]
async fn a_script_task_delivers_its_stdout_its_failure_as_an_alert_and_an_empty_output_as_a_silent_tick() {
    let served = Serve::new().start().await;
    let s = served.api();
    let task = create(
        &s,
        json!({"name": "watchdog", "script": "echo '  all quiet on disk  '"}),
    )
    .await;
    let id = task["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("task_"), "{task}");
    assert_eq!(task["enabled"], true);
    assert!(
        task.get("next_fire").is_none(),
        "no schedule, no next fire: {task}"
    );
    // A script task named no session: it got one of its own.
    let sid = task["session_id"]
        .as_str()
        .expect("a session of its own")
        .to_string();
    let mut ev = s.events(&sid, None).await;

    let fire = run_now(&s, &id).await;
    let frames = ev.until("background_result").await;
    let r = frames.last().unwrap().body();
    assert_eq!(
        (&r["source"], &r["id"], &r["text"], &r["alert"]),
        (
            &json!("script"),
            &json!(id),
            &json!("all quiet on disk"),
            &json!(false)
        ),
        "{r}"
    );
    assert!(r["result_id"].as_str().unwrap().starts_with("bg_"), "{r}");
    let t = fired(&s, &fire, "delivered").await;
    assert!(
        t["last_fire"]["slot"].as_str().unwrap().starts_with("now-"),
        "{t}"
    );
    assert_eq!(
        transcript_roles(&s, &sid).await.last().unwrap(),
        &("background".to_string(), "all quiet on disk".to_string())
    );

    // A failing script is an alert with its exit code and stderr tail.
    let (st, v) = s
        .send(
            reqwest::Method::PATCH,
            &format!("/tasks/{id}"),
            Some(json!({"script": "echo partial; echo 'disk is full' >&2; exit 3"})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let fire = run_now(&s, &id).await;
    let r = ev.until("background_result").await.last().unwrap().body().clone();
    assert_eq!(
        (&r["alert"], &r["reason"]),
        (&json!(true), &json!("script_failed")),
        "{r}"
    );
    let text = r["text"].as_str().unwrap();
    assert!(text.contains("code 3") && text.contains("disk is full"), "{text}");
    let t = fired(&s, &fire, "script_failed").await;
    assert!(
        t["last_fire"]["message"].as_str().unwrap().contains("code 3"),
        "{t}"
    );

    // Empty stdout: a silent tick, recorded and not delivered.
    let before = transcript_roles(&s, &sid).await.len();
    let (st, _) = s
        .send(
            reqwest::Method::PATCH,
            &format!("/tasks/{id}"),
            Some(json!({"script": "true"})),
        )
        .await;
    assert_eq!(st, 200);
    let fire = run_now(&s, &id).await;
    fired(&s, &fire, "silent").await;
    assert_eq!(transcript_roles(&s, &sid).await.len(), before);

    // Listed, then deleted.
    let (_, list) = s.get("/tasks").await;
    assert_eq!(list["tasks"].as_array().unwrap().len(), 1, "{list}");
    assert!(list["timezone"].as_str().is_some_and(|z| !z.is_empty()), "{list}");
    let (st, _) = s.delete(&format!("/tasks/{id}")).await;
    assert_eq!(st, 200);
    let (st, v) = s.get(&format!("/tasks/{id}")).await;
    assert_eq!(st, 404, "{v}");
}

#[tokio::test]
async fn a_bad_task_is_refused_with_400_naming_its_field_and_an_unknown_id_is_404() {
    let s = TestServer::start().await;
    let sid = s.create_session().await;
    for (body, field) in [
        (
            json!({"name": "x", "script": "true", "schedule": "61 * * * *"}),
            "schedule",
        ),
        (
            json!({"name": "x", "script": "true", "schedule": "* * *"}),
            "schedule",
        ),
        (json!({"name": "x"}), "prompt"),
        (
            json!({"name": "x", "prompt": "hi", "script": "true", "session_id": sid}),
            "prompt",
        ),
        (
            json!({"name": "x", "prompt": "hi", "session_id": "0123456789abcdef0123456789abcdef"}),
            "session_id",
        ),
        (
            json!({"name": "x", "prompt": "hi", "model_pin": "no-such-model"}),
            "model_pin",
        ),
        (json!({"name": "", "prompt": "hi"}), "name"),
    ] {
        let (st, v) = s.post("/tasks", body.clone()).await;
        assert_eq!(st, 400, "{body} -> {v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .starts_with(&format!("{field}:")),
            "{body} -> {v}"
        );
    }
    let (_, list) = s.get("/tasks").await;
    assert_eq!(list["tasks"], json!([]), "nothing refused was kept: {list}");
    for path in ["/tasks/task_000000000000", "/tasks/task_000000000000/run-now"] {
        let (st, v) = if path.ends_with("run-now") {
            s.post(path, json!({})).await
        } else {
            s.get(path).await
        };
        assert_eq!(st, 404, "{path} -> {v}");
    }
    // A schedule is read in the server's zone and gives the next fire.
    let t = create(
        &s,
        json!({"name": "nightly", "prompt": "hi", "session_id": sid, "schedule": "0 3 * * *"}),
    )
    .await;
    assert!(t["next_fire"].as_str().unwrap().contains("T03:00:00"), "{t}");
    let (st, v) = s
        .send(
            reqwest::Method::PATCH,
            &format!("/tasks/{}", t["id"].as_str().unwrap()),
            Some(json!({"enabled": false})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    assert!(
        v["task"].get("next_fire").is_none(),
        "a disabled task has no next fire: {v}"
    );
}

#[tokio::test]
async fn a_prompt_task_runs_in_its_session_under_a_task_request_id() {
    let s = TestServer::start().await;
    let sid = s.create_session().await;
    let mut ev = s.events(&sid, None).await;
    let t = create(
        &s,
        json!({"name": "greet", "prompt": "hello from the scheduler", "session_id": sid}),
    )
    .await;
    let id = t["id"].as_str().unwrap();
    let fire = run_now(&s, id).await;
    let frames = ev.until("run_finished").await;
    support::assert_completed(&frames);
    let user = of_kind(&frames, "user_message");
    let rid = user[0]["request_id"].as_str().unwrap();
    assert!(rid.starts_with(&format!("task:{id}:now-")), "{rid}");
    assert_eq!(user[0]["text"], "hello from the scheduler");
    let t = fired(&s, &fire, "started").await;
    assert_eq!(t["last_fire"]["session_id"], sid.as_str());
}

#[tokio::test]
async fn a_result_arriving_during_a_run_is_delivered_after_run_finished_and_once_across_a_restart() {
    let home = tempfile::tempdir().unwrap();
    let ws = tempfile::tempdir().unwrap();
    let served = Serve::new().home(home.path()).workspace(ws.path()).start().await;
    let s = served.api();
    let sid = s.create_session().await;
    let mut ev = s.events(&sid, None).await;
    let t = create(
        &s,
        json!({"name": "probe", "script": "echo probe says hi", "session_id": sid}),
    )
    .await;
    let id = t["id"].as_str().unwrap().to_string();

    // A live run, waiting on its approval.
    let (st, v) = s.run(&sid, "/bash echo from the run").await;
    assert_eq!(st, 202, "{v}");
    let ask = ev.next_ask().await;
    let fire = run_now(&s, &id).await;
    fired(&s, &fire, "delivered").await;
    let rid = ask["request_id"].as_str().unwrap();
    let (st, v) = s
        .post(
            &format!("/sessions/{sid}/approvals/{rid}"),
            json!({"approve": true}),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let frames = ev.until("background_result").await;
    let kinds: Vec<&str> = frames.iter().map(|f| f.event.as_str()).collect();
    let finished = kinds
        .iter()
        .position(|k| *k == "run_finished")
        .expect("run_finished first");
    assert_eq!(
        finished,
        kinds.len() - 2,
        "delivered right after run_finished: {kinds:?}"
    );
    assert_eq!(frames.last().unwrap().body()["text"], "probe says hi");

    // Again during a run, and the server stops before the run ends.
    let (st, _) = s.run(&sid, "/bash echo second").await;
    assert_eq!(st, 202);
    ev.next_ask().await;
    let fire = run_now(&s, &id).await;
    fired(&s, &fire, "delivered").await;
    drop(ev);
    // Killed, not stopped: a graceful stop would end the run (and deliver).
    served.vak.kill().await;

    let served = Serve::new().home(home.path()).workspace(ws.path()).start().await;
    let s = served.api();
    let mut ev = s.events(&sid, Some(0)).await;
    let mut frames = Vec::new();
    while of_kind(&frames, "background_result").len() < 2 {
        frames.extend(ev.until("background_result").await);
    }
    // The interrupted run was settled first, then the queued result delivered.
    let kinds: Vec<&str> = frames.iter().map(|f| f.event.as_str()).collect();
    assert_eq!(
        &kinds[kinds.len() - 2..],
        ["run_finished", "background_result"],
        "{kinds:?}"
    );
    assert_eq!(
        support::finished(&frames[..frames.len() - 1])["outcome"],
        "failed"
    );
    drop(ev);
    served.vak.terminate().await;

    // A second restart delivers nothing again.
    let served = Serve::new().home(home.path()).workspace(ws.path()).start().await;
    let s = served.api();
    let (_, t) = s.get(&format!("/sessions/{sid}/transcript")).await;
    let roles: Vec<&str> = t["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(
        roles.iter().filter(|r| **r == "background").count(),
        2,
        "{roles:?}"
    );
    assert_eq!(roles.last(), Some(&"background"), "{roles:?}");
}

/// With `--bus`, the replicas share one task list and claim each slot in a
/// KV bucket before they fire it: an every-minute task put on one replica
/// is seen by the other, and its slot fires on exactly one of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_bus_two_replicas_share_the_tasks_and_a_slot_fires_once() {
    use crate::support::nats::{Cluster, Replica};
    use std::os::unix::fs::PermissionsExt;
    let nats = Cluster::single().await;
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("bus-secret");
    std::fs::write(
        &secret,
        "4e1f0a9c8b7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f\n",
    )
    .unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    let start = |name: &'static str| {
        let (url, secret, ws) = (nats.url(), secret.display().to_string(), ws.clone());
        async move {
            Replica::start(&url, name, "1", |s| {
                s.args(["--bus-secret-file", secret.as_str()]).workspace(&ws)
            })
            .await
        }
    };
    let a = start("ta").await;
    let b = start("tb").await;
    let prompt = "the minutely check-in";
    let t = create(
        &a.api,
        json!({"name": "minutely", "prompt": prompt, "schedule": "* * * * *"}),
    )
    .await;
    let id = t["id"].as_str().unwrap().to_string();
    // The other replica has it too, and both wait for the same slot.
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let on_b = loop {
        let (_, v) = b.api.get(&format!("/tasks/{id}")).await;
        if v["task"]["next_fire"].is_string() {
            break v["task"].clone();
        }
        assert!(tokio::time::Instant::now() < deadline, "never on b: {v}");
        support::poll::pause().await;
    };
    assert_eq!(on_b["next_fire"], t["next_fire"]);
    // The slot is at most a minute away: wait for it to have fired.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(90);
    let slot = loop {
        let (_, v) = a.api.get(&format!("/tasks/{id}")).await;
        if let Some(slot) = v["task"]["last_fire"]["slot"].as_str() {
            break slot.to_string();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the slot never fired: {v}"
        );
        support::poll::pause().await;
    };
    let (st, _) = a
        .api
        .send(
            reqwest::Method::PATCH,
            &format!("/tasks/{id}"),
            Some(json!({"enabled": false})),
        )
        .await;
    assert_eq!(st, 200);
    // Each replica saw the fire; one session was made for it.
    for r in [&a, &b] {
        let deadline = tokio::time::Instant::now() + DEADLINE;
        loop {
            let (_, v) = r.api.get(&format!("/tasks/{id}")).await;
            if v["task"]["last_fire"]["slot"] == slot.as_str() && v["task"]["enabled"] == false {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "{v}");
            support::poll::pause().await;
        }
    }
    // Each fire of a prompt task without a session makes one; the test made none.
    let (_, list) = b.api.get("/sessions").await;
    let fired = list["sessions"].as_array().unwrap();
    assert_eq!(fired.len(), 1, "the slot fired once: {list}");
}

/// A task's `model_pin` routes its runs to that model of the route's
/// provider (the request the provider gets names it); a pin the provider
/// does not list is refused with 400 naming `model_pin`.
#[tokio::test]
async fn a_pinned_task_runs_on_its_model_and_an_unlisted_pin_is_refused() {
    use crate::support::fake_provider::{fixture, FakeProvider, Reply};
    let fake = FakeProvider::start().await;
    let served = Serve::new()
        .args(["--provider", "openai", "--model", "gpt-4.1", "--base-url"])
        .arg(format!("{}/v1", fake.url))
        .env("OPENAI_API_KEY", "sk-test-pin-0123456789")
        .start()
        .await;
    let s = served.api();
    let sid = s.create_session().await;
    fake.script([
        Reply::status(200, &fixture("openai/models.json")),
        Reply::status(200, &fixture("openai/models.json")),
        Reply::fixture("openai/text.sse"),
    ]);
    let (st, v) = s
        .post(
            "/tasks",
            json!({"name": "p", "prompt": "hi", "session_id": sid, "model_pin": "gpt-5-imaginary"}),
        )
        .await;
    assert_eq!(st, 400, "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().starts_with("model_pin:"),
        "{v}"
    );
    let t = create(
        &s,
        json!({"name": "p", "prompt": "hi", "session_id": sid, "model_pin": "openai/o3"}),
    )
    .await;
    assert_eq!(t["model_pin"], "openai/o3");
    let mut ev = s.events(&sid, None).await;
    run_now(&s, t["id"].as_str().unwrap()).await;
    support::assert_completed(&ev.until("run_finished").await);
    let turns: Vec<_> = fake
        .requests()
        .into_iter()
        .filter(|r| r.method == "POST")
        .collect();
    assert_eq!(turns.len(), 1, "{turns:?}");
    assert_eq!(turns[0].body["model"], "o3", "{}", turns[0].raw);
}

/// A delivered result reaches every stream of its session: the per-session
/// SSE stream, `/stream`, gRPC Subscribe, and the presentation timeline as
/// an item of kind `background` (failed for an alert).
#[tokio::test]
async fn a_background_result_reaches_every_surface_of_its_session() {
    use vak::proto::v1 as pb;
    let s = TestServer::start().await;
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    let mut mux = s
        .open_stream(&s.url, &support::sessions_query(&[&sid]), None)
        .await;
    let mut client = s.grpc().await;
    let (mut grpc, _) = support::grpc_subscribe(&mut client, &sid, None).await;
    let t = create(
        &s,
        json!({"name": "w", "script": "echo 'fs: ok'; exit 1", "session_id": sid}),
    )
    .await;
    run_now(&s, t["id"].as_str().unwrap()).await;

    let r = sse
        .until("background_result")
        .await
        .last()
        .unwrap()
        .body()
        .clone();
    assert_eq!(
        (&r["alert"], &r["reason"]),
        (&json!(true), &json!("script_failed")),
        "{r}"
    );
    let on_mux = loop {
        let f = mux.next().await.expect("a /stream frame");
        if f.event == "agent" && support::agent_kind(&f.data) == "background_result" {
            break f.data["background_result"].clone();
        }
    };
    assert_eq!(on_mux["result_id"], r["result_id"], "{on_mux}");
    let events = grpc.until("background_result").await;
    let Some(pb::event::Kind::BackgroundResult(b)) = &events.last().unwrap().kind else {
        panic!("{events:?}")
    };
    assert_eq!(b.result_id, r["result_id"].as_str().unwrap());
    assert_eq!(b.reason(), pb::BackgroundReason::ScriptFailed);
    assert_eq!(b.source(), pb::BackgroundSource::Script);

    let (_, timeline) = s.get(&format!("/sessions/{sid}/presentation")).await;
    let item = timeline["items"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(
        (&item["kind"], &item["status"]),
        (&json!("background"), &json!("failed")),
        "{item}"
    );
    assert!(item["text"].as_str().unwrap().contains("code 1"), "{item}");
}
