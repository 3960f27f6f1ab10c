//! The day's budget as the ledger's owner keeps it: today's spend, the levels already alerted, the sessions that spent, and the alert's words.

use super::ledger::{Level, Row};
use jiff::civil::Date;
use std::collections::BTreeSet;

/// Float sums of small prices land a hair under a limit they meet exactly
/// (0.1 + 0.2 < 0.3 + ε): a level counts as reached within this.
const EPSILON: f64 = 1e-9;

/// Whether `usd` has reached `percent` of `max`.
pub(crate) fn reached(usd: f64, max: f64, percent: u8) -> bool {
    usd + EPSILON >= max * f64::from(percent) / 100.0
}

/// One server-local day's spend, folded from its file and kept up to date
/// by the owner as it appends.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Today {
    pub(crate) date: Date,
    pub(crate) usd: f64,
    /// By `Level::index`: whether that level's alert was recorded today.
    pub(crate) alerted: [bool; 2],
    /// Sessions with a priced model call today: who a budget alert goes to.
    pub(crate) spenders: BTreeSet<String>,
}

impl Today {
    pub(crate) fn new(date: Date) -> Today {
        Today {
            date,
            usd: 0.0,
            alerted: [false; 2],
            spenders: BTreeSet::new(),
        }
    }

    /// The day as its rows say (a restart reads them back: the spend goes
    /// on from where it was, and an alert recorded is not made again).
    pub(crate) fn from_rows(date: Date, rows: &[Row]) -> Today {
        let mut today = Today::new(date);
        for row in rows {
            today.fold(row);
        }
        today
    }

    pub(crate) fn fold(&mut self, row: &Row) {
        match row {
            Row::Usage {
                usd: Some(usd),
                session_id,
                ..
            } => {
                self.usd += usd;
                if !self.spenders.contains(session_id) {
                    self.spenders.insert(session_id.clone());
                }
            }
            Row::BudgetAlert { level, .. } => self.alerted[level.index()] = true,
            Row::Usage { usd: None, .. } | Row::Fire { .. } => {}
        }
    }

    /// The levels of `max` the spend has reached that were not alerted
    /// today, lowest first; they count as alerted from now on. A jump past
    /// both crosses both: each level is alerted once a day.
    pub(crate) fn cross(&mut self, max: Option<f64>) -> Vec<Level> {
        let Some(max) = max else {
            return Vec::new();
        };
        let mut crossed = Vec::new();
        for level in Level::ALL {
            if !self.alerted[level.index()] && reached(self.usd, max, level.percent()) {
                self.alerted[level.index()] = true;
                crossed.push(level);
            }
        }
        crossed
    }
}

/// US dollars as a person reads them: cents, or four decimals for an
/// amount under a dollar that is not whole cents.
pub(crate) fn dollars(usd: f64) -> String {
    let cents = usd * 100.0;
    if usd.abs() < 1.0 && (cents - cents.round()).abs() > 1e-6 {
        format!("${usd:.4}")
    } else {
        format!("${usd:.2}")
    }
}

/// What a budget alert says.
pub(crate) fn alert_text(date: Date, level: Level, usd: f64, max: f64, stop_at_limit: bool) -> String {
    // Floored (79.99% is not 80%), less a hair of float error.
    let percent = (usd / max * 100.0 + 1e-6).floor();
    let head = format!(
        "Budget: model spend on {date} is {} of the {} daily budget ({percent:.0}%).",
        dollars(usd),
        dollars(max)
    );
    match level {
        Level::Eighty => format!("{head} It has passed 80% of the limit."),
        Level::Hundred if stop_at_limit => format!(
            "{head} The limit is reached: scheduled tasks do not fire again today; conversations go on."
        ),
        Level::Hundred => {
            format!("{head} The limit is reached (nothing is stopped: [finops] stop_at_limit is off).")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jiff::civil::date;

    fn spent(session: &str, usd: Option<f64>) -> Row {
        Row::Usage {
            at: "t".into(),
            session_id: session.into(),
            request_id: None,
            provider: "p".into(),
            model: "m".into(),
            input_tokens: 1,
            output_tokens: 1,
            usd,
        }
    }

    #[test]
    fn each_level_is_crossed_once_a_day_and_a_jump_crosses_both() {
        let mut t = Today::new(date(2026, 3, 1));
        t.fold(&spent("a", Some(7.9)));
        assert!(t.cross(Some(10.0)).is_empty());
        assert!(t.cross(None).is_empty(), "no budget: no alerts");
        t.fold(&spent("b", Some(0.1)));
        assert_eq!(t.cross(Some(10.0)), vec![Level::Eighty], "exactly 80% reaches it");
        t.fold(&spent("b", Some(1.0)));
        assert!(t.cross(Some(10.0)).is_empty(), "80% alerted already");
        t.fold(&spent("c", None));
        t.fold(&spent("c", Some(1.5)));
        assert_eq!(t.cross(Some(10.0)), vec![Level::Hundred]);
        assert!(t.cross(Some(10.0)).is_empty());
        assert_eq!(
            t.spenders.iter().map(String::as_str).collect::<Vec<_>>(),
            ["a", "b", "c"]
        );
        let mut jump = Today::new(date(2026, 3, 1));
        jump.fold(&spent("a", Some(12.0)));
        assert_eq!(jump.cross(Some(10.0)), vec![Level::Eighty, Level::Hundred]);
    }

    #[test]
    fn a_day_read_back_keeps_its_spend_and_its_alerts() {
        let rows = vec![
            spent("a", Some(8.5)),
            Row::BudgetAlert {
                at: "t".into(),
                level: Level::Eighty,
                day_usd: 8.5,
                max_day_usd: 10.0,
            },
            spent("z", None),
        ];
        let mut t = Today::from_rows(date(2026, 3, 1), &rows);
        assert_eq!(t.usd, 8.5);
        assert_eq!(t.alerted, [true, false]);
        assert!(!t.spenders.contains("z"), "an unpriced call spends nothing");
        assert!(
            t.cross(Some(10.0)).is_empty(),
            "80% was alerted before the restart"
        );
    }

    #[test]
    fn the_alert_says_spend_limit_and_percentage_in_words() {
        let t = alert_text(date(2026, 3, 1), Level::Eighty, 8.2, 10.0, true);
        assert_eq!(
            t,
            "Budget: model spend on 2026-03-01 is $8.20 of the $10.00 daily budget (82%). It has passed 80% of the limit."
        );
        let t = alert_text(date(2026, 3, 1), Level::Hundred, 0.0105, 0.01, true);
        assert!(t.contains("$0.0105 of the $0.01") && t.contains("(105%)"), "{t}");
        assert!(t.contains("scheduled tasks do not fire again today"), "{t}");
        let t = alert_text(date(2026, 3, 1), Level::Hundred, 10.0, 10.0, false);
        assert!(t.contains("stop_at_limit is off"), "{t}");
    }
}
