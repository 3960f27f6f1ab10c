//! The results table (medians with their min–max spread, the goal each figure
//! is held against, the ratio to raw tonic, CPU used) and BENCHMARKS.md.

use crate::machine::Machine;
use std::fmt::Write as _;
use std::path::Path;

/// The median and spread of a figure over the runs.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Stat {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub runs: usize,
}

impl Stat {
    pub(crate) fn of(values: &[f64]) -> Option<Stat> {
        if values.is_empty() {
            return None;
        }
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Some(Stat {
            median,
            min: v[0],
            max: v[n - 1],
            runs: n,
        })
    }
}

/// How a figure is printed.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Unit {
    /// Events per second.
    Rate,
    /// Seconds, printed as ms.
    Seconds,
    /// Microseconds, printed as ms.
    Micros,
    /// Nanoseconds (CPU per event).
    Nanos,
    KiB,
    MiB,
    /// A fraction, printed as %.
    Fraction,
    /// CPU cores (CPU seconds per second).
    Cores,
    /// Bytes per second.
    ByteRate,
}

pub(crate) fn fmt_value(v: f64, unit: Unit) -> String {
    match unit {
        Unit::Rate if v >= 1e6 => format!("{:.2} M/s", v / 1e6),
        Unit::Rate if v >= 1e3 => format!("{:.0} k/s", v / 1e3),
        Unit::Rate => format!("{v:.0} /s"),
        Unit::Seconds if v >= 10.0 => format!("{v:.1} s"),
        Unit::Seconds => format!("{:.1} ms", v * 1e3),
        Unit::Micros => format!("{:.2} ms", v / 1e3),
        Unit::Nanos => format!("{v:.0} ns"),
        Unit::KiB => format!("{v:.1} KiB"),
        Unit::MiB => format!("{v:.0} MiB"),
        Unit::Fraction => format!("{:.0}%", v * 100.0),
        Unit::Cores => format!("{v:.2} cores"),
        Unit::ByteRate if v >= 1e9 => format!("{:.2} GB/s", v / 1e9),
        Unit::ByteRate => format!("{:.0} MB/s", v / 1e6),
    }
}

/// A goal a figure is compared with (never asserted).
#[derive(Clone, Debug)]
pub(crate) struct Goal {
    pub text: String,
    /// Some(true) met, Some(false) missed, None nothing to compare.
    pub met: Option<bool>,
    /// How far off, when missed ("missed by 38%").
    pub by: String,
}

impl Goal {
    /// value >= goal.
    pub(crate) fn at_least(value: f64, goal: f64, text: &str) -> Goal {
        let met = value >= goal;
        Goal {
            text: text.into(),
            met: Some(met),
            by: if met {
                String::new()
            } else {
                format!(
                    "{:.0}% short ({:.2}x of the goal)",
                    (1.0 - value / goal) * 100.0,
                    value / goal
                )
            },
        }
    }

    /// value <= goal (or < when strict).
    pub(crate) fn at_most(value: f64, goal: f64, strict: bool, text: &str) -> Goal {
        let met = if strict { value < goal } else { value <= goal };
        Goal {
            text: text.into(),
            met: Some(met),
            by: if met {
                String::new()
            } else {
                format!("{:.1}x the goal", value / goal)
            },
        }
    }

    fn cell(&self) -> String {
        match self.met {
            Some(true) => format!("{}: met", self.text),
            Some(false) => format!("{}: **missed**, {}", self.text, self.by),
            None => self.text.clone(),
        }
    }
}

/// One line of the table.
#[derive(Clone, Debug)]
pub(crate) struct Row {
    pub scenario: String,
    pub transport: &'static str,
    pub metric: String,
    /// None: every run failed (see `failure`).
    pub stat: Option<Stat>,
    pub unit: Unit,
    pub goal: Option<Goal>,
    /// vak gRPC / raw tonic, measured in the same bench run.
    pub vs_tonic: Option<f64>,
    /// Median CPU while measuring, in cores: server, bench, everything else.
    pub cpu: Option<(f64, f64, f64)>,
    pub note: String,
    pub failure: Option<String>,
}

impl Row {
    pub(crate) fn new(
        scenario: &str,
        transport: &'static str,
        metric: &str,
        values: &[f64],
        unit: Unit,
    ) -> Row {
        Row {
            scenario: scenario.into(),
            transport,
            metric: metric.into(),
            stat: Stat::of(values),
            unit,
            goal: None,
            vs_tonic: None,
            cpu: None,
            note: String::new(),
            failure: None,
        }
    }
}

fn cell_escape(s: &str) -> String {
    s.replace('|', "\\|")
}

/// The table in Markdown (readable as plain text too).
pub(crate) fn table(rows: &[Row]) -> String {
    let mut out = String::new();
    out.push_str("| Scenario | Transport | Metric | Median | Spread (min–max) | Goal | vs raw tonic | CPU server / bench / others (cores) | Notes |\n");
    out.push_str("|---|---|---|---:|---|---|---:|---|---|\n");
    for r in rows {
        let (median, spread) = match (&r.stat, &r.failure) {
            (Some(s), _) => (
                fmt_value(s.median, r.unit),
                if s.runs > 1 {
                    format!(
                        "{} – {} ({} runs)",
                        fmt_value(s.min, r.unit),
                        fmt_value(s.max, r.unit),
                        s.runs
                    )
                } else {
                    "1 run".to_string()
                },
            ),
            (None, Some(f)) => ("failed".into(), cell_escape(f)),
            (None, None) => ("–".into(), String::new()),
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.scenario,
            r.transport,
            r.metric,
            median,
            spread,
            r.goal.as_ref().map(Goal::cell).unwrap_or_default(),
            r.vs_tonic.map(|x| format!("{x:.2}x")).unwrap_or_default(),
            r.cpu
                .map(|(s, b, o)| format!("{s:.2} / {b:.2} / {o:.2}"))
                .unwrap_or_default(),
            cell_escape(&match (&r.stat, &r.failure) {
                // Some runs measured, another failed: the failure is part of the figure.
                (Some(_), Some(f)) if r.note.is_empty() => format!("another run failed: {f}"),
                (Some(_), Some(f)) => format!("{}; another run failed: {f}", r.note),
                _ => r.note.clone(),
            }),
        );
    }
    out
}

/// One line per goal: met, or missed and by how much.
pub(crate) fn goals(rows: &[Row]) -> String {
    let mut out = String::new();
    for r in rows {
        let (Some(g), Some(s)) = (&r.goal, &r.stat) else {
            continue;
        };
        let value = match r.vs_tonic {
            Some(x) if g.text.contains("raw tonic") => format!("{x:.2}x raw tonic"),
            _ => fmt_value(s.median, r.unit),
        };
        let verdict = match g.met {
            Some(true) => "met".to_string(),
            Some(false) => format!("MISSED, {}", g.by),
            None => continue,
        };
        let _ = writeln!(
            out,
            "- {} ({}, {}): {} against the goal {}: {}",
            r.scenario, r.transport, r.metric, value, g.text, verdict
        );
    }
    out
}

const BEGIN: &str =
    "<!-- BEGIN vak-bench: generated by `make bench`; everything up to END is rewritten on each run -->";
const END: &str = "<!-- END vak-bench -->";

/// Today's date (UTC) from the system clock, as YYYY-MM-DD.
pub(crate) fn today() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()) as i64;
    // Howard Hinnant's days-to-civil.
    let z = secs.div_euclid(86_400) + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

/// Everything a report says besides the table.
pub(crate) struct Context<'a> {
    pub machine: &'a Machine,
    pub command: &'a str,
    pub revision: String,
    pub method: &'a str,
    pub wall_s: f64,
    /// Load average when the bench ended, and the median share of the two
    /// cores other processes took while figures were measured.
    pub load_at_end: String,
    pub others_cores: Option<f64>,
}

/// The generated section: when, where, how, the table and the goals.
pub(crate) fn section(ctx: &Context<'_>, rows: &[Row]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Measured {} at {} in {:.0} s.\n",
        today(),
        ctx.revision,
        ctx.wall_s
    );
    let _ = writeln!(out, "- Machine: {}", ctx.machine);
    let _ = writeln!(
        out,
        "- Other work on the machine: load average {} at the end; other processes used a median of {} cores of {} while figures were measured (see the CPU column)",
        ctx.load_at_end,
        ctx.others_cores.map_or("?".into(), |c| format!("{c:.2}")),
        ctx.machine.cores
    );
    let _ = writeln!(out, "- Command: `{}`\n", ctx.command);
    out.push_str(ctx.method);
    out.push('\n');
    out.push_str(&table(rows));
    out.push_str("\n### Goals\n\n");
    out.push_str(&goals(rows));
    out
}

const BEGIN_PEER: &str =
    "<!-- BEGIN vak-bench-peer: generated by `make bench-peer`; everything up to END is rewritten on each run -->";
const END_PEER: &str = "<!-- END vak-bench-peer -->";

/// Writes the generated section into `path` between the markers (the peer
/// run's own markers with `peer`), keeping whatever the file holds outside
/// them (the hand-written analysis, and the other run's section).
pub(crate) fn write_markdown(path: &Path, generated: &str, peer: bool) -> std::io::Result<()> {
    let old = std::fs::read_to_string(path).unwrap_or_default();
    let (begin, end) = if peer {
        (BEGIN_PEER, END_PEER)
    } else {
        (BEGIN, END)
    };
    let block = format!("{begin}\n\n{}\n{end}", generated.trim_end());
    let new = match (old.find(begin), old.find(end)) {
        (Some(b), Some(e)) if b < e => format!("{}{}{}", &old[..b], block, &old[e + end.len()..]),
        _ if peer && !old.is_empty() => format!(
            "{}\n\n## vak and nginx + nchan, one run\n\n{block}\n",
            old.trim_end()
        ),
        _ => format!("# Benchmarks\n\n{block}\n"),
    };
    std::fs::write(path, new)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_and_spreads() {
        let s = Stat::of(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.runs), (2.0, 1.0, 3.0, 3));
        assert_eq!(Stat::of(&[1.0, 4.0]).unwrap().median, 2.5);
        assert!(Stat::of(&[]).is_none());
    }

    #[test]
    fn the_generated_block_is_replaced_and_the_rest_kept() {
        let dir = std::env::temp_dir().join(format!("vak-bench-report-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("B.md");
        write_markdown(&p, "first", false).unwrap();
        let text = std::fs::read_to_string(&p).unwrap();
        std::fs::write(&p, format!("{text}\n## Analysis\nkept\n")).unwrap();
        write_markdown(&p, "second", false).unwrap();
        let text = std::fs::read_to_string(&p).unwrap();
        assert!(text.contains("second") && !text.contains("first"));
        assert!(text.contains("## Analysis\nkept"));
        // The peer run's block goes after the rest, then is replaced in place; the main block stays.
        write_markdown(&p, "peer one", true).unwrap();
        write_markdown(&p, "peer two", true).unwrap();
        let text = std::fs::read_to_string(&p).unwrap();
        assert!(text.contains("second") && text.contains("## Analysis\nkept"));
        assert!(text.contains("peer two") && !text.contains("peer one"));
        assert!(text.find("kept").unwrap() < text.find("peer two").unwrap());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn dates_are_civil() {
        let d = today();
        assert_eq!(d.len(), 10);
        assert!(d.starts_with("20"));
    }
}
