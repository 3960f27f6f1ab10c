//! The spawn_worker tool end to end, driven by the offline model's `/worker`: a waited worker's answer is the tool result and its work is on its own branch, two workers of one turn run at the same time, a background worker's answer reaches the parent as a background_result, and a worker running a command is listed, refused to other sessions and stopped through its parent with its process.

use crate::support::git::init_repo;
use crate::support::{TestServer, DEADLINE};
use serde_json::{json, Value};
use std::path::Path;
use vak::core::permissions::PermissionMode;

/// A server in bypass mode: the children's tools run without asking.
async fn server() -> TestServer {
    TestServer::start_with(|c| {
        c.core.permission = PermissionMode::Bypass;
        c.core.allow_bypass = true;
    })
    .await
}

/// A `/worker` line with its whole input as JSON (one line, whatever the prompt holds).
fn worker(input: Value) -> String {
    format!("/worker {input}")
}

/// The spawn_worker tool results of `frames`, in the order they came.
fn results(frames: &[crate::support::Frame]) -> Vec<Value> {
    let calls: Vec<Value> = frames
        .iter()
        .filter(|f| f.event == "tool_call" && f.body()["tool"] == "spawn_worker")
        .map(|f| f.body()["call_id"].clone())
        .collect();
    frames
        .iter()
        .filter(|f| f.event == "tool_result" && calls.contains(&f.body()["call_id"]))
        .map(|f| f.body().clone())
        .collect()
}

#[tokio::test]
async fn a_waited_worker_answers_the_tool_call_and_its_work_is_on_its_own_branch() {
    let s = server().await;
    init_repo(&s.workspace);
    let sid = s.create_session().await;
    let mut events = s.events(&sid, None).await;
    let prompt = worker(json!({"prompt": "/write hello.txt hi from the worker\nall done"}));
    let (status, b) = s.run(&sid, &prompt).await;
    assert!(status < 300, "{b}");
    let frames = events.until("run_finished").await;
    crate::support::assert_completed(&frames);
    let r = results(&frames);
    assert_eq!(r.len(), 1, "{frames:#?}");
    assert_eq!(r[0]["ok"], true, "{r:?}");
    let output = r[0]["output"].as_str().unwrap();
    assert!(output.starts_with("echo: all done"), "{output}");
    assert!(
        output.contains(&format!("finished on branch vak/{sid}/")),
        "{output}"
    );
    // The model was told the answer.
    assert!(crate::support::text_of(&frames).contains("worker: echo: all done"));
    // The parent's stream said the child was spawned and finished.
    let phases: Vec<&str> = frames
        .iter()
        .filter(|f| f.event == "worker")
        .map(|f| f.body()["phase"].as_str().unwrap())
        .collect();
    assert_eq!(phases.first(), Some(&"spawned"), "{phases:?}");
    assert_eq!(phases.last(), Some(&"finished"), "{phases:?}");

    let (status, listed) = s.get(&format!("/sessions/{sid}/workers")).await;
    assert_eq!(status, 200, "{listed}");
    let w = &listed["workers"][0];
    assert_eq!(
        (w["kind"].as_str(), w["state"].as_str()),
        (Some("worker"), Some("finished")),
        "{w}"
    );
    assert_eq!(w["diff_stat"]["files"], 1, "{w}");
    let tree = Path::new(w["worktree"].as_str().unwrap());
    assert_eq!(
        std::fs::read_to_string(tree.join("hello.txt")).unwrap(),
        "hi from the worker"
    );
    assert!(
        !s.workspace.join("hello.txt").exists(),
        "the parent's workspace is untouched"
    );
}

#[tokio::test]
async fn two_workers_of_one_turn_run_at_the_same_time() {
    let s = server().await;
    let sid = s.create_session().await;
    let flag = s.workspace.join("flag");
    // The first waits for a file only the second writes: one after the
    // other, it gives up and says so.
    let waits = format!(
        "/bash for i in $(seq 1 400); do [ -f {f} ] && break; sleep 0.05; done; [ -f {f} ] && echo met || echo alone",
        f = flag.display()
    );
    let prompt = format!(
        "{}\n{}",
        worker(json!({"prompt": waits, "isolated": false})),
        worker(json!({"prompt": format!("/bash touch {}", flag.display()), "isolated": false})),
    );
    let mut events = s.events(&sid, None).await;
    let (status, b) = s.run(&sid, &prompt).await;
    assert!(status < 300, "{b}");
    let frames = events.until("run_finished").await;
    crate::support::assert_completed(&frames);
    let r = results(&frames);
    assert_eq!(r.len(), 2, "{frames:#?}");
    assert!(r.iter().all(|x| x["ok"] == true), "{r:?}");
    let (status, listed) = s.get(&format!("/sessions/{sid}/workers")).await;
    assert_eq!(status, 200);
    assert_eq!(listed["workers"].as_array().unwrap().len(), 2, "{listed}");
    // The waiting child's own transcript: it met the other.
    let first = listed["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["prompt"].as_str().unwrap().starts_with("/bash for"))
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let (_, t) = s.get(&format!("/sessions/{first}/transcript")).await;
    let outputs: Vec<&str> = t["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["text"].as_str().unwrap_or("").trim())
        .collect();
    assert_eq!(outputs, ["met"], "{t}");
}

#[tokio::test]
async fn a_background_worker_answers_its_id_and_its_answer_arrives_as_a_background_result() {
    let s = server().await;
    let sid = s.create_session().await;
    let mut events = s.events(&sid, None).await;
    let prompt = worker(json!({"prompt": "later answer", "wait": false, "isolated": false}));
    let (status, b) = s.run(&sid, &prompt).await;
    assert!(status < 300, "{b}");
    let frames = events.until("run_finished").await;
    crate::support::assert_completed(&frames);
    let r = results(&frames);
    assert_eq!(r[0]["ok"], true, "{r:?}");
    let answered: Value = serde_json::from_str(r[0]["output"].as_str().unwrap()).unwrap();
    let child = answered["id"].as_str().unwrap().to_string();
    assert_eq!(answered["branch"], "", "not isolated: no branch");
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let f = tokio::time::timeout_at(deadline, events.next())
            .await
            .expect("a background_result within the deadline")
            .expect("the stream stays open");
        if f.event == "background_result" {
            let body = f.body();
            assert_eq!(body["source"], "worker", "{body}");
            assert_eq!(body["id"], child.as_str(), "{body}");
            assert!(
                body["text"].as_str().unwrap().contains("echo: later answer"),
                "{body}"
            );
            break;
        }
    }
}

/// The session's one worker once its command has written `pid` in its worktree: the listing and the pid.
async fn running_worker(s: &TestServer, sid: &str) -> (Value, i32) {
    let start = std::time::Instant::now();
    loop {
        let (status, listed) = s.get(&format!("/sessions/{sid}/workers")).await;
        assert_eq!(status, 200, "{listed}");
        if let Some(w) = listed["workers"].get(0) {
            let pid = Path::new(w["worktree"].as_str().unwrap_or_default()).join("pid");
            if let Some(pid) = std::fs::read_to_string(pid)
                .ok()
                .filter(|p| p.ends_with('\n'))
                .and_then(|p| p.trim().parse().ok())
            {
                return (w.clone(), pid);
            }
        }
        assert!(
            start.elapsed() < DEADLINE,
            "no running worker wrote its pid: {listed}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_worker_running_a_command_is_stopped_only_through_its_parent_and_its_process_is_gone() {
    let s = server().await;
    init_repo(&s.workspace);
    let sid = s.create_session().await;
    let other = s.create_session().await;
    let mut events = s.events(&sid, None).await;
    let prompt = worker(json!({"prompt": "/bash echo $$ > pid; exec sleep 60"}));
    let (status, b) = s.run(&sid, &prompt).await;
    assert!(status < 300, "{b}");

    // Listed under its parent, running, in its own worktree on its branch.
    let (w, pid) = running_worker(&s, &sid).await;
    let id = w["id"].as_str().unwrap().to_string();
    assert_eq!(
        (w["kind"].as_str(), w["state"].as_str()),
        (Some("worker"), Some("running")),
        "{w}"
    );
    assert_eq!(w["branch"], format!("vak/{sid}/{id}"), "{w}");
    assert!(Path::new(&format!("/proc/{pid}")).exists());

    // Through another session's id: not found, and the child runs on.
    for (path, body) in [
        (format!("/sessions/{other}/workers/{id}/stop"), json!({})),
        (
            format!("/sessions/{other}/workers/{id}/steer"),
            json!({"text": "hi"}),
        ),
    ] {
        let (status, b) = s.post(&path, body).await;
        assert_eq!(status, 404, "{path}: {b}");
        assert_eq!(b["error"]["reason"], "worker_not_found", "{b}");
    }
    assert!(
        Path::new(&format!("/proc/{pid}")).exists(),
        "a refused stop stopped nothing"
    );

    // Through its parent: cancelled, its process gone.
    let (status, stopped) = s
        .post(&format!("/sessions/{sid}/workers/{id}/stop"), json!({}))
        .await;
    assert_eq!(status, 200, "{stopped}");
    assert_eq!(stopped["state"], "cancelled", "{stopped}");
    let start = std::time::Instant::now();
    while Path::new(&format!("/proc/{pid}")).exists() {
        assert!(
            start.elapsed() < DEADLINE,
            "the worker's process {pid} still runs"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // The parent's waited call ends with the worker cancelled, and its run settles.
    let frames = events.until("run_finished").await;
    let r = results(&frames);
    assert_eq!(r.len(), 1, "{frames:#?}");
    assert_eq!(r[0]["ok"], false, "{r:?}");
    assert!(
        r[0]["output"].as_str().unwrap().contains("was cancelled"),
        "{r:?}"
    );
}
