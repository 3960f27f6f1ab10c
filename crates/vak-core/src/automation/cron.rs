//! 5-field cron schedules read in a time zone's wall-clock time: vixie's day-of-month/day-of-week OR, a DST gap skipped forward, a repeated DST hour fired once.
//!
//! cronexpr parses and matches the fields (it implements vixie's rule: when
//! neither day field starts with `*`, a day matches if either does). Its own
//! search walks zoned time, where a wall time in a DST gap is never reached
//! and one in an overlap is reached twice, so it is used here on civil time
//! only: the expression is read in UTC, where civil time and instants agree,
//! and each civil candidate is mapped to an instant in the real zone with
//! jiff's `compatible` disambiguation.

use cronexpr::Crontab;
use jiff::civil::DateTime;
use jiff::tz::TimeZone;
use jiff::Timestamp;

/// The names of the five fields, in order, as messages say them.
const FIELDS: [&str; 5] = ["minute", "hour", "day-of-month", "month", "day-of-week"];

/// Civil candidates tried for one `next_after` before giving up: a candidate
/// is passed over only while it falls in a repeated hour already fired (at
/// most one candidate a minute for the length of an overlap), so this bound
/// is never reached by a schedule that fires.
const MAX_CANDIDATES: usize = 10_000;

/// A parsed 5-field cron expression (`minute hour day-of-month month
/// day-of-week`): numbers, `*`, ranges `a-b`, steps `/n`, lists `a,b`, and
/// the names JAN..DEC and SUN..SAT. cronexpr's extensions (`L`, `W`, `#`)
/// are accepted as it reads them.
#[derive(Clone, Debug)]
pub struct CronSchedule {
    /// The expression with its whitespace normalised to single spaces.
    expr: String,
    /// Read in UTC: its matches are civil times (see the module doc).
    civil: Crontab,
}

impl CronSchedule {
    /// Parses a 5-field expression; the message names the field that is
    /// wrong and why ("hour field \"25\": value must be in range 0..=23; found 25").
    pub fn parse(text: &str) -> Result<CronSchedule, String> {
        let fields: Vec<&str> = text.split_ascii_whitespace().collect();
        if fields.len() != FIELDS.len() {
            return Err(format!(
                "a schedule has 5 fields (minute hour day-of-month month day-of-week); {text:?} has {}",
                fields.len()
            ));
        }
        let expr = fields.join(" ");
        let civil =
            cronexpr::parse_crontab(&format!("{expr} UTC")).map_err(|e| explain(&fields, &e.to_string()))?;
        let schedule = CronSchedule { expr, civil };
        // Every date a schedule can name comes round within four years
        // (29 February included), so one that finds none never fires.
        let epoch = DateTime::constant(2000, 1, 1, 0, 0, 0, 0);
        if schedule.next_civil(epoch).is_none() {
            return Err(format!(
                "{:?} never fires: no date has that day-of-month in those months",
                schedule.expr
            ));
        }
        Ok(schedule)
    }

    /// The expression as parsed, whitespace normalised.
    pub fn as_str(&self) -> &str {
        &self.expr
    }

    /// The first instant strictly after `after` whose wall-clock time in
    /// `tz` matches. A wall time inside a spring-forward gap does not exist:
    /// it fires at `compatible`'s instant, the gap's length later (02:30 in
    /// a 02:00→03:00 gap fires at 03:30 new time), once, since a wall time
    /// that maps to an instant already passed is skipped. In a fall-back
    /// overlap a wall time fires once, at its earlier instant: while the
    /// hour repeats, its wall times map to instants already past and are
    /// skipped, so an every-minute schedule is silent for the repeated hour.
    /// None if nothing matches within four years.
    pub fn next_after(&self, after: Timestamp, tz: &TimeZone) -> Option<Timestamp> {
        let mut civil = after.to_zoned(tz.clone()).datetime();
        for _ in 0..MAX_CANDIDATES {
            let candidate = self.next_civil(civil)?;
            let at = tz.to_ambiguous_zoned(candidate).compatible().ok()?.timestamp();
            if at > after {
                return Some(at);
            }
            civil = candidate;
        }
        None
    }

    /// The first matching civil minute strictly after `civil`.
    fn next_civil(&self, civil: DateTime) -> Option<DateTime> {
        let as_utc = civil.to_zoned(TimeZone::UTC).ok()?.timestamp();
        self.civil.find_next(as_utc).ok().map(|z| z.datetime())
    }
}

impl std::fmt::Display for CronSchedule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.expr)
    }
}

/// A one-line message for a refused expression: the first field that fails
/// on its own (the others `*`) and cronexpr's reason for it; else cronexpr's
/// whole message on one line.
fn explain(fields: &[&str], whole: &str) -> String {
    for (i, field) in fields.iter().enumerate() {
        let mut probe = ["*"; 5];
        probe[i] = field;
        if let Err(e) = cronexpr::parse_crontab(&format!("{} UTC", probe.join(" "))) {
            let text = e.to_string();
            // cronexpr's message ends with a caret line: "   ^ <reason>".
            let reason = text.rsplit_once("^ ").map_or(text.as_str(), |(_, r)| r).trim();
            let hint = if reason.starts_with("malformed") {
                " (a field is numbers or names, `*`, ranges a-b, steps /n, lists a,b)"
            } else {
                ""
            };
            return format!("{} field {field:?}: {reason}{hint}", FIELDS[i]);
        }
    }
    whole.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use jiff::civil::date;

    fn at(tz: &TimeZone, y: i16, mo: i8, d: i8, h: i8, mi: i8) -> Timestamp {
        date(y, mo, d)
            .at(h, mi, 0, 0)
            .to_zoned(tz.clone())
            .unwrap()
            .timestamp()
    }

    fn wall(tz: &TimeZone, t: Timestamp) -> String {
        t.to_zoned(tz.clone()).strftime("%Y-%m-%d %H:%M %Z").to_string()
    }

    fn fires(expr: &str, tz: &TimeZone, from: Timestamp, n: usize) -> Vec<Timestamp> {
        let s = CronSchedule::parse(expr).unwrap();
        let mut out = Vec::new();
        let mut t = from;
        for _ in 0..n {
            t = s.next_after(t, tz).unwrap();
            out.push(t);
        }
        out
    }

    #[test]
    fn every_minute_across_the_spring_forward_gap_fires_each_real_minute_once() {
        for (zone, (y, m, d)) in [
            ("America/New_York", (2026, 3, 8)),
            ("Europe/Berlin", (2026, 3, 29)),
        ] {
            let tz = TimeZone::get(zone).unwrap();
            // 01:00 to 04:00 wall time is two real hours: the gap hour does not exist.
            let from = at(&tz, y, m, d, 1, 0);
            let until = at(&tz, y, m, d, 4, 0);
            assert_eq!(until.duration_since(from).as_secs(), 2 * 3600, "{zone}");
            let got = fires("* * * * *", &tz, from, 120);
            let mut prev = from;
            for t in &got {
                assert_eq!(
                    t.duration_since(prev).as_secs(),
                    60,
                    "{zone}: {} after {}",
                    wall(&tz, *t),
                    wall(&tz, prev)
                );
                prev = *t;
            }
            assert_eq!(*got.last().unwrap(), until, "{zone}");
        }
    }

    #[test]
    fn every_minute_across_the_fall_back_overlap_fires_each_wall_minute_once() {
        for (zone, (y, m, d), hour) in [
            ("America/New_York", (2026, 11, 1), 1),
            ("Europe/Berlin", (2026, 10, 25), 2),
        ] {
            let tz = TimeZone::get(zone).unwrap();
            // From the minute before the repeated hour to the hour after it.
            let from = at(&tz, y, m, d, hour - 1, 59);
            let got = fires("* * * * *", &tz, from, 120);
            let walls: Vec<_> = got.iter().map(|t| t.to_zoned(tz.clone()).datetime()).collect();
            let mut expect = date(y, m, d).at(hour, 0, 0, 0);
            for (w, t) in walls.iter().zip(&got) {
                assert_eq!(*w, expect, "{zone}: {}", wall(&tz, *t));
                expect = expect.checked_add(jiff::SignedDuration::from_mins(1)).unwrap();
            }
            // No instant twice, and the only jump is the repeated hour, skipped.
            let mut prev = from;
            let mut jumps = Vec::new();
            for t in &got {
                let secs = t.duration_since(prev).as_secs();
                assert!(secs > 0, "{zone}: {} fired twice", wall(&tz, *t));
                if secs != 60 {
                    jumps.push((wall(&tz, *t), secs));
                }
                prev = *t;
            }
            assert_eq!(jumps.len(), 1, "{zone}: {jumps:?}");
            assert_eq!(jumps[0].1, 3600 + 60, "{zone}: {jumps:?}");
        }
    }

    #[test]
    fn a_daily_time_in_the_gap_fires_once_the_gap_s_length_later() {
        let tz = TimeZone::get("America/New_York").unwrap();
        let got = fires("30 2 * * *", &tz, at(&tz, 2026, 3, 7, 12, 0), 3);
        let walls: Vec<_> = got.iter().map(|t| wall(&tz, *t)).collect();
        assert_eq!(
            walls,
            [
                "2026-03-08 03:30 EDT",
                "2026-03-09 02:30 EDT",
                "2026-03-10 02:30 EDT"
            ]
        );
        let tz = TimeZone::get("Europe/Berlin").unwrap();
        let got = fires("30 2 * * *", &tz, at(&tz, 2026, 3, 28, 12, 0), 2);
        let walls: Vec<_> = got.iter().map(|t| wall(&tz, *t)).collect();
        assert_eq!(walls, ["2026-03-29 03:30 CEST", "2026-03-30 02:30 CEST"]);
    }

    #[test]
    fn a_daily_time_in_the_overlap_fires_once_at_its_earlier_instant() {
        let tz = TimeZone::get("America/New_York").unwrap();
        let got = fires("30 1 * * *", &tz, at(&tz, 2026, 10, 31, 12, 0), 3);
        let walls: Vec<_> = got.iter().map(|t| wall(&tz, *t)).collect();
        assert_eq!(
            walls,
            [
                "2026-11-01 01:30 EDT",
                "2026-11-02 01:30 EST",
                "2026-11-03 01:30 EST"
            ]
        );
        // Asked from inside the repeated hour (01:10 EST, after 01:30 EDT
        // fired), the repeated 01:30 does not fire again.
        let s = CronSchedule::parse("30 1 * * *").unwrap();
        let second_hour = got[0].checked_add(jiff::SignedDuration::from_mins(40)).unwrap();
        assert_eq!(wall(&tz, second_hour), "2026-11-01 01:10 EST");
        assert_eq!(
            wall(&tz, s.next_after(second_hour, &tz).unwrap()),
            "2026-11-02 01:30 EST"
        );
    }

    #[test]
    fn day_of_month_and_day_of_week_both_restricted_are_ored() {
        let tz = TimeZone::UTC;
        let got = fires("0 0 13 * FRI", &tz, at(&tz, 2026, 4, 1, 0, 0), 5);
        let days: Vec<_> = got
            .iter()
            .map(|t| t.to_zoned(tz.clone()).strftime("%m-%d %a").to_string())
            .collect();
        // Fridays, and Monday the 13th.
        assert_eq!(
            days,
            ["04-03 Fri", "04-10 Fri", "04-13 Mon", "04-17 Fri", "04-24 Fri"]
        );
        // With either day field starting with `*` the other alone decides (vixie).
        let got = fires("0 0 * * FRI", &tz, at(&tz, 2026, 4, 1, 0, 0), 3);
        let days: Vec<_> = got
            .iter()
            .map(|t| t.to_zoned(tz.clone()).strftime("%m-%d").to_string())
            .collect();
        assert_eq!(days, ["04-03", "04-10", "04-17"]);
        let got = fires("0 0 */1 * FRI", &tz, at(&tz, 2026, 4, 1, 0, 0), 2);
        let days: Vec<_> = got
            .iter()
            .map(|t| t.to_zoned(tz.clone()).strftime("%m-%d").to_string())
            .collect();
        assert_eq!(days, ["04-03", "04-10"]);
    }

    #[test]
    fn names_ranges_steps_and_lists_parse() {
        let tz = TimeZone::UTC;
        let got = fires("*/20 9-10 * JAN,JUL MON-FRI", &tz, at(&tz, 2026, 6, 30, 0, 0), 7);
        let walls: Vec<_> = got.iter().map(|t| wall(&tz, *t)).collect();
        assert_eq!(
            walls,
            [
                "2026-07-01 09:00 UTC",
                "2026-07-01 09:20 UTC",
                "2026-07-01 09:40 UTC",
                "2026-07-01 10:00 UTC",
                "2026-07-01 10:20 UTC",
                "2026-07-01 10:40 UTC",
                "2026-07-02 09:00 UTC",
            ]
        );
        // Strictly after: a fire time is not its own next.
        let s = CronSchedule::parse("  0   *  * * *\t").unwrap();
        assert_eq!(s.as_str(), "0 * * * *");
        let t = at(&tz, 2026, 1, 1, 5, 0);
        assert_eq!(wall(&tz, s.next_after(t, &tz).unwrap()), "2026-01-01 06:00 UTC");
    }

    #[test]
    fn a_bad_schedule_is_refused_with_the_field_and_the_reason() {
        let e = CronSchedule::parse("0 25 * * *").unwrap_err();
        assert_eq!(e, "hour field \"25\": value must be in range 0..=23; found 25");
        let e = CronSchedule::parse("0 0 * * FUNDAY").unwrap_err();
        assert!(
            e.starts_with("day-of-week field \"FUNDAY\": malformed expression (a field is"),
            "{e}"
        );
        let e = CronSchedule::parse("*/0 * * * *").unwrap_err();
        assert_eq!(e, "minute field \"*/0\": step must be greater than 0");
        let e = CronSchedule::parse("0 0 * *").unwrap_err();
        assert!(e.contains("5 fields") && e.contains("has 4"), "{e}");
        let e = CronSchedule::parse("0 0 * * * Europe/Berlin").unwrap_err();
        assert!(e.contains("has 6"), "{e}");
        let e = CronSchedule::parse("").unwrap_err();
        assert!(e.contains("has 0"), "{e}");
        let e = CronSchedule::parse("0 0 30 FEB *").unwrap_err();
        assert!(e.contains("never fires"), "{e}");
        // 29 February fires, in leap years.
        let s = CronSchedule::parse("0 0 29 2 *").unwrap();
        let tz = TimeZone::UTC;
        assert_eq!(
            wall(&tz, s.next_after(at(&tz, 2026, 1, 1, 0, 0), &tz).unwrap()),
            "2028-02-29 00:00 UTC"
        );
    }
}
