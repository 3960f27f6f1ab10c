//! spawn_worker through the agent loop with a fake spawner: waited answers, background ids, parallel calls, the slot bound, plan mode and no spawner.

use crate::event::{ClientEvent, RunOutcome};
use crate::host::hub::Hub;
use crate::route::Route;
use crate::session::live::Session;
use crate::worker::{Settled, Spawn, Spawner, WorkerInfo, WorkerKind, WorkerState};
use crate::{CoreConfig, PermissionMode};
use futures_util::future::BoxFuture;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// A spawner whose children answer "answer of <id>" when waited for.
#[derive(Default)]
struct Fake {
    spawned: Mutex<Vec<Spawn>>,
    /// When set, every wait must meet another at it before answering.
    meet: Option<tokio::sync::Barrier>,
    /// Waits for children whose prompt starts with "hold" end only when
    /// this is notified (or the wait is cancelled).
    release: tokio::sync::Notify,
    in_wait: AtomicUsize,
    peak: AtomicUsize,
}

fn info(id: &str, prompt: &str, state: WorkerState, summary: &str) -> WorkerInfo {
    WorkerInfo {
        id: id.into(),
        parent_id: "p".into(),
        kind: WorkerKind::Worker,
        prompt: prompt.into(),
        state,
        branch: format!("vak/p/{id}"),
        worktree: format!("/tmp/wt/{id}"),
        started_at: "2026-12-04T00:00:00Z".into(),
        summary: summary.into(),
        diff_stat: None,
        bestofn_id: String::new(),
    }
}

impl Spawner for Fake {
    fn spawn(&self, req: Spawn) -> BoxFuture<'_, crate::Result<WorkerInfo>> {
        Box::pin(async move {
            let mut spawned = self.spawned.lock().unwrap();
            spawned.push(req.clone());
            let id = format!("child{}", spawned.len());
            Ok(info(&id, &req.prompt, WorkerState::Running, ""))
        })
    }

    fn wait(&self, child: &str, cancel: CancellationToken) -> BoxFuture<'_, crate::Result<Settled>> {
        let child = child.to_string();
        Box::pin(async move {
            let prompt = {
                let spawned = self.spawned.lock().unwrap();
                let n: usize = child.trim_start_matches("child").parse().unwrap();
                spawned[n - 1].prompt.clone()
            };
            let now = self.in_wait.fetch_add(1, Ordering::SeqCst) + 1;
            self.peak.fetch_max(now, Ordering::SeqCst);
            let out = async {
                if let Some(b) = &self.meet {
                    if tokio::time::timeout(Duration::from_secs(10), b.wait())
                        .await
                        .is_err()
                    {
                        return Err(crate::Error::internal(
                            "the other worker never started: the calls ran one after the other",
                        ));
                    }
                }
                if prompt.starts_with("hold") {
                    tokio::select! {
                        _ = self.release.notified() => {}
                        _ = cancel.cancelled() => {
                            return Ok(info(&child, &prompt, WorkerState::Cancelled, ""));
                        }
                    }
                } else {
                    // Long enough for a sequential caller to be seen as one.
                    tokio::task::yield_now().await;
                }
                Ok(info(
                    &child,
                    &prompt,
                    WorkerState::Finished,
                    &format!("answer of {child}"),
                ))
            }
            .await;
            self.in_wait.fetch_sub(1, Ordering::SeqCst);
            out.map(|info| Settled {
                answer: info.summary.clone(),
                info,
            })
        })
    }
}

async fn session(
    cfg: impl FnOnce(&mut CoreConfig),
    spawner: Option<Arc<Fake>>,
) -> (Hub, Arc<Session>, tempfile::TempDir) {
    let home = tempfile::tempdir().unwrap();
    let mut c = CoreConfig::new(home.path().into(), home.path().into());
    cfg(&mut c);
    let hub = Hub::new(c, Route::offline()).unwrap();
    let s = hub.sessions().create().await.unwrap();
    // The fake in place of the hub's children table (None: no spawner at all).
    s.runtime()
        .set_spawner(spawner.map(|f| f as Arc<dyn crate::worker::Spawner>));
    (hub, s, home)
}

async fn run_to_end(s: &Arc<Session>, prompt: &str) -> Vec<ClientEvent> {
    let admitted = s.admit(prompt.into(), None).await.unwrap();
    let mut sub = s.subscribe(Some(admitted.after_seq));
    let mut seen = Vec::new();
    loop {
        match tokio::time::timeout(Duration::from_secs(30), sub.recv()).await {
            Ok(Some(crate::stream::delivery::Delivery::Frame(f))) => {
                seen.push(f.event.clone());
                if matches!(f.event, ClientEvent::RunFinished { .. }) {
                    return seen;
                }
            }
            Ok(Some(_)) => {}
            other => panic!("the stream ended or stalled: {:?}", other.is_ok()),
        }
    }
}

/// The spawn_worker results, in the order they were published.
fn results(seen: &[ClientEvent]) -> Vec<(bool, String)> {
    let calls: Vec<&str> = seen
        .iter()
        .filter_map(|e| match e {
            ClientEvent::ToolCall { call_id, tool, .. } if tool == "spawn_worker" => Some(call_id.as_str()),
            _ => None,
        })
        .collect();
    seen.iter()
        .filter_map(|e| match e {
            ClientEvent::ToolResult { call_id, ok, output } if calls.contains(&call_id.as_str()) => {
                Some((*ok, output.clone()))
            }
            _ => None,
        })
        .collect()
}

fn text(seen: &[ClientEvent]) -> String {
    seen.iter()
        .filter_map(|e| match e {
            ClientEvent::TextDelta { text } => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_waited_worker_s_final_answer_is_the_tool_result() {
    let fake = Arc::new(Fake::default());
    let (_hub, s, _home) = session(|_| {}, Some(fake.clone())).await;
    let seen = run_to_end(&s, "/worker write the README").await;
    // Default mode: it ran without asking.
    assert!(!seen
        .iter()
        .any(|e| matches!(e, ClientEvent::ApprovalRequested { .. })));
    let r = results(&seen);
    assert_eq!(r.len(), 1, "{seen:?}");
    assert!(r[0].0, "{r:?}");
    assert!(
        r[0].1
            .starts_with("answer of child1\n\n[worker child1 finished on branch vak/p/child1"),
        "{r:?}"
    );
    assert!(
        text(&seen).starts_with("worker: answer of child1"),
        "{}",
        text(&seen)
    );
    let spawned = fake.spawned.lock().unwrap().clone();
    assert_eq!(
        spawned,
        [Spawn {
            parent: s.id().to_string(),
            kind: WorkerKind::Worker,
            prompt: "write the README".into(),
            isolated: true,
            bestofn_id: String::new(),
            wait: true,
        }]
    );
}

#[tokio::test]
async fn an_unwaited_worker_answers_its_id_at_once() {
    let fake = Arc::new(Fake::default());
    let (_hub, s, _home) = session(|_| {}, Some(fake.clone())).await;
    let seen = run_to_end(
        &s,
        r#"/worker {"prompt": "hold on", "wait": false, "isolated": false}"#,
    )
    .await;
    let r = results(&seen);
    assert!(r[0].0, "{r:?}");
    let v: serde_json::Value = serde_json::from_str(&r[0].1).unwrap();
    assert_eq!(v["id"], "child1");
    assert_eq!(v["state"], "running");
    assert_eq!(v["branch"], "vak/p/child1");
    let spawned = fake.spawned.lock().unwrap()[0].clone();
    assert!(!spawned.wait && !spawned.isolated, "{spawned:?}");
    // The run ended while the child is still running.
    assert!(matches!(
        seen.last(),
        Some(ClientEvent::RunFinished {
            outcome: RunOutcome::Completed,
            ..
        })
    ));
    fake.release.notify_waiters();
}

#[tokio::test]
async fn workers_called_in_one_turn_run_in_parallel() {
    // Each wait answers only once the other has started waiting too: run
    // one after the other, the first would fail after 10 s.
    let fake = Arc::new(Fake {
        meet: Some(tokio::sync::Barrier::new(2)),
        ..Fake::default()
    });
    let (_hub, s, _home) = session(|_| {}, Some(fake.clone())).await;
    let seen = run_to_end(&s, "/worker one\n/worker two").await;
    let r = results(&seen);
    assert_eq!(r.len(), 2, "{seen:?}");
    assert!(r.iter().all(|(ok, _)| *ok), "{r:?}");
    let mut answers: Vec<_> = r
        .iter()
        .map(|(_, o)| o.lines().next().unwrap().to_string())
        .collect();
    answers.sort();
    assert_eq!(answers, ["answer of child1", "answer of child2"]);
    assert_eq!(fake.peak.load(Ordering::SeqCst), 2);
    // Each call got its own result, and the model saw both.
    let t = text(&seen);
    assert!(
        t.contains("worker: answer of child") && t.matches("worker: ").count() == 2,
        "{t}"
    );
}

#[tokio::test]
async fn waited_workers_beyond_max_workers_queue_and_unwaited_ones_are_refused() {
    let fake = Arc::new(Fake::default());
    let (_hub, s, _home) = session(|c| c.max_workers = 1, Some(fake.clone())).await;
    let seen = run_to_end(&s, "/worker a\n/worker b\n/worker c").await;
    let r = results(&seen);
    assert_eq!(r.len(), 3);
    assert!(r.iter().all(|(ok, _)| *ok), "{r:?}");
    assert_eq!(
        fake.peak.load(Ordering::SeqCst),
        1,
        "one slot: one child at a time"
    );
    // A background child holds the only slot: the next is refused, clearly.
    let seen = run_to_end(
        &s,
        "/worker {\"prompt\": \"hold\", \"wait\": false}\n/worker {\"prompt\": \"more\", \"wait\": false}",
    )
    .await;
    let r = results(&seen);
    assert!(r[0].0, "{r:?}");
    assert!(!r[1].0);
    assert!(
        r[1].1
            .contains("already has 1 worker running (the --max-workers limit)"),
        "{r:?}"
    );
    assert_eq!(
        fake.spawned.lock().unwrap().len(),
        4,
        "the refused one never started"
    );
    // Once it settles, its slot is free again.
    fake.release.notify_waiters();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while fake.in_wait.load(Ordering::SeqCst) > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the background child never settled"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let seen = run_to_end(&s, "/worker {\"prompt\": \"again\", \"wait\": false}").await;
    assert!(results(&seen)[0].0, "{seen:?}");
}

#[tokio::test]
async fn plan_mode_refuses_spawn_worker_and_nothing_starts() {
    let fake = Arc::new(Fake::default());
    let (_hub, s, _home) = session(|c| c.permission = PermissionMode::Plan, Some(fake.clone())).await;
    let seen = run_to_end(&s, "/worker edit everything").await;
    let r = results(&seen);
    assert!(!r[0].0);
    assert!(r[0].1.contains("plan mode"), "{r:?}");
    assert!(fake.spawned.lock().unwrap().is_empty());
}

#[tokio::test]
async fn without_a_spawner_the_tool_fails_clearly_and_bad_input_is_refused() {
    let (_hub, s, _home) = session(|_| {}, None).await;
    let seen = run_to_end(&s, "/worker anything").await;
    let r = results(&seen);
    assert_eq!(
        r,
        [(
            false,
            "this server cannot start workers (no spawner is set up)".to_string()
        )]
    );
    let fake = Arc::new(Fake::default());
    let (_hub, s, _home) = session(|_| {}, Some(fake.clone())).await;
    let long = "x".repeat(crate::tools::MAX_WORKER_PROMPT + 1);
    let seen = run_to_end(
        &s,
        &format!(
            "/worker {{\"prompt\": \"  \"}}\n/worker {{\"prompt\": \"p\", \"wait\": 1}}\n/worker {long}"
        ),
    )
    .await;
    let r = results(&seen);
    assert_eq!(r.len(), 3);
    assert_eq!(
        r[0],
        (false, "spawn_worker needs a prompt that is not empty".to_string())
    );
    assert_eq!(
        r[1],
        (false, "spawn_worker's `wait` must be true or false".to_string())
    );
    assert!(r[2].1.contains("accepts at most 32768"), "{r:?}");
    assert!(fake.spawned.lock().unwrap().is_empty());
}

#[tokio::test]
async fn cancelling_the_parent_cancels_a_waited_worker() {
    let fake = Arc::new(Fake::default());
    let (_hub, s, _home) = session(|_| {}, Some(fake.clone())).await;
    let admitted = s.admit("/worker hold it".into(), None).await.unwrap();
    let mut sub = s.subscribe(Some(admitted.after_seq));
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let d = tokio::time::timeout_at(deadline, sub.recv())
            .await
            .expect("stalled");
        let Some(crate::stream::delivery::Delivery::Frame(f)) = d else {
            continue;
        };
        seen.push(f.event.clone());
        match &f.event {
            ClientEvent::ToolCall { .. } => {
                // Once the child is being waited for, cancel the parent.
                while fake.in_wait.load(Ordering::SeqCst) == 0 {
                    tokio::time::timeout_at(deadline, tokio::task::yield_now())
                        .await
                        .unwrap();
                }
                s.cancel();
            }
            ClientEvent::RunFinished { outcome, .. } => {
                assert_eq!(*outcome, RunOutcome::Cancelled);
                break;
            }
            _ => {}
        }
    }
    assert_eq!(
        results(&seen),
        [(false, "the worker child1 was cancelled".to_string())]
    );
}
