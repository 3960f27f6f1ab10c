//! The usage digest: the cost ledger's days folded into spend and tokens per day, model and session, with the window's task fires and memory notes.

use super::config::model_key;
use super::ledger::{self, Row};
use crate::error::{Error, Result};
use jiff::civil::Date;
use jiff::tz::TimeZone;
use jiff::Timestamp;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The longest window a digest reads, in days (and so the most day files).
pub const MAX_DAYS: u32 = 90;

/// Checks a window's length: 1 to `MAX_DAYS`, else an invalid-argument
/// error naming `days`.
pub fn check_days(days: u32) -> Result<()> {
    if (1..=MAX_DAYS).contains(&days) {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "days must be from 1 to {MAX_DAYS}, not {days}"
        )))
    }
}

/// Usage over a day, a model, a session or the window.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct UsageSum {
    /// US dollars; usage of an unpriced model adds none.
    pub usd: f64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Model calls.
    pub calls: u32,
}

impl UsageSum {
    fn add(&mut self, usd: Option<f64>, input_tokens: u64, output_tokens: u64) {
        self.usd += usd.unwrap_or(0.0);
        self.input_tokens += input_tokens;
        self.output_tokens += output_tokens;
        self.calls = self.calls.saturating_add(1);
    }

    fn merge(&mut self, other: &UsageSum) {
        self.usd += other.usd;
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
        self.calls = self.calls.saturating_add(other.calls);
    }
}

/// One server-local day of the window.
#[derive(Clone, Debug, PartialEq)]
pub struct DayView {
    /// YYYY-MM-DD in the server's time zone.
    pub date: String,
    pub usage: UsageSum,
    /// Runs (distinct request ids) that used a model that day.
    pub runs: u32,
    /// By "provider/model".
    pub by_model: BTreeMap<String, UsageSum>,
    /// By session id.
    pub by_session: BTreeMap<String, UsageSum>,
}

/// What `GET /digest` answers.
#[derive(Clone, Debug, PartialEq)]
pub struct DigestView {
    /// Oldest first, every day of the window (a day with no use is zeros).
    pub days: Vec<DayView>,
    pub total: UsageSum,
    /// Memory notes created in the window.
    pub memory_notes_added: u32,
    /// Scheduled task fires in the window.
    pub tasks_fired: u32,
    /// "provider/model" used in the window without a price: their tokens
    /// are counted, their cost is not known.
    pub unpriced: Vec<String>,
    pub max_day_usd: Option<f64>,
    pub today_usd: f64,
    /// The zone days are counted in.
    pub timezone: String,
}

/// Reads the `days` days ending with `today` (at most `MAX_DAYS` files,
/// each capped) and folds them; `memory_created` are the memory notes'
/// creation times (RFC 3339), counted when they fall in the window.
/// Blocking: run it off the runtime. `max_day_usd`, `today_usd` and
/// `timezone` are left for the caller.
pub(crate) fn fold(
    dir: &Path,
    tz: &TimeZone,
    today: Date,
    days: u32,
    memory_created: &[String],
) -> Result<DigestView> {
    check_days(days)?;
    let first = today
        .checked_sub(jiff::Span::new().days(i64::from(days - 1)))
        .map_err(|e| Error::internal(format!("the digest's window: {e}")))?;
    let mut view = DigestView {
        days: Vec::with_capacity(days as usize),
        total: UsageSum::default(),
        memory_notes_added: 0,
        tasks_fired: 0,
        unpriced: Vec::new(),
        max_day_usd: None,
        today_usd: 0.0,
        timezone: String::new(),
    };
    let mut unpriced = BTreeSet::new();
    let mut date = first;
    while date <= today {
        let rows = ledger::read_day(dir, date).map_err(|e| Error::internal(e.to_string()))?;
        let mut day = DayView {
            date: date.to_string(),
            usage: UsageSum::default(),
            runs: 0,
            by_model: BTreeMap::new(),
            by_session: BTreeMap::new(),
        };
        let mut runs = BTreeSet::new();
        for row in &rows {
            match row {
                Row::Usage {
                    session_id,
                    request_id,
                    provider,
                    model,
                    input_tokens,
                    output_tokens,
                    usd,
                    ..
                } => {
                    let key = model_key(provider, model);
                    if usd.is_none() {
                        unpriced.insert(key.clone());
                    }
                    day.usage.add(*usd, *input_tokens, *output_tokens);
                    day.by_model
                        .entry(key)
                        .or_default()
                        .add(*usd, *input_tokens, *output_tokens);
                    day.by_session.entry(session_id.clone()).or_default().add(
                        *usd,
                        *input_tokens,
                        *output_tokens,
                    );
                    if let Some(r) = request_id {
                        runs.insert(r.as_str());
                    }
                }
                Row::Fire { .. } => view.tasks_fired = view.tasks_fired.saturating_add(1),
                Row::BudgetAlert { .. } => {}
            }
        }
        day.runs = u32::try_from(runs.len()).unwrap_or(u32::MAX);
        view.total.merge(&day.usage);
        view.days.push(day);
        date = date
            .tomorrow()
            .map_err(|e| Error::internal(format!("the digest's window: {e}")))?;
    }
    view.unpriced = unpriced.into_iter().collect();
    view.memory_notes_added = count_in_window(tz, first, today, memory_created);
    Ok(view)
}

/// How many of `times` (RFC 3339) fall on `first` to `last` in `tz`; one
/// that does not parse is not counted.
fn count_in_window(tz: &TimeZone, first: Date, last: Date, times: &[String]) -> u32 {
    let n = times
        .iter()
        .filter_map(|t| t.parse::<Timestamp>().ok())
        .map(|t| t.to_zoned(tz.clone()).date())
        .filter(|d| (first..=last).contains(d))
        .count();
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::finops::ledger::{append, Level};
    use jiff::civil::date;

    fn usage(session: &str, request: Option<&str>, model: &str, usd: Option<f64>, tokens: (u64, u64)) -> Row {
        Row::Usage {
            at: "t".into(),
            session_id: session.into(),
            request_id: request.map(str::to_owned),
            provider: "openai".into(),
            model: model.into(),
            input_tokens: tokens.0,
            output_tokens: tokens.1,
            usd,
        }
    }

    #[test]
    fn the_window_has_every_day_oldest_first_with_sums_by_model_and_session() {
        let home = tempfile::tempdir().unwrap();
        let dir = ledger::dir(home.path());
        let today = date(2026, 3, 10);
        let long_ago = date(2026, 3, 1);
        append(
            &dir,
            today,
            &[
                usage("s1", Some("r1"), "a", Some(1.0), (10, 5)),
                usage("s1", Some("r1"), "a", Some(2.0), (20, 5)),
                usage("s2", Some("r2"), "b", None, (7, 3)),
                usage("s2", None, "a", Some(0.5), (1, 1)),
                Row::BudgetAlert {
                    at: "t".into(),
                    level: Level::Eighty,
                    day_usd: 3.5,
                    max_day_usd: 4.0,
                },
                Row::Fire {
                    at: "t".into(),
                    task_id: "task_1".into(),
                    outcome: "delivered".into(),
                },
            ],
        )
        .unwrap();
        append(
            &dir,
            long_ago,
            &[usage("s9", Some("r9"), "a", Some(100.0), (1, 1))],
        )
        .unwrap();
        let tz = TimeZone::get("Europe/Berlin").unwrap();
        let created = vec![
            "2026-03-09T22:30:00Z".to_string(), // 23:30 on the 9th in Berlin: in
            "2026-03-07T22:59:59Z".to_string(), // 23:59:59 on the 7th: out of 2 days
            "not a time".to_string(),
        ];
        let v = fold(&dir, &tz, today, 2, &created).unwrap();
        assert_eq!(
            v.days.iter().map(|d| d.date.as_str()).collect::<Vec<_>>(),
            ["2026-03-09", "2026-03-10"]
        );
        let zero = &v.days[0];
        assert_eq!((zero.usage.clone(), zero.runs), (UsageSum::default(), 0));
        assert!(zero.by_model.is_empty());
        let d = &v.days[1];
        assert_eq!(d.usage.usd, 3.5);
        assert_eq!(
            (d.usage.input_tokens, d.usage.output_tokens, d.usage.calls),
            (38, 14, 4)
        );
        assert_eq!(d.runs, 2, "r1 twice, r2, and a call outside a run");
        assert_eq!(
            d.by_model["openai/a"],
            UsageSum {
                usd: 3.5,
                input_tokens: 31,
                output_tokens: 11,
                calls: 3
            }
        );
        assert_eq!(d.by_model["openai/b"].usd, 0.0);
        assert_eq!(d.by_session["s2"].calls, 2);
        assert_eq!(v.total, d.usage, "the day before had nothing");
        assert_eq!(v.unpriced, ["openai/b"]);
        assert_eq!(v.tasks_fired, 1);
        assert_eq!(v.memory_notes_added, 1);
        let ten = fold(&dir, &tz, today, 10, &created).unwrap();
        assert_eq!(ten.days.len(), 10);
        assert_eq!(ten.days[0].date, "2026-03-01");
        assert_eq!(ten.total.usd, 103.5);
        assert_eq!(ten.memory_notes_added, 2);
    }

    #[test]
    fn a_window_outside_1_to_90_is_refused_naming_days() {
        let home = tempfile::tempdir().unwrap();
        let tz = TimeZone::UTC;
        for bad in [0, 91, u32::MAX] {
            let e = fold(home.path(), &tz, date(2026, 3, 10), bad, &[]).unwrap_err();
            assert_eq!(e.kind, crate::ErrorKind::InvalidArgument);
            assert!(
                e.message.starts_with("days must be from 1 to 90"),
                "{}",
                e.message
            );
        }
        let v = fold(home.path(), &tz, date(2026, 3, 10), 90, &[]).unwrap();
        assert_eq!(v.days.len(), 90);
        assert_eq!(v.days[0].date, "2025-12-11");
    }

    #[test]
    fn an_oversized_day_fails_the_digest_with_a_clear_error() {
        let home = tempfile::tempdir().unwrap();
        let dir = ledger::dir(home.path());
        let today = date(2026, 3, 10);
        append(&dir, today, &[usage("s", None, "a", None, (1, 1))]).unwrap();
        let f = std::fs::OpenOptions::new()
            .append(true)
            .open(ledger::day_file(&dir, today))
            .unwrap();
        f.set_len(ledger::MAX_DAY_FILE + 1).unwrap();
        let e = fold(&dir, &TimeZone::UTC, today, 1, &[]).unwrap_err();
        assert!(
            e.message.contains("2026-03-10.jsonl") && e.message.contains("MiB"),
            "{}",
            e.message
        );
    }
}
