//! The latency curve: p50/p99/max of paced events at each rate per
//! transport, the same with no vak (the floor), and where p99 crosses 10 ms.

use super::{
    latency_msg, log_result, median_cpu, ok_values, values, Measuring, Plan, RatePoint, Sample, Samples,
    Table, FLOOR_LABEL,
};
use crate::growth;
use crate::report::{self, Goal, Row, Unit};
use crate::scenarios::{self, Env, Transport};
use crate::sizes::Sizes;
use std::time::Instant;

/// The p99 bound of the latency goal and of the crossing search, in µs.
pub(super) const P99_BOUND_US: f64 = 10_000.0;

/// Round `run`: the curve on every transport, then the floor (with SSE).
pub(super) fn measure<'a>(plan: &'a Plan, s: &'a mut Samples, run: usize) -> Measuring<'a> {
    Box::pin(async move {
        let sizes = &plan.sizes;
        let tag = format!("run {run}/{}", sizes.runs);
        let subs = sizes.latency_subs;
        for &t in &plan.transports {
            for &rate in &sizes.latency_rates {
                let at = Instant::now();
                let r = measure_latency(&plan.env, t, subs, rate, sizes.latency_secs).await;
                log_result(
                    format!("{tag} latency {} x{subs} at {rate}/s", t.label()),
                    at,
                    r.as_ref().map(latency_msg),
                );
                s.latency.push((rate, Sample { run, subs, t, r }));
            }
        }
        if plan.transports.contains(&Transport::Sse) {
            for rate in floor_rates(sizes) {
                let at = Instant::now();
                let n = ((rate as f64 * sizes.latency_secs) as u64).max(10);
                let r = scenarios::floor_latency(&plan.env, subs, n, rate).await;
                log_result(
                    format!("{tag} latency floor x{subs} at {rate}/s"),
                    at,
                    r.as_ref().map(latency_msg),
                );
                let t = Transport::Sse;
                s.floor.push((rate, Sample { run, subs, t, r }));
            }
        }
    })
}

/// After the rounds: per transport, where its p99 crosses 10 ms.
pub(super) fn measure_crossing<'a>(plan: &'a Plan, s: &'a mut Samples) -> Measuring<'a> {
    Box::pin(async move {
        for &t in &plan.transports {
            let points = find_crossing(&plan.env, t, &plan.sizes, &s.latency).await;
            s.crossing.push((t, points));
        }
    })
}

/// One point of the latency curve: `rate` events/s for `secs` seconds.
async fn measure_latency(
    env: &Env,
    t: Transport,
    subs: usize,
    rate: u64,
    secs: f64,
) -> Result<scenarios::Latency, String> {
    let n = ((rate as f64 * secs) as u64).max(10);
    scenarios::latency(env, t, subs, n, rate).await
}

/// Where `t`'s p99 crosses 10 ms: the curve's median p99 per rate brackets
/// it, then each step measures the bracket's geometric middle once and
/// keeps the half that still brackets it (`cross_steps` steps at most); a
/// curve over 10 ms at its lowest rate is first measured a decade lower.
async fn find_crossing(
    env: &Env,
    t: Transport,
    sizes: &Sizes,
    curve: &[(u64, Sample<scenarios::Latency>)],
) -> Vec<RatePoint> {
    let mut known: Vec<(u64, f64)> = curve_medians(curve, t);
    let mut steps = Vec::new();
    for _ in 0..sizes.cross_steps {
        let mid = match growth::bracket(&known, P99_BOUND_US) {
            growth::Crossing::Between { lo, hi } => match growth::midpoint(lo, hi) {
                Some(mid) => mid,
                None => break,
            },
            // Over the bound already at the lowest rate: look a decade lower first.
            growth::Crossing::Below(lowest) if lowest >= 100 => lowest / 10,
            _ => break,
        };
        let at = Instant::now();
        let r = measure_latency(env, t, sizes.latency_subs, mid, sizes.latency_secs).await;
        log_result(
            format!("crossing {} x{} at {mid}/s", t.label(), sizes.latency_subs),
            at,
            r.as_ref().map(latency_msg),
        );
        match &r {
            Ok(x) => known.push((mid, x.p99_us)),
            // A failed point says nothing about the bracket: stop here.
            Err(_) => {
                steps.push((mid, r));
                break;
            }
        }
        steps.push((mid, r));
    }
    steps
}

/// The median p99 of `t`'s curve at each rate measured.
fn curve_medians(curve: &[(u64, Sample<scenarios::Latency>)], t: Transport) -> Vec<(u64, f64)> {
    let mut rates: Vec<u64> = curve.iter().filter(|(_, x)| x.t == t).map(|(r, _)| *r).collect();
    rates.sort_unstable();
    rates.dedup();
    rates
        .into_iter()
        .filter_map(|rate| {
            let p99: Vec<f64> = curve
                .iter()
                .filter(|(r, x)| *r == rate && x.t == t)
                .filter_map(|(_, x)| x.r.as_ref().ok().map(|l| l.p99_us))
                .collect();
            report::Stat::of(&p99).map(|s| (rate, s.median))
        })
        .collect()
}

/// Per transport its curve and crossing, then the floor's curve.
pub(super) fn rows(s: &Samples, plan: &Plan, table: &mut Table) {
    let sizes = &plan.sizes;
    for &t in &plan.transports {
        curve_rows(&s.latency, sizes, &sizes.latency_rates, t, t.label(), table);
        crossing_row(s, sizes, t, table);
    }
    let rates = floor_rates(sizes);
    curve_rows(&s.floor, sizes, &rates, Transport::Sse, FLOOR_LABEL, table);
}

/// The floor's rates: first 10 events/s, where each event reaches every
/// subscriber before the next is due (what one event costs), then the curve's.
pub(crate) fn floor_rates(sizes: &Sizes) -> Vec<u64> {
    let mut rates = vec![10];
    rates.extend(sizes.latency_rates.iter().filter(|&&r| r != 10));
    rates
}

/// p50, p99 and max of `t`'s points in `curve` at each rate, labelled
/// `label`; vak's p99 at 1 000 events/s is held to the goal (the floor's is not).
fn curve_rows(
    curve: &[(u64, Sample<scenarios::Latency>)],
    sizes: &Sizes,
    rates: &[u64],
    t: Transport,
    label: &'static str,
    table: &mut Table,
) {
    for &rate in rates {
        let samples: Vec<Sample<scenarios::Latency>> = curve
            .iter()
            .filter(|(r, x)| *r == rate && x.t == t)
            .map(|(_, x)| Sample {
                run: x.run,
                subs: x.subs,
                t: x.t,
                r: x.r.clone(),
            })
            .collect();
        let (v, err) = ok_values(&samples, t, None);
        if v.is_empty() && err.is_none() {
            continue;
        }
        let scen = format!(
            "2. Latency curve, {} subscribers, {rate} events/s",
            sizes.latency_subs
        );
        for (metric, vals) in [
            ("p50", values(&v, |x| x.p50_us)),
            ("p99", values(&v, |x| x.p99_us)),
            ("max", values(&v, |x| x.max_us)),
        ] {
            let mut r = Row::new(&scen, label, metric, &vals, Unit::Micros);
            if metric == "p99" {
                r.cpu = median_cpu(&v.iter().map(|(_, x)| x.cpu).collect::<Vec<_>>());
                if let (Some(st), 1000, false) = (&r.stat, rate, label == FLOOR_LABEL) {
                    r.goal = Some(Goal::at_most(st.median, P99_BOUND_US, true, "< 10 ms"));
                }
                if let Some(d) = report::Stat::of(&values(&v, |x| x.eps)) {
                    r.note = format!(
                        "{} delivered ({} offered: {rate}/s x {} subscribers)",
                        report::fmt_value(d.median, Unit::Rate),
                        report::fmt_value(rate as f64 * sizes.latency_subs as f64, Unit::Rate),
                        sizes.latency_subs
                    );
                }
                table.push_or_fail(r, err.clone());
                continue;
            } else if v.is_empty() {
                continue;
            }
            table.push(r);
        }
    }
}

/// The rate where `t`'s p99 crosses 10 ms, from its curve and bisection points.
fn crossing_row(s: &Samples, sizes: &Sizes, t: Transport, table: &mut Table) {
    let Some((_, steps)) = s.crossing.iter().find(|(x, _)| *x == t) else {
        return;
    };
    let mut known = curve_medians(&s.latency, t);
    let measured: Vec<String> = steps
        .iter()
        .map(|(rate, r)| match r {
            Ok(x) => {
                known.push((*rate, x.p99_us));
                format!("{rate}/s: p99 {:.2} ms", x.p99_us / 1e3)
            }
            Err(e) => format!("{rate}/s: failed ({e})"),
        })
        .collect();
    if known.is_empty() {
        return;
    }
    let scen = format!("2. Latency curve, {} subscribers", sizes.latency_subs);
    let (value, how) = match growth::bracket(&known, P99_BOUND_US) {
        growth::Crossing::Between { lo, hi } => (
            vec![(lo as f64 * hi as f64).sqrt()],
            format!("between {lo}/s (p99 under 10 ms) and {hi}/s (p99 at or over 10 ms); the value is their geometric middle"),
        ),
        growth::Crossing::Below(r) => (Vec::new(), format!("p99 is 10 ms or more already at {r}/s, the lowest rate measured")),
        growth::Crossing::Above(r) => (Vec::new(), format!("p99 is under 10 ms at every rate measured, up to {r}/s")),
    };
    let mut r = Row::new(
        &scen,
        t.label(),
        "rate where p99 crosses 10 ms",
        &value,
        Unit::Rate,
    );
    r.note = match measured.is_empty() {
        true => how,
        false => format!("{how}; bisection points (1 run each): {}", measured.join(", ")),
    };
    table.push(r);
}
