//! The budget and the usage digest on the real binary (issue 29): a `vak serve` whose config.toml prices the offline model and sets `[finops] max_day_usd`; runs that cross 80% and then 100% leave exactly two `budget_alert` rows in the cost ledger and deliver two `background_result` alerts to the session once it is idle, `GET /digest` and GetDigest report the spend and tokens, and a window outside 1 to 90 days is a 400 naming `days`.

use crate::support::{Frame, Serve, Sse, TestServer};
use serde_json::Value;
use std::path::Path;
use vak::proto::v1 as pb;

/// $1.00 a day; each input token of the offline model (a word of the
/// prompt) costs 10 cents, its output nothing, so a run's cost is exact.
const CONFIG: &str = "[automation]\ntimezone = \"UTC\"\n\n[finops]\nmax_day_usd = 1.0\n\n\
[finops.prices.\"offline/offline\"]\ninput_per_mtok = 100000\noutput_per_mtok = 0\n";

/// Runs `prompt` in `sid` to its end; its frames (and any before them) join `seen`.
async fn run(s: &TestServer, sse: &mut Sse, sid: &str, prompt: &str, seen: &mut Vec<Frame>) {
    let (status, body) = s.run(sid, prompt).await;
    assert_eq!(status, 202, "{body}");
    let frames = sse.until("run_finished").await;
    let mine = frames
        .iter()
        .position(|f| f.event == "user_message")
        .expect("the run's user_message");
    crate::support::assert_completed(&frames[mine..]);
    assert!(
        frames[mine..].iter().all(|f| f.event != "background_result"),
        "never inside a run: {frames:?}"
    );
    seen.extend(frames);
}

/// The background results among `frames`.
fn background(frames: &[Frame]) -> Vec<&Value> {
    frames
        .iter()
        .filter(|f| f.event == "background_result")
        .map(Frame::body)
        .collect()
}

/// `GET /digest?days=1` (which reads after every usage recorded before it).
async fn today(s: &TestServer) -> Value {
    let (status, d) = s.get("/digest?days=1").await;
    assert_eq!(status, 200, "{d}");
    assert_eq!(d["days"].as_array().map(Vec::len), Some(1), "{d}");
    d
}

/// The cost ledger's rows of `date`.
fn rows(home: &Path, date: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(home.join("costs").join(format!("{date}.jsonl"))).unwrap_or_default();
    text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn alert_levels(home: &Path, date: &str) -> Vec<u64> {
    rows(home, date)
        .iter()
        .filter(|r| r["kind"] == "budget_alert")
        .map(|r| r["level"].as_u64().unwrap())
        .collect()
}

fn usd(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("a number of dollars: {v}"))
}

#[tokio::test]
async fn runs_crossing_80_and_100_percent_record_two_alerts_and_the_digest_has_the_spend() {
    let home = tempfile::tempdir().unwrap();
    std::fs::write(home.path().join("config.toml"), CONFIG).unwrap();
    let served = Serve::new().home(home.path()).start().await;
    let s = served.api();
    // Three sessions: a delivered alert is part of a session's next input
    // (the model hears of it), which the offline model would count as
    // tokens; each run here is in a session that has heard nothing yet.
    let (a, b, c) = (
        s.create_session().await,
        s.create_session().await,
        s.create_session().await,
    );
    let mut sse_a = s.events(&a, None).await;
    let mut sse_b = s.events(&b, None).await;
    let mut sse_c = s.events(&c, None).await;
    let (mut seen_a, mut seen_b, mut seen_c) = (Vec::new(), Vec::new(), Vec::new());

    let empty = today(&s).await;
    assert_eq!(empty["timezone"], "UTC");
    assert_eq!(usd(&empty["max_day_usd"]), 1.0);
    let date = empty["days"][0]["date"].as_str().unwrap().to_string();

    // 8 words in a: $0.80, 80% of the day's budget.
    run(
        &s,
        &mut sse_a,
        &a,
        "one two three four five six seven eight",
        &mut seen_a,
    )
    .await;
    let d = today(&s).await;
    let day = &d["days"][0];
    assert!((usd(&day["usd"]) - 0.8).abs() < 1e-9, "{d}");
    assert_eq!(day["input_tokens"], 8, "{d}");
    assert_eq!(
        alert_levels(home.path(), &date),
        [80],
        "{:?}",
        rows(home.path(), &date)
    );

    // 2 words in b: $1.00, the limit.
    run(&s, &mut sse_b, &b, "nine ten", &mut seen_b).await;
    let d = today(&s).await;
    let day = &d["days"][0];
    assert!((usd(&day["usd"]) - 1.0).abs() < 1e-9, "{d}");
    assert!((usd(&d["today_usd"]) - 1.0).abs() < 1e-9, "{d}");
    assert_eq!(day["input_tokens"], 10, "{d}");
    assert!(
        day["output_tokens"].as_u64().unwrap() > 0,
        "the offline model reports its output: {d}"
    );
    assert_eq!(day["runs"], 2, "{d}");
    let by_model = &day["by_model"]["offline/offline"];
    assert_eq!(
        (by_model["calls"].clone(), by_model["input_tokens"].clone()),
        (2.into(), 10.into()),
        "{d}"
    );
    assert!((usd(&day["by_session"][&a]["usd"]) - 0.8).abs() < 1e-9, "{d}");
    assert!((usd(&day["by_session"][&b]["usd"]) - 0.2).abs() < 1e-9, "{d}");
    assert_eq!(d["total"]["input_tokens"], 10, "{d}");
    assert!(
        d.get("unpriced")
            .is_none_or(|u| u.as_array().is_some_and(Vec::is_empty)),
        "{d}"
    );
    assert_eq!(alert_levels(home.path(), &date), [80, 100]);

    // 1 word in c, past the limit: spend goes on, no level alerts twice.
    run(&s, &mut sse_c, &c, "eleven", &mut seen_c).await;
    let d = today(&s).await;
    assert!((usd(&d["days"][0]["usd"]) - 1.1).abs() < 1e-9, "{d}");
    assert_eq!(d["days"][0]["runs"], 3, "{d}");
    assert_eq!(alert_levels(home.path(), &date), [80, 100]);
    let all = rows(home.path(), &date);
    let usage: Vec<&Value> = all.iter().filter(|r| r["kind"] == "usage").collect();
    let sessions: Vec<&str> = usage.iter().map(|r| r["session_id"].as_str().unwrap()).collect();
    assert_eq!(sessions, [a.as_str(), b.as_str(), c.as_str()]);
    for r in &usage {
        assert_eq!(
            (r["provider"].as_str(), r["model"].as_str()),
            (Some("offline"), Some("offline")),
            "{r}"
        );
        assert!(r["request_id"].as_str().is_some_and(|id| !id.is_empty()), "{r}");
    }

    // The alerts reach the sessions that had spent when each level was
    // crossed, each once, when they are idle: a both, b the 100% one.
    while background(&seen_a).len() < 2 {
        seen_a.push(sse_a.next().await.expect("the stream goes on"));
    }
    while background(&seen_b).is_empty() {
        seen_b.push(sse_b.next().await.expect("the stream goes on"));
    }
    let shape = |frames: &[Frame]| -> Vec<(String, String, String, bool)> {
        background(frames)
            .iter()
            .map(|b| {
                let field = |k: &str| b[k].as_str().unwrap_or_default().to_string();
                (field("source"), field("reason"), field("id"), b["alert"] == true)
            })
            .collect()
    };
    let alert = |level: u32| {
        (
            "budget".to_string(),
            format!("budget_{level}"),
            format!("budget:{date}:{level}"),
            true,
        )
    };
    assert_eq!(shape(&seen_a), [alert(80), alert(100)]);
    assert_eq!(shape(&seen_b), [alert(100)]);
    assert!(background(&seen_c).is_empty(), "c spent after both levels");
    let text = background(&seen_a)[0]["text"].as_str().unwrap().to_string();
    assert!(text.contains("$0.80 of the $1.00 daily budget (80%)"), "{text}");
    let (_, t) = s.get(&format!("/sessions/{a}/transcript")).await;
    let kept = t["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "background")
        .count();
    assert_eq!(kept, 2, "{t}");
    // Nothing more arrives: one more run in a ends with no third alert.
    run(&s, &mut sse_a, &a, "twelve", &mut seen_a).await;
    assert_eq!(shape(&seen_a).len(), 2);
    assert_eq!(alert_levels(home.path(), &date), [80, 100]);

    let (status, admin) = s.get("/admin/status").await;
    assert_eq!(status, 200, "{admin}");
    let spent = usd(&admin["today_usd"]);
    assert!(spent > 1.1, "{admin}");
    assert_eq!(usd(&admin["max_day_usd"]), 1.0, "{admin}");

    // The same over gRPC.
    let mut g = s.grpc().await;
    let d = g
        .get_digest(pb::GetDigestRequest { days: Some(3) })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(d.days.len(), 3);
    assert_eq!(d.days[2].date, date);
    assert_eq!(d.total.unwrap().calls, 4);
    assert!((d.today_usd - spent).abs() < 1e-9);
    assert_eq!(d.days[0].runs, 0, "the days before are zeros");
    let e = g
        .get_digest(pb::GetDigestRequest { days: Some(91) })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().contains("days"), "{}", e.message());
    served.vak.terminate().await;
}

#[tokio::test]
async fn a_window_outside_1_to_90_days_is_a_400_naming_days() {
    let served = Serve::new().start().await;
    let s = served.api();
    for q in ["days=0", "days=91", "days=abc", "days=-1"] {
        let (status, body) = s.get(&format!("/digest?{q}")).await;
        assert_eq!(status, 400, "{q}: {body}");
        assert_eq!(body["error"]["code"], "invalid_argument", "{q}: {body}");
        assert!(
            body["error"]["message"].as_str().unwrap().contains("days"),
            "{q}: {body}"
        );
    }
    let (status, body) = s.get("/digest?day=3").await;
    assert_eq!(status, 400, "an unknown parameter: {body}");
    // No window: the last 7 days; no budget, nothing spent.
    let (status, d) = s.get("/digest").await;
    assert_eq!(status, 200, "{d}");
    assert_eq!(d["days"].as_array().map(Vec::len), Some(7), "{d}");
    assert!(d.get("max_day_usd").is_none(), "no [finops] max_day_usd: {d}");
    let (status, d) = s.get("/digest?days=90").await;
    assert_eq!(
        (status, d["days"].as_array().map(Vec::len)),
        (200, Some(90)),
        "{d}"
    );
    served.vak.terminate().await;
}

#[tokio::test]
async fn a_side_run_and_a_compaction_are_priced_as_the_sessions_calls() {
    let home = tempfile::tempdir().unwrap();
    // Prices without a budget: no alert joins the session's input.
    std::fs::write(
        home.path().join("config.toml"),
        CONFIG.replace("max_day_usd = 1.0\n", ""),
    )
    .unwrap();
    let served = Serve::new().home(home.path()).start().await;
    let s = served.api();
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;
    let mut seen = Vec::new();
    run(&s, &mut sse, &sid, "alpha beta gamma", &mut seen).await;
    let (status, side) = s
        .post(
            &format!("/sessions/{sid}/side"),
            serde_json::json!({"question": "delta epsilon"}),
        )
        .await;
    assert_eq!(status, 202, "{side}");
    let side_id = side["side_id"].as_str().unwrap().to_string();
    loop {
        let f = sse.next().await.expect("the side run's frames");
        if f.event == "side" && f.body()["side_id"] == side_id.as_str() && f.body().get("finished").is_some()
        {
            break;
        }
    }
    let (status, c) = s
        .post(&format!("/sessions/{sid}/compact"), serde_json::json!({}))
        .await;
    assert_eq!(status, 200, "{c}");

    let d = today(&s).await;
    assert!(d.get("max_day_usd").is_none(), "{d}");
    let date = d["days"][0]["date"].as_str().unwrap().to_string();
    let mine = &d["days"][0]["by_session"][&sid];
    assert_eq!(mine["calls"], 3, "the run, the side run and the compaction: {d}");
    assert_eq!(
        d["days"][0]["runs"], 2,
        "the run and the side run; a compaction on request is none: {d}"
    );
    let all = rows(home.path(), &date);
    let ids: Vec<Option<&str>> = all
        .iter()
        .filter(|r| r["kind"] == "usage")
        .map(|r| r["request_id"].as_str())
        .collect();
    assert_eq!(ids.len(), 3, "{all:?}");
    assert_eq!(ids[1], Some(side_id.as_str()), "{all:?}");
    assert_eq!(ids[2], None, "{all:?}");
    assert_eq!(
        all.iter().filter(|r| r["kind"] == "usage").nth(1).unwrap()["input_tokens"],
        2,
        "the side question's words: {all:?}"
    );
    served.vak.terminate().await;
}

/// Fires task `id` now and waits (bounded) for that fire's outcome; the task.
async fn fire_now(s: &TestServer, id: &str) -> Value {
    let (st, v) = s
        .post(&format!("/tasks/{id}/run-now"), serde_json::json!({}))
        .await;
    assert_eq!(st, 202, "{v}");
    let before = v["task"]["last_fire"]["slot"].clone();
    let deadline = tokio::time::Instant::now() + crate::support::DEADLINE;
    loop {
        let (st, t) = s.get(&format!("/tasks/{id}")).await;
        assert_eq!(st, 200, "{t}");
        let last = &t["task"]["last_fire"];
        if last["slot"] != before && last["outcome"].as_str().is_some_and(|o| o != "started") {
            return t["task"].clone();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the fire never settled: {t}"
        );
        crate::support::poll::pause().await;
    }
}

#[tokio::test]
async fn past_the_limit_with_stop_at_limit_a_task_fire_is_refused_and_a_conversation_is_not() {
    let home = tempfile::tempdir().unwrap();
    let config = CONFIG.replace("max_day_usd = 1.0\n", "max_day_usd = 1.0\nstop_at_limit = true\n");
    std::fs::write(home.path().join("config.toml"), config).unwrap();
    let served = Serve::new().home(home.path()).start().await;
    let s = served.api();
    let (a, b) = (s.create_session().await, s.create_session().await);
    let (st, t) = s
        .post(
            "/tasks",
            serde_json::json!({"name": "tick", "script": "echo tick", "session_id": a}),
        )
        .await;
    assert_eq!(st, 201, "{t}");
    let id = t["task"]["id"].as_str().unwrap().to_string();

    // Under the budget a fire goes ahead and is counted.
    let task = fire_now(&s, &id).await;
    assert_eq!(task["last_fire"]["outcome"], "delivered", "{task}");
    // 11 words: $1.10, past the limit.
    let mut sse = s.events(&b, None).await;
    let mut seen = Vec::new();
    run(
        &s,
        &mut sse,
        &b,
        "one two three four five six seven eight nine ten eleven",
        &mut seen,
    )
    .await;
    let d = today(&s).await;
    assert!((usd(&d["today_usd"]) - 1.1).abs() < 1e-9, "{d}");

    let task = fire_now(&s, &id).await;
    let last = &task["last_fire"];
    assert_eq!(last["outcome"], "budget_exceeded", "{task}");
    let why = last["message"].as_str().unwrap_or_default();
    assert!(why.contains("max_day_usd") && why.contains("$1.10"), "{task}");
    let d = today(&s).await;
    assert_eq!(d["tasks_fired"], 1, "a refused fire ran nothing: {d}");
    let date = d["days"][0]["date"].as_str().unwrap().to_string();
    let fires: Vec<Value> = rows(home.path(), &date)
        .into_iter()
        .filter(|r| r["kind"] == "fire")
        .collect();
    assert_eq!(fires.len(), 1, "{fires:?}");
    assert_eq!(
        (fires[0]["task_id"].as_str(), fires[0]["outcome"].as_str()),
        (Some(id.as_str()), Some("delivered"))
    );

    // A conversation is never refused by the budget.
    run(&s, &mut sse, &b, "still talking", &mut seen).await;
    served.vak.terminate().await;
}
