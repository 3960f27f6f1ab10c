//! The budget and the usage digest on the real binary (issue 29): a `vak serve` whose config.toml prices the offline model and sets `[finops] max_day_usd`; runs that cross 80% and then 100% leave exactly two `budget_alert` rows in the cost ledger, `GET /digest` and GetDigest report the spend and tokens, and a window outside 1 to 90 days is a 400 naming `days`.

use crate::support::{Frame, Serve, Sse, TestServer};
use serde_json::Value;
use std::path::Path;
use vak::proto::v1 as pb;

/// $1.00 a day; each input token of the offline model (a word of the
/// prompt) costs 10 cents, its output nothing, so a run's cost is exact.
const CONFIG: &str = "[automation]\ntimezone = \"UTC\"\n\n[finops]\nmax_day_usd = 1.0\n\n\
[finops.prices.\"offline/offline\"]\ninput_per_mtok = 100000\noutput_per_mtok = 0\n";

/// Runs `prompt` in `sid` to its end.
async fn run(s: &TestServer, sse: &mut Sse, sid: &str, prompt: &str) -> Vec<Frame> {
    let (status, body) = s.run(sid, prompt).await;
    assert_eq!(status, 202, "{body}");
    let frames = sse.until("run_finished").await;
    crate::support::assert_completed(&frames);
    frames
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
    let sid = s.create_session().await;
    let mut sse = s.events(&sid, None).await;

    let empty = today(&s).await;
    assert_eq!(empty["timezone"], "UTC");
    assert_eq!(usd(&empty["max_day_usd"]), 1.0);
    let date = empty["days"][0]["date"].as_str().unwrap().to_string();

    // 8 words: $0.80, 80% of the day's budget.
    run(&s, &mut sse, &sid, "one two three four five six seven eight").await;
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

    // 2 more: $1.00, the limit.
    run(&s, &mut sse, &sid, "nine ten").await;
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
    assert!((usd(&day["by_session"][&sid]["usd"]) - 1.0).abs() < 1e-9, "{d}");
    assert_eq!(d["total"]["input_tokens"], 10, "{d}");
    assert!(
        d.get("unpriced")
            .is_none_or(|u| u.as_array().is_some_and(Vec::is_empty)),
        "{d}"
    );
    assert_eq!(alert_levels(home.path(), &date), [80, 100]);

    // Past the limit: spend goes on, no level alerts twice.
    run(&s, &mut sse, &sid, "eleven").await;
    let d = today(&s).await;
    assert!((usd(&d["days"][0]["usd"]) - 1.1).abs() < 1e-9, "{d}");
    assert_eq!(alert_levels(home.path(), &date), [80, 100]);
    let all = rows(home.path(), &date);
    let usage: Vec<&Value> = all.iter().filter(|r| r["kind"] == "usage").collect();
    assert_eq!(usage.len(), 3);
    for r in &usage {
        assert_eq!(
            (
                r["session_id"].as_str(),
                r["provider"].as_str(),
                r["model"].as_str()
            ),
            (Some(sid.as_str()), Some("offline"), Some("offline")),
            "{r}"
        );
        assert!(r["request_id"].as_str().is_some_and(|id| !id.is_empty()), "{r}");
    }

    let (status, admin) = s.get("/admin/status").await;
    assert_eq!(status, 200, "{admin}");
    assert!((usd(&admin["today_usd"]) - 1.1).abs() < 1e-9, "{admin}");
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
    assert_eq!(d.days[2].input_tokens, 11);
    assert_eq!(d.total.unwrap().calls, 3);
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
