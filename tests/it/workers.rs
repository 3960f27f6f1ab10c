//! Child sessions over REST: best-of-N candidates in their own git worktrees and branches, kept (merged) or discarded, listed, steered and stopped through their parent, deleted with it, and still listed after a restart.

use crate::support::git::{git, init_repo};
use crate::support::poll::pause;
use crate::support::{TestServer, DEADLINE};
use serde_json::{json, Value};
use std::path::Path;
use std::time::Instant;
use vak::core::permissions::PermissionMode;

/// A server in bypass mode (the offline model's tools run without asking).
async fn server() -> TestServer {
    TestServer::start_with(|c| {
        c.core.permission = PermissionMode::Bypass;
        c.core.allow_bypass = true;
    })
    .await
}

/// POST /sessions/:sid/bestofn; the candidates' ids and worktrees.
async fn bestofn(s: &TestServer, sid: &str, prompt: &str, n: u32) -> Vec<(String, String, String)> {
    let (status, b) = s
        .post(
            &format!("/sessions/{sid}/bestofn"),
            json!({"prompt": prompt, "n": n}),
        )
        .await;
    assert_eq!(status, 202, "{b}");
    assert!(b["bestofn_id"].as_str().unwrap().starts_with("bon_"), "{b}");
    let cands = b["candidates"].as_array().unwrap();
    assert_eq!(cands.len(), n as usize, "{b}");
    cands
        .iter()
        .map(|c| {
            let id = c["id"].as_str().unwrap().to_string();
            assert_eq!(c["branch"], format!("vak/{sid}/{id}"));
            (
                id,
                c["branch"].as_str().unwrap().to_string(),
                c["worktree"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

async fn workers(s: &TestServer, sid: &str) -> Vec<Value> {
    let (status, b) = s.get(&format!("/sessions/{sid}/workers")).await;
    assert_eq!(status, 200, "{b}");
    b["workers"].as_array().cloned().unwrap_or_default()
}

/// Waits until every child of `sid` satisfies `done`.
async fn until_all(s: &TestServer, sid: &str, what: &str, done: impl Fn(&Value) -> bool) -> Vec<Value> {
    let start = Instant::now();
    loop {
        let w = workers(s, sid).await;
        if !w.is_empty() && w.iter().all(&done) {
            return w;
        }
        assert!(start.elapsed() < DEADLINE, "children never {what}: {w:?}");
        pause().await;
    }
}

async fn until_file(path: &Path) -> String {
    let start = Instant::now();
    loop {
        if let Ok(s) = std::fs::read_to_string(path) {
            if s.ends_with('\n') {
                return s;
            }
        }
        assert!(start.elapsed() < DEADLINE, "{} never written", path.display());
        pause().await;
    }
}

async fn until_gone(pid: i32) {
    let start = Instant::now();
    while Path::new(&format!("/proc/{pid}")).exists() {
        assert!(start.elapsed() < DEADLINE, "process {pid} still runs");
        pause().await;
    }
}

#[tokio::test]
async fn a_kept_candidate_is_merged_and_the_others_branches_and_worktrees_go() {
    let s = server().await;
    let ws = s.workspace.clone();
    init_repo(&ws);
    let sid = s.create_session().await;
    for n in [1, 5] {
        let (status, b) = s
            .post(
                &format!("/sessions/{sid}/bestofn"),
                json!({"prompt": "x", "n": n}),
            )
            .await;
        assert_eq!(status, 400, "n={n}: {b}");
        assert!(
            b["error"]["message"]
                .as_str()
                .unwrap()
                .contains(&format!("n {n}")),
            "{b}"
        );
    }
    let mut sse = s.events(&sid, None).await;
    let c = bestofn(&s, &sid, "/write cand.txt hello", 2).await;
    for (_, branch, wt) in &c {
        assert!(Path::new(wt).is_dir(), "{wt}");
        assert_eq!(
            git(&ws, &["branch", "--list", "--format=%(refname:short)", branch]),
            branch.as_str()
        );
    }
    let w = until_all(&s, &sid, "finished", |w| w["state"] == "finished").await;
    for w in &w {
        assert_eq!(w["kind"], "candidate", "{w}");
        assert_eq!(w["diff_stat"]["files"], 1, "{w}");
        assert_eq!(w["parent_id"], sid.as_str());
    }
    // A settled candidate steered runs again, on the same branch.
    let (status, w) = s
        .post(
            &format!("/sessions/{sid}/workers/{}/steer", c[1].0),
            json!({"text": "/write more.txt again"}),
        )
        .await;
    assert_eq!(status, 200, "{w}");
    until_all(&s, &sid, "finished again", |w| {
        w["state"] == "finished" && (w["id"] == c[0].0.as_str() || w["diff_stat"]["files"] == 2)
    })
    .await;
    assert!(Path::new(&c[1].2).join("more.txt").is_file());
    // Another session's id finds no candidate.
    let other = s.create_session().await;
    let (status, b) = s
        .post(&format!("/sessions/{other}/keep"), json!({"candidate": c[0].0}))
        .await;
    assert_eq!(status, 404, "{b}");

    let (status, k) = s
        .post(&format!("/sessions/{sid}/keep"), json!({"candidate": c[0].0}))
        .await;
    assert_eq!(status, 200, "{k}");
    assert_eq!(k["into"], "main", "{k}");
    assert_eq!(k["fast_forward"], true, "{k}");
    assert_eq!(k["discarded"], json!([c[1].0]), "{k}");
    assert_eq!(k["commit"].as_str().unwrap(), git(&ws, &["rev-parse", "HEAD"]));
    // The work is committed on the workspace's branch, nothing left over.
    assert_eq!(
        std::fs::read_to_string(ws.join("cand.txt")).unwrap().trim(),
        "hello"
    );
    assert_eq!(git(&ws, &["status", "--porcelain"]), "");
    assert!(git(&ws, &["log", "--format=%s"]).contains(&format!("vak: candidate {}", c[0].0)));
    for (_, branch, wt) in &c {
        assert!(!Path::new(wt).exists(), "{wt} is left");
        assert_eq!(
            git(&ws, &["branch", "--list", "--format=%(refname:short)", branch]),
            "",
            "{branch} is left"
        );
    }
    assert!(workers(&s, &sid).await.is_empty());
    // The parent's stream told each step: the candidates' states, then the discard.
    let frames = sse.until("draft_discarded").await;
    let bench: Vec<&Value> = frames
        .iter()
        .filter(|f| f.event == "workbench")
        .map(|f| f.body())
        .collect();
    assert!(
        bench.iter().any(|b| b["candidate"]["state"] == "finished"
            && b["candidate"]["diff_stat"]["files"] == 1
            && b["bestofn_id"].as_str().unwrap().starts_with("bon_")),
        "{bench:?}"
    );
    let last = frames.last().unwrap().body();
    assert_eq!(
        (last["candidate"].as_str(), last["why"].as_str()),
        (Some(c[1].0.as_str()), Some("kept_other"))
    );
    s.stop().await;
}

#[tokio::test]
async fn a_running_candidate_cannot_be_kept_is_discarded_stopped_and_goes_with_its_parent() {
    let s = server().await;
    let ws = s.workspace.clone();
    init_repo(&ws);
    let sid = s.create_session().await;
    let c = bestofn(&s, &sid, "/bash echo $$ > pid; exec sleep 60", 2).await;
    let pids: Vec<i32> = {
        let mut v = Vec::new();
        for (_, _, wt) in &c {
            v.push(
                until_file(&Path::new(wt).join("pid"))
                    .await
                    .trim()
                    .parse()
                    .unwrap(),
            );
        }
        v
    };
    // A worktree is where a child runs, never a folder a client may open.
    let (status, b) = s
        .post("/workspaces/open", json!({"path": c[1].2, "trust": true}))
        .await;
    assert_eq!(status, 403, "{b}");
    let (status, b) = s
        .post(&format!("/sessions/{sid}/keep"), json!({"candidate": c[0].0}))
        .await;
    assert_eq!(status, 409, "{b}");
    assert_eq!(b["error"]["reason"], "candidate_running", "{b}");

    // Steer and stop through another session's id: not found.
    let other = s.create_session().await;
    for (path, body) in [
        (format!("/sessions/{other}/workers/{}/stop", c[0].0), json!({})),
        (
            format!("/sessions/{other}/workers/{}/steer", c[0].0),
            json!({"text": "hi"}),
        ),
    ] {
        let (status, b) = s.post(&path, body).await;
        assert_eq!(status, 404, "{path}: {b}");
        assert_eq!(b["error"]["reason"], "worker_not_found", "{b}");
    }
    let listed = workers(&s, &sid).await;
    assert_eq!(listed.len(), 2);
    assert!(listed
        .iter()
        .all(|w| w["kind"] == "candidate" && w["state"] == "running"));

    // Stop kills the child's process.
    let (status, w) = s
        .post(&format!("/sessions/{sid}/workers/{}/stop", c[0].0), json!({}))
        .await;
    assert_eq!(status, 200, "{w}");
    assert_eq!(w["state"], "cancelled", "{w}");
    until_gone(pids[0]).await;
    assert!(Path::new(&format!("/proc/{}", pids[1])).exists());

    // Discard removes its worktree and branch.
    let (status, d) = s
        .post(&format!("/sessions/{sid}/discard"), json!({"candidate": c[0].0}))
        .await;
    assert_eq!(status, 200, "{d}");
    assert_eq!(d["why"], "discarded", "{d}");
    assert_eq!(d["branch"], c[0].1.as_str());
    assert!(!Path::new(&c[0].2).exists());
    assert_eq!(
        git(&ws, &["branch", "--list", "--format=%(refname:short)", &c[0].1]),
        ""
    );
    assert_eq!(workers(&s, &sid).await.len(), 1);

    // Deleting the parent stops the other and removes its worktree.
    let (status, b) = s.delete(&format!("/sessions/{sid}")).await;
    assert_eq!(status, 200, "{b}");
    until_gone(pids[1]).await;
    assert!(!Path::new(&c[1].2).exists());
    assert_eq!(
        git(&ws, &["branch", "--list", "--format=%(refname:short)", "vak/*"]),
        ""
    );
    let (status, _) = s.get(&format!("/sessions/{}/transcript", c[1].0)).await;
    assert_eq!(status, 404);
    s.stop().await;
}

#[tokio::test]
async fn a_workspace_outside_git_refuses_a_best_of_n() {
    let s = server().await;
    let sid = s.create_session().await;
    let (status, b) = s
        .post(
            &format!("/sessions/{sid}/bestofn"),
            json!({"prompt": "x", "n": 2}),
        )
        .await;
    assert_eq!(status, 400, "{b}");
    assert_eq!(b["error"]["reason"], "not_a_git_repo", "{b}");
    assert!(workers(&s, &sid).await.is_empty());
    let (status, _) = s.get("/sessions/nope/workers").await;
    assert_eq!(status, 404);
    s.stop().await;
}

#[tokio::test]
async fn children_outlive_a_restart_and_a_running_one_is_failed() {
    let s = server().await;
    let (home, ws) = (s.home.clone(), s.workspace.clone());
    init_repo(&ws);
    let sid = s.create_session().await;
    let c = bestofn(&s, &sid, "/sleep 60000", 2).await;
    until_all(&s, &sid, "running", |w| w["state"] == "running").await;
    let dirs = s.stop().await;
    let s = TestServer::start_in(&home, &ws, |c| {
        c.core.permission = PermissionMode::Bypass;
        c.core.allow_bypass = true;
    })
    .await;
    let w = workers(&s, &sid).await;
    assert_eq!(
        w.iter().map(|w| w["id"].as_str().unwrap()).collect::<Vec<_>>(),
        c.iter().map(|c| c.0.as_str()).collect::<Vec<_>>()
    );
    for w in &w {
        assert_eq!(w["state"], "failed", "{w}");
        assert_eq!(w["summary"], "the server stopped", "{w}");
    }
    // The worktrees are the work: they stay.
    assert!(c.iter().all(|c| Path::new(&c.2).is_dir()));
    s.stop().await;
    drop(dirs);
}

#[tokio::test]
async fn the_spawner_runs_workers_in_place_or_isolated_and_a_cancelled_wait_stops_them() {
    use tokio_util::sync::CancellationToken;
    use vak::core::worker::{Spawn, Spawner, WorkerKind, WorkerState};
    let s = server().await;
    let ws = s.workspace.clone();
    init_repo(&ws);
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    let sp = s.hub().children().clone();
    let spawn = |prompt: &str, isolated: bool| Spawn {
        parent: sid.clone(),
        kind: WorkerKind::Worker,
        prompt: prompt.into(),
        isolated,
        bestofn_id: String::new(),
        wait: true,
    };
    // In place: the parent's workspace itself, no branch.
    let w = sp
        .spawn(spawn("/write here.txt in place\ndone here", false))
        .await
        .unwrap();
    assert_eq!(
        (w.state, w.branch.as_str(), w.parent_id.as_str()),
        (WorkerState::Running, "", sid.as_str())
    );
    let done = sp.wait(&w.id, CancellationToken::new()).await.unwrap();
    assert_eq!(done.info.state, WorkerState::Finished, "{done:?}");
    assert!(done.info.summary.contains("done here"), "{done:?}");
    assert!(
        done.answer.contains("done here"),
        "the waiter gets the whole answer: {done:?}"
    );
    assert_eq!(
        std::fs::read_to_string(ws.join("here.txt")).unwrap().trim(),
        "in place"
    );
    // Isolated: its own worktree and branch, committed and measured.
    let w = sp.spawn(spawn("/write there.txt apart", true)).await.unwrap();
    let done = sp.wait(&w.id, CancellationToken::new()).await.unwrap();
    assert_eq!(done.info.state, WorkerState::Finished, "{done:?}");
    assert_eq!(done.info.diff_stat.map(|d| d.files), Some(1), "{done:?}");
    assert!(!ws.join("there.txt").exists());
    assert!(Path::new(&done.info.worktree).join("there.txt").is_file());
    assert!(git(&ws, &["log", "--format=%s", &done.info.branch]).contains(&format!("vak: worker {}", w.id)));
    // A wait cancelled stops the child.
    let w = sp.spawn(spawn("/sleep 60000", false)).await.unwrap();
    let cancel = CancellationToken::new();
    cancel.cancel();
    let got = sp.wait(&w.id, cancel).await.unwrap();
    assert_eq!(got.info.state, WorkerState::Cancelled, "{got:?}");
    assert_eq!(workers(&s, &sid).await.len(), 3);
    // The parent's stream told each spawn and each settling.
    let mut seen = Vec::new();
    while seen.iter().filter(|p| *p == "finished").count() < 3 {
        let f = sse.next().await.expect("the parent's stream ends early");
        if f.event == "worker" {
            assert_eq!(f.body()["worker"]["kind"], "worker");
            seen.push(f.body()["phase"].as_str().unwrap().to_string());
        }
    }
    assert_eq!(seen.iter().filter(|p| *p == "spawned").count(), 3, "{seen:?}");
    s.stop().await;
}

#[tokio::test]
async fn a_conflicting_keep_changes_nothing_and_names_the_paths() {
    let s = server().await;
    let ws = s.workspace.clone();
    init_repo(&ws);
    let sid = s.create_session().await;
    let c = bestofn(&s, &sid, "/write cand.txt theirs", 2).await;
    until_all(&s, &sid, "finished", |w| w["state"] == "finished").await;
    // The workspace's branch moved on with its own cand.txt.
    std::fs::write(ws.join("cand.txt"), "ours\n").unwrap();
    git(&ws, &["add", "cand.txt"]);
    git(&ws, &["commit", "-q", "-m", "ours"]);
    let head = git(&ws, &["rev-parse", "HEAD"]);
    let (status, b) = s
        .post(&format!("/sessions/{sid}/keep"), json!({"candidate": c[0].0}))
        .await;
    assert_eq!(status, 409, "{b}");
    assert_eq!(b["error"]["reason"], "merge_conflict", "{b}");
    assert!(
        b["error"]["message"].as_str().unwrap().contains("cand.txt"),
        "{b}"
    );
    assert_eq!(git(&ws, &["rev-parse", "HEAD"]), head);
    assert_eq!(git(&ws, &["status", "--porcelain"]), "");
    assert_eq!(std::fs::read_to_string(ws.join("cand.txt")).unwrap(), "ours\n");
    // Both candidates are still there to keep or discard.
    assert_eq!(workers(&s, &sid).await.len(), 2);
    assert!(c.iter().all(|c| Path::new(&c.2).is_dir()));
    s.stop().await;
}
