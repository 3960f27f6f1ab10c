//! The presentation timeline end to end: the events of /sessions/:id/presentation/events,
//! applied to their opening snapshot, give exactly what GET /sessions/:id/presentation
//! returns (over many random runs); runtime bookkeeping never becomes an item; and a
//! timeline rebuilt from the ledger after a restart equals the one before it.

use crate::support::*;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use tempfile::TempDir;
use vak::core::PermissionMode;

/// A tiny fixed-seed linear congruential generator (Knuth's MMIX constants).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
        from[self.below(from.len() as u64) as usize]
    }
}

const WORDS: &[&str] = &["alpha", "beta", "gamma", "delta", "omega", "zeta", "kappa"];

fn words(rng: &mut Lcg) -> String {
    let n = 1 + rng.below(4);
    (0..n).map(|_| rng.pick(WORDS)).collect::<Vec<_>>().join(" ")
}

/// A random prompt of one to five directive lines.
fn random_prompt(rng: &mut Lcg) -> String {
    let lines = 1 + rng.below(5);
    (0..lines)
        .map(|_| match rng.below(12) {
            0..=3 => words(rng),
            4 | 5 => format!("/think {}", words(rng)),
            6 => "/read notes.txt".to_string(),
            7 => "/read missing.txt".to_string(),
            8 => format!("/write out{}.txt {}", rng.below(3), words(rng)),
            9 => format!("/burst {}", 1 + rng.below(20)),
            10 => format!("/bash echo {}", rng.pick(WORDS)),
            _ => format!("/fail {}", rng.pick(WORDS)),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A prompt of echo lines that then sleeps until cancelled, and the text the session shows
/// while it sleeps: a quiet moment with an item still streaming.
fn sleeping_prompt(rng: &mut Lcg) -> (String, String) {
    let lines: Vec<String> = (0..1 + rng.below(3)).map(|_| words(rng)).collect();
    let shown = lines
        .iter()
        .map(|l| format!("echo: {l}"))
        .collect::<Vec<_>>()
        .join("\n");
    (format!("{}\n/sleep 600000", lines.join("\n")), shown)
}

/// The index of the item with `id` (which must exist).
#[track_caller]
fn find(t: &Value, id: &Value) -> usize {
    t["items"]
        .as_array()
        .unwrap()
        .iter()
        .position(|i| &i["id"] == id)
        .unwrap_or_else(|| panic!("an event names item {id}, which the timeline lacks: {t}"))
}

/// Applies one presentation event (an SSE frame of /presentation/events) to a timeline,
/// following the documented semantics: a snapshot replaces it; item_started appends;
/// text_delta appends text to its item and sets the item's seq; item_replaced replaces the
/// item with its id; item_completed sets its status and seq; the timeline's seq becomes the
/// larger of its own and the event's.
#[track_caller]
fn apply(t: &mut Value, ev: &Frame) {
    let seq = ev.data["seq"]
        .as_u64()
        .expect("every presentation event has a seq");
    let body = ev.body().clone();
    match ev.event.as_str() {
        "snapshot" => *t = body,
        "item_started" => t["items"].as_array_mut().unwrap().push(body),
        "text_delta" => {
            let i = find(t, &body["item_id"]);
            let item = &mut t["items"][i];
            let text = format!(
                "{}{}",
                item["text"].as_str().unwrap(),
                body["text"].as_str().unwrap()
            );
            item["text"] = json!(text);
            item["seq"] = json!(seq);
        }
        "item_replaced" => {
            let i = find(t, &body["id"]);
            t["items"][i] = body;
        }
        "item_completed" => {
            let i = find(t, &body["item_id"]);
            t["items"][i]["status"] = body["status"].clone();
            t["items"][i]["seq"] = json!(seq);
        }
        "goal" => t["goal"] = body,
        other => panic!("unexpected presentation event {other}: {ev:?}"),
    }
    if seq > t["seq"].as_u64().unwrap() {
        t["seq"] = json!(seq);
    }
}

impl TestServer {
    /// Opens /sessions/:id/presentation/events; returns the stream and its opening snapshot.
    async fn presentation_events(&self, sid: &str) -> (Sse, Value) {
        let resp = self
            .http()
            .get(format!("{}/sessions/{sid}/presentation/events", self.url))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let mut sse = Sse::new(resp);
        let first = sse.next().await.expect("an opening frame");
        assert_eq!(
            first.event, "snapshot",
            "the stream opens with a snapshot: {first:?}"
        );
        assert_eq!(first.id, None);
        assert_eq!(first.data["session_id"], sid);
        (sse, first.body().clone())
    }

    async fn presentation(&self, sid: &str) -> Value {
        let (code, t) = self.get(&format!("/sessions/{sid}/presentation")).await;
        assert_eq!(code, 200, "{t}");
        t
    }
}

/// One session's consumer: its stream, the timeline it holds, and every event it applied.
struct Consumer {
    sid: String,
    sse: Sse,
    timeline: Value,
    events: Vec<Frame>,
}

impl Consumer {
    async fn open(s: &TestServer, sid: &str) -> Consumer {
        let (sse, timeline) = s.presentation_events(sid).await;
        Consumer {
            sid: sid.to_string(),
            sse,
            timeline,
            events: Vec::new(),
        }
    }

    /// Reads and applies the next event. A snapshot that settles a run must equal what
    /// the deltas before it had already built.
    async fn next_event(&mut self) -> Frame {
        let ev = self.sse.next().await.expect("the presentation stream stays open");
        assert_eq!(ev.data["session_id"], self.sid.as_str());
        assert_eq!(ev.id, None, "presentation events carry no id");
        if ev.event == "snapshot" {
            assert_eq!(
                &self.timeline,
                ev.body(),
                "the deltas applied to the opening snapshot build the settling snapshot"
            );
        }
        apply(&mut self.timeline, &ev);
        self.events.push(ev.clone());
        ev
    }

    /// Applies events until the snapshot that settles a run; returns that snapshot.
    async fn until_settled(&mut self) -> Value {
        loop {
            let ev = self.next_event().await;
            if ev.event == "snapshot" {
                return ev.body().clone();
            }
        }
    }

    /// While the session is quiet, the timeline built so far equals GET /presentation.
    async fn checkpoint(&self, s: &TestServer, what: &str) {
        assert_eq!(
            s.presentation(&self.sid).await,
            self.timeline,
            "mid-run ({what}): the applied events equal GET /presentation"
        );
    }
}

/// Runs `prompt` to its settling snapshot, answering approvals at random and cancelling a
/// sleeping prompt once `sleeping` is shown; at each of those quiet moments the applied
/// timeline must equal GET /presentation. Returns the snapshot and how many checkpoints ran.
async fn drive(
    s: &TestServer,
    c: &mut Consumer,
    prompt: &str,
    sleeping: Option<&str>,
    rng: &mut Lcg,
) -> (Value, usize) {
    let (code, _) = s.run(&c.sid, prompt).await;
    assert_eq!(code, 202, "{prompt}");
    let mut checkpoints = 0;
    let mut cancelled = false;
    loop {
        let ev = c.next_event().await;
        if ev.event == "snapshot" {
            return (ev.body().clone(), checkpoints);
        }
        if ev.event == "item_started" && ev.body()["kind"] == "approval" {
            // The run waits for the answer: nothing moves.
            c.checkpoint(s, "an approval is pending").await;
            checkpoints += 1;
            let rid = ev.body()["request_id"].as_str().unwrap();
            let approve = rng.below(2) == 0;
            let (code, r) = s
                .post(
                    &format!("/sessions/{}/approvals/{rid}", c.sid),
                    json!({"approve": approve}),
                )
                .await;
            assert_eq!(code, 200, "{r}");
        }
        let last = c.timeline["items"].as_array().unwrap().last().cloned();
        if let (Some(shown), Some(last), false) = (sleeping, last, cancelled) {
            if last["kind"] == "assistant_text" && last["text"] == shown {
                // The model sleeps with its text item still streaming.
                assert_eq!(last["status"], "streaming");
                c.checkpoint(s, "text is streaming").await;
                checkpoints += 1;
                let (code, _) = s.post(&format!("/sessions/{}/cancel", c.sid), json!({})).await;
                assert_eq!(code, 200);
                cancelled = true;
            }
        }
    }
}

#[tokio::test]
async fn applying_the_events_to_the_opening_snapshot_gives_the_timeline_over_random_runs() {
    // One server runs tools without asking; the other asks, and its approvals (answered at
    // random) are quiet moments to compare the timeline mid-run.
    let allow = TestServer::start_with(|c| c.core.permission = PermissionMode::Allow).await;
    let ask = TestServer::start().await;
    let mut consumers = Vec::new();
    for s in [&allow, &ask] {
        std::fs::write(s.workspace.join("notes.txt"), "some notes\nover two lines").unwrap();
        for _ in 0..2 {
            let sid = s.create_session().await;
            consumers.push((s, Consumer::open(s, &sid).await));
        }
    }
    let mut rng = Lcg(0x5eed_1234_abcd_0042);
    let mut outcomes: BTreeMap<String, usize> = BTreeMap::new();
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    let mut checkpoints = 0;
    const RUNS: usize = 40;
    for run in 0..RUNS {
        let (s, c) = &mut consumers[run % 4];
        let s: &TestServer = s;
        if run % 6 == 5 {
            // A consumer that joins later starts from a non-empty snapshot.
            let again = Consumer::open(s, &c.sid).await;
            assert_eq!(
                again.timeline, c.timeline,
                "an idle session's opening snapshot is the timeline so far"
            );
            *c = again;
        }
        let (prompt, sleeping) = if rng.below(6) == 0 {
            let (p, shown) = sleeping_prompt(&mut rng);
            (p, Some(shown))
        } else {
            (random_prompt(&mut rng), None)
        };
        let (snapshot, n) = drive(s, c, &prompt, sleeping.as_deref(), &mut rng).await;
        checkpoints += n;
        let got = s.presentation(&c.sid).await;
        assert_eq!(
            got, snapshot,
            "run {run} ({prompt:?}): GET /presentation equals the settling snapshot"
        );
        assert_eq!(got["schema_version"], 2);
        assert_eq!(got["session_id"], c.sid.as_str());
        let last = got["items"].as_array().unwrap().last().unwrap();
        assert_eq!(last["kind"], "final_result", "a settled run ends with its result");
        assert_eq!(got["seq"], last["seq"]);
        assert_eq!(got["seq"].as_u64(), Some(s.latest_seq(&c.sid).await));
        *outcomes
            .entry(last["status"].as_str().unwrap().into())
            .or_default() += 1;
    }
    for (s, c) in &consumers {
        for item in s.presentation(&c.sid).await["items"].as_array().unwrap() {
            let key = format!(
                "{}/{}",
                item["kind"].as_str().unwrap(),
                item["status"].as_str().unwrap()
            );
            *kinds.entry(key).or_default() += 1;
        }
    }
    // The seed exercises every kind of item and outcome the model can produce here.
    for kind in [
        "user_input/completed",
        "assistant_text/completed",
        "thinking/completed",
        "tool_call/completed",
        "tool_call/failed",
        "approval/approved",
        "approval/denied",
        "final_result/completed",
        "final_result/failed",
        "final_result/cancelled",
    ] {
        assert!(kinds.contains_key(kind), "{kind} never came up: {kinds:?}");
    }
    assert!(checkpoints >= 5, "only {checkpoints} mid-run checkpoints");
}

/// The seq that opened an item, from its id (derived from that seq).
#[track_caller]
fn opening_seq(item: &Value) -> u64 {
    let id = item["id"].as_str().unwrap();
    let digits: String = id
        .chars()
        .rev()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .chars()
        .rev()
        .collect();
    digits
        .parse()
        .unwrap_or_else(|_| panic!("item id {id:?} names no seq"))
}

#[tokio::test]
async fn runtime_bookkeeping_never_becomes_an_item() {
    let s = TestServer::start().await;
    let sid = s.create_session().await;
    let mut consumer = Consumer::open(&s, &sid).await;
    let mut events = s.events(&sid, None).await;
    let mut agent = Vec::new();

    // A run that waits for an approval while steering is queued (admission "queued"),
    // then runs the queued leg.
    s.run(&sid, "/write a.txt x\nfirst").await;
    agent.extend(events.until("approval_requested").await);
    let (code, adm) = s
        .post(&format!("/sessions/{sid}/steering"), json!({"text": "second"}))
        .await;
    assert_eq!((code, adm["state"].as_str()), (202, Some("queued")));
    let rid = agent.last().unwrap().body()["request_id"]
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
    agent.extend(events.until("run_finished").await);
    consumer.until_settled().await;
    // A provider failure the runtime retries before failing the run.
    s.run(&sid, "/fail boom").await;
    agent.extend(events.until("run_finished").await);
    consumer.until_settled().await;
    // A cancelled run.
    s.run(&sid, "/sleep 60000").await;
    agent.extend(events.until("turn_started").await);
    let (code, _) = s.post(&format!("/sessions/{sid}/cancel"), json!({})).await;
    assert_eq!(code, 200);
    agent.extend(events.until("run_finished").await);
    consumer.until_settled().await;

    let t = s.presentation(&sid).await;
    assert_eq!(t, consumer.timeline);
    let items = t["items"].as_array().unwrap();
    let view: Vec<(&str, &str)> = items
        .iter()
        .map(|i| (i["kind"].as_str().unwrap(), i["status"].as_str().unwrap()))
        .collect();
    assert_eq!(
        view,
        [
            ("user_input", "completed"),
            ("tool_call", "completed"),
            ("approval", "approved"),
            ("assistant_text", "completed"),
            ("user_input", "completed"),
            ("assistant_text", "completed"),
            ("final_result", "completed"),
            ("user_input", "completed"),
            ("final_result", "failed"),
            ("user_input", "completed"),
            ("final_result", "cancelled"),
        ],
        "{t}"
    );
    assert_eq!(items[4]["text"], "second");
    assert_eq!(items[8]["text"], "the model failed: boom");

    // Every item was opened by a content event, and no presentation event was caused by
    // bookkeeping (status, turn_started).
    let kind_at: BTreeMap<u64, String> = agent.iter().map(|f| (f.seq(), f.event.clone())).collect();
    assert_eq!(
        kind_at.len() as u64,
        agent.last().unwrap().seq(),
        "every seq seen"
    );
    for item in items {
        let opened_by = &kind_at[&opening_seq(item)];
        assert!(
            [
                "user_message",
                "text_delta",
                "thinking_delta",
                "tool_call",
                "approval_requested",
                "run_finished"
            ]
            .contains(&opened_by.as_str()),
            "item {item} was opened by {opened_by}"
        );
    }
    for ev in &consumer.events {
        let by = &kind_at[&ev.data["seq"].as_u64().unwrap()];
        assert!(
            by != "status" && by != "turn_started",
            "a presentation event came from {by}: {ev:?}"
        );
    }
    assert!(
        kind_at.values().filter(|k| *k == "status").count() >= 6,
        "the runs did publish bookkeeping"
    );
}

#[tokio::test]
async fn a_timeline_rebuilt_after_a_restart_equals_the_one_before() {
    let s = TestServer::start().await;
    std::fs::write(s.workspace.join("notes.txt"), "notes").unwrap();
    let a = s.create_session().await;
    let b = s.create_session().await;
    let mut ea = s.events(&a, None).await;
    let mut eb = s.events(&b, None).await;
    for prompt in [
        "/think hmm\nhello world",
        "/read notes.txt\n/burst 12",
        "/fail nope",
    ] {
        s.run(&a, prompt).await;
        ea.until("run_finished").await;
    }
    for (prompt, approve) in [("/write a.txt one\nafter", true), ("/write b.txt two", false)] {
        s.run(&b, prompt).await;
        let ask = next_approval(&mut eb).await;
        let (code, _) = s
            .post(
                &format!("/sessions/{b}/approvals/{ask}"),
                json!({"approve": approve}),
            )
            .await;
        assert_eq!(code, 200);
        eb.until("run_finished").await;
    }
    let before_a = s.presentation(&a).await;
    let before_b = s.presentation(&b).await;
    assert!(before_a["items"].as_array().unwrap().len() >= 8, "{before_a}");
    assert!(
        before_b["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|i| i["kind"] == "approval" && i["status"] == "denied"),
        "{before_b}"
    );
    drop((ea, eb));

    let (home, ws) = (s.home.clone(), s.workspace.clone());
    let mut keep: Vec<(TempDir, TempDir)> = Vec::new();
    keep.extend(s.stop().await);
    let s = TestServer::start_in(&home, &ws, |_| {}).await;
    assert_eq!(s.presentation(&a).await, before_a, "rebuilt from the ledger");
    assert_eq!(s.presentation(&b).await, before_b, "rebuilt from the ledger");
    let (_, opening) = s.presentation_events(&a).await;
    assert_eq!(opening, before_a, "the opening snapshot after the restart");

    // The rebuilt timeline goes on: new items get fresh ids after the old ones.
    let mut consumer = Consumer::open(&s, &a).await;
    s.run(&a, "after the restart").await;
    let t = consumer.until_settled().await;
    let items = t["items"].as_array().unwrap();
    let old = before_a["items"].as_array().unwrap();
    assert_eq!(&items[..old.len()], &old[..]);
    let mut ids: Vec<&str> = items.iter().map(|i| i["id"].as_str().unwrap()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), items.len(), "item ids stay unique: {t}");
}

/// Reads an event stream to its next approval_requested; returns the approval's request id.
async fn next_approval(events: &mut Sse) -> String {
    let frames = events.until("approval_requested").await;
    frames.last().unwrap().body()["request_id"]
        .as_str()
        .unwrap()
        .to_string()
}
