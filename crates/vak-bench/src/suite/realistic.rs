//! The realistic-load rows: per point, delivered/offered, p50/p99/max latency, server CPU and RSS.

use super::{cpu_note, log, log_result, median_cpu, Measuring, Plan, Sample, Samples, Table, FLOOR_LABEL};
use crate::realistic::{self, Load, LoadSize};
use crate::report::{self, Goal, Row, Unit};
use crate::scenarios::Transport;
use std::time::Instant;

/// The p99 goal at 10 000 x 50/s x 2 (issue 34), in µs, and its server CPU goal in cores.
const P99_GOAL_US: f64 = 50_000.0;
const CORES_GOAL: f64 = 1.0;

/// The transport column: the readers are both.
const LABEL: &str = "half SSE, half gRPC";
/// A run, as logged.
fn load_msg(x: &Load) -> String {
    let p = |t: Option<crate::scenarios::Pcts>| t.map_or("-".into(), |p| format!("{:.2} ms", p.p99_us / 1e3));
    format!(
        "{} delivered of {} offered ({:.0}%) over {:.1} s{}; p50 {:.2} ms p99 {:.2} ms (SSE {}, gRPC {}) max {:.2} ms; \
{} events per frame; readers opened in {:.1} s, runs admitted in {:.2} s (start at {:.2} s, {} late), last delta {:.2} s after the start; \
server RSS {} MiB open, {} MiB peak, {} threads at the end; steady window {}; whole run {}",
        report::fmt_value(x.delivered_eps, Unit::Rate),
        report::fmt_value(x.offered_eps, Unit::Rate),
        x.delivered_eps / x.offered_eps.max(1e-9) * 100.0,
        x.window_s,
        if x.steady { "" } else { " (no steady window: the whole run)" },
        x.all.p50_us / 1e3,
        x.all.p99_us / 1e3,
        p(x.sse),
        p(x.grpc),
        x.all.max_us / 1e3,
        format_args!("{:.2}", x.deliveries as f64 / x.frames.max(1) as f64),
        x.open_s,
        x.admit_s,
        x.lead_s,
        x.late,
        x.stream_s,
        x.open_kib / 1024,
        x.peak_kib / 1024,
        x.threads,
        cpu_note(&x.cpu),
        cpu_note(&x.run_cpu)
    )
}

/// Round `run`: every point, each on a fresh server.
pub(super) fn measure<'a>(plan: &'a Plan, s: &'a mut Samples, run: usize) -> Measuring<'a> {
    Box::pin(async move {
        if !(plan.transports.contains(&Transport::Sse) && plan.transports.contains(&Transport::Grpc)) {
            log("realistic: needs both SSE and gRPC (--transports): not measured".into());
            return;
        }
        for &size in &plan.sizes.realistic {
            let at = Instant::now();
            let r = realistic::realistic(&plan.env, size).await;
            log_result(
                format!("run {run}/{} realistic {}", plan.sizes.runs, point(&size)),
                at,
                r.as_ref().map(load_msg),
            );
            let t = Transport::Sse;
            let subs = size.sessions * size.readers;
            s.realistic.push((size, Sample { run, subs, t, r }));
            // The floor of the same point, right after, where it fits.
            if let Err(why) = realistic::floor_fits(size) {
                if !s.realistic_floor_skipped.iter().any(|(p, _)| *p == size) {
                    log(format!("realistic floor {}: not measured: {why}", point(&size)));
                    s.realistic_floor_skipped.push((size, why));
                }
                continue;
            }
            let at = Instant::now();
            let r = realistic::realistic_floor(&plan.env, size).await;
            log_result(
                format!("run {run}/{} realistic floor {}", plan.sizes.runs, point(&size)),
                at,
                r.as_ref().map(load_msg),
            );
            s.realistic_floor.push((size, Sample { run, subs, t, r }));
        }
    })
}

/// `10000 sessions x 50 deltas/s x 2 readers, 10 s`.
fn point(size: &LoadSize) -> String {
    format!(
        "{} sessions x {} deltas/s x {} readers, {} s",
        size.sessions, size.rate, size.readers, size.secs
    )
}

/// Per point: delivered/offered, p50/p99/max, server CPU (cores), server peak RSS.
/// Then the same for the floor (no vak), without goals.
pub(super) fn rows(s: &Samples, plan: &Plan, table: &mut Table) {
    for size in &plan.sizes.realistic {
        point_rows(&s.realistic, size, LABEL, true, table);
        point_rows(&s.realistic_floor, size, FLOOR_LABEL, false, table);
        if let Some((_, why)) = s.realistic_floor_skipped.iter().find(|(p, _)| p == size) {
            let mut r = Row::new(
                &format!("11. Realistic load, {}", point(size)),
                FLOOR_LABEL,
                "delivered / offered",
                &[],
                Unit::Fraction,
            );
            r.note = format!("not measured on this machine: {why}");
            table.push(r);
        }
    }
}

/// One point's rows from `samples`, under the transport column `label`;
/// `goals`: vak's rows (the floor's are not held to the goals).
fn point_rows(
    samples: &[(LoadSize, Sample<Load>)],
    size: &LoadSize,
    label: &'static str,
    goals: bool,
    table: &mut Table,
) {
    {
        let mut v: Vec<Load> = Vec::new();
        let mut err = None;
        for (_, x) in samples.iter().filter(|(p, _)| p == size) {
            match &x.r {
                Ok(l) => v.push(*l),
                Err(e) => err = Some(e.clone()),
            }
        }
        if v.is_empty() && err.is_none() {
            return;
        }
        let scen = format!("11. Realistic load, {}", point(size));
        let vals = |f: fn(&Load) -> f64| v.iter().map(f).collect::<Vec<f64>>();
        let med = |f: fn(&Load) -> f64| report::Stat::of(&vals(f)).map(|st| st.median);
        let cpu = median_cpu(&v.iter().map(|x| x.cpu).collect::<Vec<_>>());

        let mut r = Row::new(
            &scen,
            label,
            "delivered / offered",
            &vals(|x| x.delivered_eps / x.offered_eps.max(1e-9)),
            Unit::Fraction,
        );
        r.cpu = cpu;
        if let (Some(d), Some(w), Some(st)) =
            (med(|x| x.delivered_eps), med(|x| x.window_s), med(|x| x.stream_s))
        {
            let whole = v.iter().filter(|x| !x.steady).count();
            r.note = format!(
                "{} delivered of {} offered ({} x {}/s x {}) in a {w:.1} s steady window{}; every reader had all {} deltas once, in order, the last {:.2} s after the common start (nominal {:.2} s){}",
                report::fmt_value(d, Unit::Rate),
                report::fmt_value(size.offered(), Unit::Rate),
                size.sessions,
                size.rate,
                size.readers,
                match whole {
                    0 => String::new(),
                    k => format!(" ({k} run(s) had none: over the whole run)"),
                },
                size.deltas(),
                st,
                (size.deltas() - 1) as f64 / size.rate as f64,
                match v.iter().map(|x| x.late).max().unwrap_or(0) {
                    0 => String::new(),
                    k => format!("; up to {k} sessions' Run sent after the common start (they started late)"),
                }
            );
        }
        table.push_or_fail(r, err.clone());
        if v.is_empty() {
            return;
        }
        for (metric, f) in [
            ("p50", (|x: &Load| x.all.p50_us) as fn(&Load) -> f64),
            ("p99", |x: &Load| x.all.p99_us),
            ("max", |x: &Load| x.all.max_us),
        ] {
            let mut r = Row::new(&scen, label, metric, &vals(f), Unit::Micros);
            if metric == "p99" {
                if let (Some(st), true) = (&r.stat, goals && size.is_goal_point()) {
                    r.goal = Some(Goal::at_most(st.median, P99_GOAL_US, true, "< 50 ms"));
                }
                let by = |g: fn(&Load) -> Option<crate::scenarios::Pcts>| {
                    report::Stat::of(
                        &v.iter()
                            .filter_map(|x| g(x).map(|p| p.p99_us))
                            .collect::<Vec<_>>(),
                    )
                    .map_or("-".into(), |st| report::fmt_value(st.median, Unit::Micros))
                };
                r.note = format!(
                    "publish (the model's stamp) to receipt; SSE readers' p99 {}, gRPC readers' {}",
                    by(|x| x.sse),
                    by(|x| x.grpc)
                );
            }
            table.push(r);
        }
        let mut r = Row::new(
            &scen,
            label,
            "server CPU",
            &vals(|x| x.cpu.server / x.cpu.wall.max(1e-9)),
            Unit::Cores,
        );
        if let (Some(st), true) = (&r.stat, goals && size.is_goal_point()) {
            r.goal = Some(Goal::at_most(st.median, CORES_GOAL, false, "<= 1 core"));
        }
        r.cpu = cpu;
        if let Some(ns) = med(|x| x.cpu.server * 1e9 / (x.delivered_eps * x.cpu.wall).max(1.0)) {
            r.note = format!("{ns:.0} ns of server CPU per delivered event, in the steady window");
        }
        table.push(r);
        let mut r = Row::new(
            &scen,
            label,
            "server peak RSS",
            &vals(|x| x.peak_kib as f64 / 1024.0),
            Unit::MiB,
        );
        if let (Some(open), Some(threads)) = (med(|x| x.open_kib as f64 / 1024.0), med(|x| x.threads as f64))
        {
            r.note = format!(
                "VmHWM; {open:.0} MiB with the sessions made and every reader open, before the runs; {threads:.0} server threads at the end of the run"
            );
        }
        table.push(r);
    }
}
