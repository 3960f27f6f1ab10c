//! A ledger write that fails (here: past a file-size limit, EFBIG, a real
//! kernel refusal like ENOSPC) stops only its session: nothing unwritten is
//! ever shown, streams get session_closed with the reason, other sessions go
//! on, and after a restart every seq a client saw is on disk as it was seen.
//! The test runs in a process of its own (`support::own_process`): the file-size
//! limit is process-wide.

use crate::support::*;
use serde_json::{json, Value};
use std::collections::BTreeMap;

fn set_file_size_limit(bytes: u64) {
    let lim = libc::rlimit {
        rlim_cur: bytes,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: plain syscalls on this process's own limits and signal disposition.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
        assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &lim), 0);
    }
}

#[tokio::test]
async fn a_failed_ledger_write_stops_only_its_session_and_no_seen_seq_is_lost_or_reused() {
    if !own_process("storage::a_failed_ledger_write_stops_only_its_session_and_no_seen_seq_is_lost_or_reused")
    {
        return;
    }
    let s = TestServer::start().await;
    let full = s.create_session().await;
    let healthy = s.create_session().await;
    // The first run is admitted while writes succeed.
    let (_, first) = s
        .post(
            &format!("/sessions/{full}/run"),
            json!({"prompt": "hello", "request_id": "before-full"}),
        )
        .await;
    assert_eq!(first["state"], "started");
    let mut sse = s.events(&full, Some(0)).await;
    sse.until("run_finished").await;

    // Ledgers may now grow to 1 MiB; the burst needs about 10.
    set_file_size_limit(1 << 20);
    let (code, _) = s.run(&full, "/burst 200000").await;
    assert_eq!(code, 202);
    let mut seen: BTreeMap<u64, Value> = BTreeMap::new();
    let closed = loop {
        let f = sse.next().await.expect("the stream ends with session_closed");
        if f.event == "session_closed" {
            break f;
        }
        assert_ne!(f.event, "run_finished", "the run cannot finish: {f:?}");
        seen.insert(f.seq(), f.data.clone());
    };
    let reason = closed.body()["reason"].as_str().unwrap().to_string();
    assert!(reason.starts_with("storage_failed: "), "{reason}");
    assert!(reason.contains("too large"), "the OS error is named: {reason}");
    assert!(sse.next().await.is_none(), "the stream ends after session_closed");
    let max_seen = *seen.keys().last().unwrap();
    let min_seen = *seen.keys().next().unwrap();
    assert!(max_seen > 1000, "it failed mid-burst: {max_seen}");

    // The stopped session refuses work with the reason; a retry of an id
    // admitted before the failure is still a duplicate.
    let resp = s
        .http()
        .post(format!("{}/sessions/{full}/run", s.url))
        .json(&json!({"prompt": "more"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.headers()["retry-after"], "1", "it will pass");
    let code = resp.status().as_u16();
    let e: Value = resp.json().await.unwrap();
    assert_eq!(
        (code, e["error"]["code"].as_str()),
        (503, Some("unavailable")),
        "{e}"
    );
    assert!(e["error"]["message"]
        .as_str()
        .unwrap()
        .starts_with("storage_failed"));
    let (_, h) = s.get("/health").await;
    assert_eq!(h["status"], "degraded");
    assert_eq!(h["storage_failures"][0]["session_id"], full.as_str());

    // Another session, whose ledger is small, keeps working.
    let mut other = s.events(&healthy, None).await;
    let (_, adm) = s.run(&healthy, "still here").await;
    assert_eq!(adm["state"], "started");
    let done = other.until("run_finished").await;
    assert_eq!(text_of(&done), "echo: still here");

    // Space comes back; after a restart every seq any client saw is on disk
    // with what the client saw, and nothing is numbered twice.
    set_file_size_limit(libc::RLIM_INFINITY);
    let (home, ws) = (s.home.clone(), s.workspace.clone());
    let _keep = s.stop().await;
    let s = TestServer::start_in(&home, &ws, |_| {}).await;
    let (_, dup) = s
        .post(
            &format!("/sessions/{full}/run"),
            json!({"prompt": "hello", "request_id": "before-full"}),
        )
        .await;
    assert_eq!(dup["state"], "duplicate", "admitted before: never runs twice");
    let mut replay = s.events(&full, Some(0)).await;
    let mut settled = replay.until("run_finished").await;
    settled.extend(replay.until("run_finished").await);
    let mut last = 0;
    for f in &settled {
        assert_eq!(f.seq(), last + 1, "gap-free");
        last = f.seq();
        // A slow client may have had deltas merged (a merged frame carries
        // the last seq it covers): other frames must match one for one.
        match seen.get(&f.seq()) {
            Some(was) if f.data.get("text_delta").is_none() => {
                assert_eq!(&f.data, was, "seq {} is what the client saw", f.seq())
            }
            _ => {}
        }
    }
    let delta = |d: &Value| d["text_delta"]["text"].as_str().unwrap_or_default().to_string();
    let seen_text: String = seen.values().map(delta).collect();
    let disk_text: String = settled
        .iter()
        .filter(|f| (min_seen..=max_seen).contains(&f.seq()))
        .map(|f| delta(&f.data))
        .collect();
    assert_eq!(seen_text, disk_text, "the text the client saw is on disk");
    assert!(
        last > max_seen,
        "the seen seqs are all on disk ({last} > {max_seen})"
    );
    assert_eq!(settled.last().unwrap().body()["outcome"], "failed");
    let (_, h) = s.get("/health").await;
    assert_eq!(h["status"], "ok");
    let (_, again) = s.run(&full, "after").await;
    assert_eq!(again["state"], "started");
    let next = replay.until("run_finished").await;
    assert_eq!(next[0].seq(), last + 1, "numbering continues, never reused");
    assert_eq!(text_of(&next), "echo: after");
}
