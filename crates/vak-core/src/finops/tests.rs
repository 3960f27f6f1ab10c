//! The owner end to end in one process: usage priced into the day's file, budget alerts once per level per day (also across a restart), the day boundary in a zone, and the digest through the handle.

use super::config::{FileFinops, Price};
use super::ledger::{self, Row};
use super::owner::Clock;
use super::Finops;
use crate::background::{BackgroundReason, BackgroundResult, BackgroundSink, BackgroundSource};
use crate::provider::TokenUsage;
use crate::route::Route;
use futures_util::future::BoxFuture;
use jiff::civil::date;
use jiff::tz::TimeZone;
use jiff::Timestamp;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;

/// Records what it is handed, in order.
struct Recorder(mpsc::UnboundedSender<(String, BackgroundResult)>);

impl BackgroundSink for Recorder {
    fn deliver(&self, session_id: &str, result: BackgroundResult) -> BoxFuture<'_, crate::Result<()>> {
        let _ = self.0.send((session_id.to_owned(), result));
        Box::pin(std::future::ready(Ok(())))
    }
}

/// The next delivery, waited for with a deadline.
async fn next(rx: &mut mpsc::UnboundedReceiver<(String, BackgroundResult)>) -> (String, BackgroundResult) {
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("a delivery within 10 s")
        .expect("the recorder lives")
}

/// A clock the test sets.
fn clock(at: &str) -> (Clock, Arc<Mutex<Timestamp>>) {
    let now = Arc::new(Mutex::new(at.parse::<Timestamp>().unwrap()));
    let read = now.clone();
    (Arc::new(move || *read.lock().unwrap()), now)
}

/// $1.00 a day; the offline model's input tokens cost 10 cents each.
fn priced(stop_at_limit: bool) -> FileFinops {
    FileFinops {
        max_day_usd: Some(1.0),
        stop_at_limit,
        prices: [(
            "offline/offline".to_string(),
            Price {
                input_per_mtok: 100_000.0,
                output_per_mtok: 0.0,
            },
        )]
        .into(),
    }
}

fn tokens(input_tokens: u64) -> TokenUsage {
    TokenUsage {
        input_tokens,
        output_tokens: 3,
        ..TokenUsage::default()
    }
}

fn alerts_in(home: &std::path::Path, day: jiff::civil::Date) -> Vec<u8> {
    ledger::read_day(&ledger::dir(home), day)
        .unwrap()
        .into_iter()
        .filter_map(|r| match r {
            Row::BudgetAlert { level, .. } => Some(level.percent()),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn each_level_alerts_once_a_day_to_the_sessions_that_spent_also_across_a_restart() {
    let home = tempfile::tempdir().unwrap();
    let (clock, _) = clock("2026-05-05T12:00:00Z");
    let (tx, mut rx) = mpsc::unbounded_channel();
    let sink: Arc<dyn BackgroundSink> = Arc::new(Recorder(tx));
    let route = Route::offline();
    let day = date(2026, 5, 5);

    let f = Finops::with_clock(home.path(), priced(false), TimeZone::UTC, clock.clone());
    f.set_sink(Arc::downgrade(&sink));
    f.record_usage("s1", Some("r1"), &route, tokens(7)).await;
    f.flush().await;
    assert!((f.today_usd() - 0.7).abs() < 1e-9, "{}", f.today_usd());
    assert!(alerts_in(home.path(), day).is_empty(), "70%: no alert");
    f.record_usage("s1", Some("r1"), &route, tokens(1)).await;
    let (to, alert) = next(&mut rx).await;
    assert_eq!(to, "s1");
    assert_eq!(alert.source, BackgroundSource::Budget);
    assert_eq!(alert.id, "budget:2026-05-05:80");
    assert_eq!(alert.reason, Some(BackgroundReason::Budget80));
    assert!(
        alert.text.contains("$0.80 of the $1.00 daily budget (80%)"),
        "{}",
        alert.text
    );
    f.record_usage("s2", Some("r2"), &route, tokens(1)).await;
    f.flush().await;
    assert!(!f.over_limit(), "90%, and stop_at_limit is off anyway");
    drop(f);

    // A restart: the spend and the 80% alert are read back.
    let f = Finops::with_clock(home.path(), priced(true), TimeZone::UTC, clock.clone());
    f.set_sink(Arc::downgrade(&sink));
    assert!((f.today_usd() - 0.9).abs() < 1e-9, "{}", f.today_usd());
    assert!(!f.over_limit());
    f.check().await;
    f.record_usage("s2", Some("r3"), &route, tokens(1)).await;
    let first = next(&mut rx).await;
    let second = next(&mut rx).await;
    let mut to = vec![first.0.clone(), second.0.clone()];
    to.sort();
    assert_eq!(to, ["s1", "s2"], "both sessions spent today");
    for (_, r) in [&first, &second] {
        assert_eq!(r.reason, Some(BackgroundReason::Budget100));
        assert_eq!(r.id, "budget:2026-05-05:100");
        assert!(
            r.text.contains("scheduled tasks do not fire again today"),
            "{}",
            r.text
        );
    }
    assert_ne!(first.1.result_id, second.1.result_id);
    assert!(f.over_limit(), "100% with stop_at_limit");
    let why = f.refusal().expect("fires are refused");
    assert!(why.contains("$1.00") && why.contains("max_day_usd"), "{why}");
    f.record_usage("s1", Some("r4"), &route, tokens(5)).await;
    f.record_fire("task_1", "fired").await;
    f.record_fire_nowait("task_2", "fired");
    f.flush().await;
    assert!(rx.try_recv().is_err(), "no level is alerted twice");
    assert_eq!(alerts_in(home.path(), day), [80, 100]);
    let fires = ledger::read_day(&ledger::dir(home.path()), day)
        .unwrap()
        .into_iter()
        .filter(|r| matches!(r, Row::Fire { .. }))
        .count();
    assert_eq!(fires, 2);
    assert_eq!(f.digest(1, Vec::new()).await.unwrap().tasks_fired, 2);
    drop(f);
    let f = Finops::with_clock(home.path(), priced(true), TimeZone::UTC, clock);
    f.record_usage("s1", None, &route, tokens(1)).await;
    f.check().await;
    f.flush().await;
    assert_eq!(
        alerts_in(home.path(), day),
        [80, 100],
        "nor after a second restart"
    );
}

#[tokio::test]
async fn the_day_ends_at_midnight_in_the_servers_zone() {
    let home = tempfile::tempdir().unwrap();
    // 23:59 in Berlin (UTC+1 in March before the switch) is 22:59 UTC.
    let (clock, now) = clock("2026-03-27T22:59:00Z");
    let (tx, mut rx) = mpsc::unbounded_channel();
    let sink: Arc<dyn BackgroundSink> = Arc::new(Recorder(tx));
    let berlin = TimeZone::get("Europe/Berlin").unwrap();
    let f = Finops::with_clock(home.path(), priced(true), berlin, clock);
    f.set_sink(Arc::downgrade(&sink));
    let route = Route::offline();
    f.record_usage("s1", Some("r1"), &route, tokens(9)).await;
    assert_eq!(next(&mut rx).await.1.id, "budget:2026-03-27:80");
    // 00:01 in Berlin, still the 27th in UTC.
    *now.lock().unwrap() = "2026-03-27T23:01:00Z".parse().unwrap();
    assert_eq!(f.today_usd(), 0.0, "a new day has spent nothing");
    assert!(!f.over_limit());
    f.record_usage("s1", Some("r2"), &route, tokens(2)).await;
    f.flush().await;
    assert!((f.today_usd() - 0.2).abs() < 1e-9);
    let dir = ledger::dir(home.path());
    let tokens_on = |d| {
        ledger::read_day(&dir, d)
            .unwrap()
            .into_iter()
            .filter_map(|r| match r {
                Row::Usage { input_tokens, .. } => Some(input_tokens),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(tokens_on(date(2026, 3, 27)), [9]);
    assert_eq!(tokens_on(date(2026, 3, 28)), [2]);
    f.record_usage("s1", Some("r3"), &route, tokens(6)).await;
    assert_eq!(
        next(&mut rx).await.1.id,
        "budget:2026-03-28:80",
        "each day has its own levels"
    );
    let digest = f.digest(2, Vec::new()).await.unwrap();
    assert_eq!(digest.timezone, "Europe/Berlin");
    assert_eq!(digest.days[0].usage.input_tokens, 9);
    assert_eq!(digest.days[1].usage.input_tokens, 8);
    assert_eq!(digest.days[1].runs, 2);
    assert!((digest.today_usd - 0.8).abs() < 1e-9);
    assert_eq!(digest.max_day_usd, Some(1.0));
}

#[tokio::test]
async fn an_unpriced_model_is_counted_without_a_cost_and_named_by_the_digest() {
    let home = tempfile::tempdir().unwrap();
    let (clock, _) = clock("2026-05-05T12:00:00Z");
    let f = Finops::with_clock(home.path(), FileFinops::default(), TimeZone::UTC, clock);
    f.record_usage("s1", Some("r1"), &Route::offline(), tokens(1_000_000))
        .await;
    let d = f.digest(1, vec!["2026-05-05T01:00:00Z".into()]).await.unwrap();
    assert_eq!(d.total.usd, 0.0);
    assert_eq!(d.total.input_tokens, 1_000_000);
    assert_eq!(d.unpriced, ["offline/offline"]);
    assert_eq!(d.memory_notes_added, 1);
    assert_eq!((d.max_day_usd, f.today_usd()), (None, 0.0));
    assert!(!f.over_limit(), "no budget, no limit");
    assert_eq!(f.refusal(), None);
    let rows = ledger::read_day(&ledger::dir(home.path()), date(2026, 5, 5)).unwrap();
    assert!(matches!(rows[..], [Row::Usage { usd: None, .. }]), "{rows:?}");
    let e = f.digest(0, Vec::new()).await.unwrap_err();
    assert_eq!(e.kind, crate::ErrorKind::InvalidArgument);
    assert!(e.message.contains("days"), "{}", e.message);
}
