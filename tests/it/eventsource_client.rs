//! A third-party SSE client on /stream: the `eventsource` npm package, driven by
//! tests/node/follow.mjs, follows three sessions through a proxy; the proxy cuts the
//! connection mid-run, and the library reconnects by itself with the cursor vector as
//! Last-Event-ID and resumes every session with no loss and no duplicate.

use crate::support::*;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};

fn node_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/node")
}

/// The script's stdout, one JSON line at a time, with its stderr kept for failure messages.
struct Script {
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    stderr: Arc<Mutex<String>>,
    child: tokio::process::Child,
    seen: Vec<Value>,
}

impl Script {
    async fn next(&mut self) -> Value {
        let line = tokio::time::timeout(DEADLINE, self.lines.next_line())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "follow.mjs printed nothing within the deadline; stderr:\n{}",
                    self.stderr()
                )
            })
            .unwrap()
            .unwrap_or_else(|| panic!("follow.mjs ended early; stderr:\n{}", self.stderr()));
        let v: Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("a JSON line from follow.mjs: {line:?}: {e}"));
        self.seen.push(v.clone());
        v
    }

    /// Reads lines until `done` holds over everything seen so far.
    async fn until(&mut self, done: impl Fn(&[Value]) -> bool) {
        while !done(&self.seen) {
            self.next().await;
        }
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }
}

/// The agent lines ({id, data}) of `sid`.
fn agent_of<'a>(lines: &'a [Value], sid: &str) -> Vec<&'a Value> {
    lines
        .iter()
        .filter(|l| l.get("id").is_some() && l["data"]["session_id"] == sid)
        .collect()
}

fn count(lines: &[Value], sid: &str, kind: &str) -> usize {
    agent_of(lines, sid)
        .iter()
        .filter(|l| l["data"].get(kind).is_some())
        .count()
}

#[tokio::test]
async fn the_eventsource_package_reconnects_through_a_cut_and_resumes_every_session() {
    let dir = node_dir();
    assert!(
        dir.join("node_modules/eventsource/package.json").exists(),
        "{} has no node_modules/eventsource: run `npm ci --prefix tests/node` (make test does it)",
        dir.display()
    );
    // Permission "ask": each run parks on an approval after its first burst, so the cut
    // lands mid-run by construction.
    let s = TestServer::start().await;
    let proxy = Proxy::start(s.addr).await;
    let mut sids = Vec::new();
    let mut watchers = Vec::new();
    for _ in 0..3 {
        let sid = s.create_session().await;
        watchers.push(s.events(&sid, None).await);
        sids.push(sid);
    }

    let mut child = tokio::process::Command::new("node")
        .arg(dir.join("follow.mjs"))
        .arg(&proxy.url)
        .arg(TOKEN)
        .args(&sids)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("node starts (Node.js 20 or later must be on PATH)");
    let stderr = Arc::new(Mutex::new(String::new()));
    let mut err = child.stderr.take().unwrap();
    let sink = stderr.clone();
    tokio::spawn(async move {
        let mut buf = [0u8; 4096];
        while let Ok(n) = err.read(&mut buf).await {
            if n == 0 {
                break;
            }
            sink.lock().unwrap().push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    let mut script = Script {
        lines: BufReader::new(child.stdout.take().unwrap()).lines(),
        stderr,
        child,
        seen: Vec::new(),
    };
    let opened = script.next().await;
    assert_eq!(opened["event"], "stream_opened", "{opened}");
    let expected_start: String = sids
        .iter()
        .map(|s| format!("{s}:0"))
        .collect::<Vec<_>>()
        .join(",");
    assert_eq!(opened["data"]["cursor"], expected_start.as_str());

    const PROMPT: &str = "/burst 150\n/write out.txt cut\n/burst 150";
    for sid in &sids {
        assert_eq!(s.run(sid, PROMPT).await.0, 202);
    }
    script
        .until(|l| sids.iter().all(|sid| count(l, sid, "text_delta") >= 1))
        .await;
    assert_eq!(proxy.cut(), 1, "one connection carries all three sessions");

    // Let every run finish; the library, not this test, reconnects.
    let mut direct: Vec<Vec<Frame>> = Vec::new();
    for (sid, w) in sids.iter().zip(watchers.iter_mut()) {
        let mut frames = w.until("approval_requested").await;
        let rid = frames.last().unwrap().body()["request_id"]
            .as_str()
            .unwrap()
            .to_string();
        let (code, _) = s
            .post(
                &format!("/sessions/{sid}/approvals/{rid}"),
                json!({"approve": true}),
            )
            .await;
        assert_eq!(code, 200);
        frames.extend(w.until("run_finished").await);
        direct.push(frames);
    }
    script
        .until(|l| sids.iter().all(|sid| count(l, sid, "run_finished") == 1))
        .await;
    let status = tokio::time::timeout(DEADLINE, script.child.wait())
        .await
        .expect("follow.mjs exits after the last run_finished")
        .unwrap();
    assert!(
        status.success(),
        "follow.mjs failed: {status}; stderr:\n{}",
        script.stderr()
    );

    let lines = script.seen.clone();
    assert!(
        !lines.iter().any(|l| l["event"] == "resync"),
        "nothing outgrew the ring: {lines:?}"
    );
    let opens: Vec<usize> = lines
        .iter()
        .enumerate()
        .filter(|(_, l)| l["event"] == "stream_opened")
        .map(|(i, _)| i)
        .collect();
    assert_eq!(
        opens.len(),
        2,
        "the library reconnected exactly once; stderr:\n{}",
        script.stderr()
    );
    let last_before_cut = lines[..opens[1]]
        .iter()
        .rev()
        .find_map(|l| l["id"].as_str())
        .expect("agent frames arrived before the cut")
        .to_string();
    let heads = proxy.request_heads();
    assert_eq!(heads.len(), 2, "{heads:?}");
    assert_eq!(header_of(&heads[0], "last-event-id"), None);
    assert_eq!(
        header_of(&heads[1], "last-event-id").as_deref(),
        Some(last_before_cut.as_str()),
        "the reconnect carried the last id the library saw"
    );
    assert_eq!(
        lines[opens[1]]["data"]["cursor"],
        last_before_cut.as_str(),
        "the second stream resumed from that vector"
    );

    let expected_text: String = (0..150).chain(0..150).map(|i| format!("t{i} ")).collect();
    for (sid, frames) in sids.iter().zip(&direct) {
        let agent = agent_of(&lines, sid);
        let seqs: Vec<u64> = agent.iter().map(|l| l["data"]["seq"].as_u64().unwrap()).collect();
        let last = frames.last().unwrap().seq();
        assert_eq!(
            seqs,
            (1..=last).collect::<Vec<_>>(),
            "{sid}: every seq exactly once across the cut"
        );
        let datas: Vec<&Value> = agent.iter().map(|l| &l["data"]).collect();
        let expected: Vec<&Value> = frames.iter().map(|f| &f.data).collect();
        assert_eq!(datas, expected, "{sid}: the events of /sessions/:id/events");
        let text: String = agent
            .iter()
            .filter_map(|l| l["data"]["text_delta"]["text"].as_str())
            .collect();
        assert_eq!(text, expected_text, "{sid}: the text is whole");
        for l in &agent {
            let id = parse_vector(l["id"].as_str().unwrap());
            let mine = id.iter().find(|(s, _)| s == sid).unwrap().1;
            assert_eq!(mine, l["data"]["seq"].as_u64().unwrap(), "{l}");
        }
    }
}
