//! The growth table's two judgements: which points of an axis (subscribers, sessions, delta size) cost more than linearly, and where the latency curve's p99 crosses its bound (bisecting between measured rates).

/// One point of a growth axis.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Point {
    /// The axis value: subscribers, sessions or delta bytes.
    pub x: f64,
    /// Server CPU per delivered event, in ns (None: too short to measure).
    pub ns: Option<f64>,
    /// Server peak RSS, KiB.
    pub rss_kib: f64,
}

/// How much worse than linear a step may look before it is flagged: the
/// figures are single runs on a shared machine.
const SLACK: f64 = 1.5;
/// RSS growth below this is allocator and page noise, never flagged.
const RSS_NOISE_KIB: f64 = 16.0 * 1024.0;

/// Per point, why it grows faster than linearly (None: it does not).
///
/// CPU: the cost per delivered event should stay flat as subscribers or
/// sessions grow, and grow at most in proportion to a delta's bytes
/// (`per_byte`, the size axis); a step whose ratio to the previous point
/// exceeds that by `SLACK` is flagged. RSS: the memory each added unit
/// (`unit`) costs over the first point should not rise from one step to
/// the next; a step where it rises by `SLACK`, and by more than noise, is flagged.
pub(crate) fn flags(points: &[Point], per_byte: bool, unit: &str) -> Vec<Option<String>> {
    let mut out = vec![None; points.len()];
    for k in 1..points.len() {
        let (a, b) = (points[k - 1], points[k]);
        let mut why = Vec::new();
        if let (Some(na), Some(nb)) = (a.ns, b.ns) {
            let linear = if per_byte { b.x / a.x } else { 1.0 };
            let got = nb / na.max(1e-9);
            if got > SLACK * linear {
                why.push(format!(
                    "CPU per event {got:.1}x that at {} where linear is {linear:.1}x",
                    a.x
                ));
            }
        }
        let first = points[0];
        let per_unit = |p: Point| (p.rss_kib - first.rss_kib) / (p.x - first.x);
        if k >= 2 && b.rss_kib - first.rss_kib > RSS_NOISE_KIB {
            let (before, now) = (per_unit(a).max(0.0), per_unit(b));
            if now > SLACK * before {
                why.push(format!(
                    "RSS {now:.2} KiB per added {unit}, up from {before:.2} KiB up to {}",
                    a.x
                ));
            }
        }
        if !why.is_empty() {
            out[k] = Some(format!("**faster than linear**: {}", why.join("; ")));
        }
    }
    out
}

/// Where the p99 of a latency curve crosses a bound.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Crossing {
    /// Already at or above the bound at the lowest rate measured.
    Below(u64),
    /// Under the bound at every rate measured, up to this one.
    Above(u64),
    /// Under at `lo`, at or above at `hi`.
    Between { lo: u64, hi: u64 },
}

/// The bracket of measured (rate, p99) points, sorted by rate: the last
/// rate under `bound` and the first at or above it, among all points.
pub(crate) fn bracket(points: &[(u64, f64)], bound: f64) -> Crossing {
    let mut pts = points.to_vec();
    pts.sort_by_key(|p| p.0);
    match pts.iter().position(|&(_, p99)| p99 >= bound) {
        None => Crossing::Above(pts.last().map_or(0, |p| p.0)),
        Some(0) => Crossing::Below(pts[0].0),
        Some(i) => Crossing::Between {
            lo: pts[i - 1].0,
            hi: pts[i].0,
        },
    }
}

/// The next rate to measure inside a bracket: its geometric middle (the
/// curve spans decades), rounded to 10/s; None once the bracket is within 10%.
pub(crate) fn midpoint(lo: u64, hi: u64) -> Option<u64> {
    if hi as f64 <= lo as f64 * 1.1 {
        return None;
    }
    let mid = ((lo as f64 * hi as f64).sqrt() / 10.0).round() as u64 * 10;
    (mid > lo && mid < hi).then_some(mid)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(x: f64, ns: f64, rss_mib: f64) -> Point {
        Point {
            x,
            ns: Some(ns),
            rss_kib: rss_mib * 1024.0,
        }
    }

    #[test]
    fn flat_cpu_and_linear_memory_are_not_flagged() {
        let pts = [
            p(1.0, 900.0, 20.0),
            p(10.0, 400.0, 20.5),
            p(100.0, 250.0, 25.0),
            p(1000.0, 220.0, 70.0),
            p(10000.0, 230.0, 520.0),
        ];
        assert!(flags(&pts, false, "subscriber").iter().all(Option::is_none));
    }

    #[test]
    fn rising_cost_per_event_or_per_unit_of_memory_is_flagged_with_the_reason() {
        let pts = [
            p(1.0, 900.0, 20.0),
            p(100.0, 300.0, 30.0),
            p(1000.0, 700.0, 120.0),
            p(10000.0, 700.0, 3000.0),
        ];
        let f = flags(&pts, false, "session");
        assert_eq!(f[0], None);
        assert_eq!(f[1], None);
        let cpu = f[2].as_deref().unwrap();
        assert!(cpu.contains("CPU per event 2.3x that at 100"), "{cpu}");
        let rss = f[3].as_deref().unwrap();
        assert!(rss.contains("KiB per added session"), "{rss}");
        assert!(!rss.contains("CPU"), "{rss}");
    }

    #[test]
    fn on_the_size_axis_cost_may_grow_with_the_bytes() {
        let pts = [
            p(16.0, 200.0, 20.0),
            p(1024.0, 900.0, 22.0),
            p(65536.0, 40_000.0, 90.0),
        ];
        assert!(flags(&pts, true, "byte").iter().all(Option::is_none));
        let worse = [p(16.0, 200.0, 20.0), p(32.0, 700.0, 20.0)];
        assert!(flags(&worse, true, "byte")[1].is_some());
    }

    #[test]
    fn the_bracket_is_the_last_rate_under_and_the_first_over() {
        let b = 10_000.0;
        assert_eq!(
            bracket(&[(1000, 2000.0), (10_000, 900_000.0), (3000, 4000.0)], b),
            Crossing::Between { lo: 3000, hi: 10_000 }
        );
        assert_eq!(
            bracket(&[(1000, 20_000.0), (3000, 40_000.0)], b),
            Crossing::Below(1000)
        );
        assert_eq!(
            bracket(&[(1000, 2000.0), (3000, 4000.0)], b),
            Crossing::Above(3000)
        );
        // Bisection points join the curve's.
        assert_eq!(
            bracket(
                &[(1000, 2000.0), (3000, 4000.0), (5480, 12_000.0), (10_000, 9e5)],
                b
            ),
            Crossing::Between { lo: 3000, hi: 5480 }
        );
    }

    #[test]
    fn midpoints_are_geometric_and_stop_within_ten_percent() {
        assert_eq!(midpoint(1000, 10_000), Some(3160));
        assert_eq!(midpoint(3000, 10_000), Some(5480));
        assert_eq!(midpoint(1000, 1090), None);
    }
}
