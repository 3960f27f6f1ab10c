//! What reads history: replay from the ledger on disk, and search over many sessions.

use super::{
    cpu_note, log_result, median_cpu, ok_values, values, Measuring, Plan, Sample, Samples, Table,
    MIN_CPU_WALL,
};
use crate::report::{self, Goal, Row, Unit};
use crate::scenarios::{self, Replay, Transport};
use std::time::Instant;

/// Round `run` (of the first `replay_runs`): each (transport, sessions, history) replay.
pub(super) fn measure<'a>(plan: &'a Plan, s: &'a mut Samples, run: usize) -> Measuring<'a> {
    Box::pin(async move {
        if run > plan.sizes.replay_runs {
            return;
        }
        let tag = format!("run {run}/{}", plan.sizes.runs);
        for &(t, subs, history) in &plan.sizes.replay {
            let at = Instant::now();
            let r = scenarios::replay(&plan.env, t, subs, history).await;
            let msg = r.as_ref().map(replay_msg);
            log_result(format!("{tag} replay {} x{subs} x{history}", t.label()), at, msg);
            s.replay.push(Sample { run, subs, t, r });
        }
    })
}

fn replay_msg(x: &Replay) -> String {
    format!(
        "{} events in {:.2} s ({:.0} events/s, {} frames), server RSS {} KiB after writing, {} KiB before the readers, peak {} KiB during the replay ({}), {} KiB before it; history written in {:.1} s, {:.0} MiB on disk; {}",
        x.events,
        x.replay_s,
        x.eps,
        x.frames,
        x.written_kib,
        x.before_kib,
        x.peak_kib,
        if x.hwm_reset { "VmHWM" } else { "sampled VmRSS" },
        x.lifetime_peak_kib,
        x.write_s,
        x.ledger_bytes as f64 / (1 << 20) as f64,
        cpu_note(&x.cpu)
    )
}

/// Per (transport, sessions, history): the time until every reader has
/// all, replayed events/s, and the server's peak RSS during the replay.
pub(super) fn rows(s: &Samples, plan: &Plan, table: &mut Table) {
    for &(t, sessions, history) in &plan.sizes.replay {
        let (v, err) = ok_values(&s.replay, t, None);
        if v.is_empty() && err.is_none() {
            continue;
        }
        let scen = format!(
            "6. Replay from disk, {} sessions x {} events back, 1 stalled subscriber each",
            sessions, history
        );
        let mut r = Row::new(
            &scen,
            t.label(),
            "every reader has all",
            &values(&v, |x| x.replay_s),
            Unit::Seconds,
        );
        r.cpu = median_cpu(&v.iter().map(|(_, x)| x.cpu).collect::<Vec<_>>());
        if let Some((_, x)) = v.first() {
            r.note = format!(
                "{} events replayed in {} frames, cursor {} back (ring 1024)",
                x.events, x.frames, history
            );
        }
        table.push_or_fail(r, err);
        if v.is_empty() {
            continue;
        }
        table.push(rate_row(&scen, t, &v));
        table.push(peak_row(&scen, t, &v));
    }
}

fn rate_row(scen: &str, t: Transport, v: &[(usize, Replay)]) -> Row {
    let mut r = Row::new(
        scen,
        t.label(),
        "replayed events/s",
        &values(v, |x| x.eps),
        Unit::Rate,
    );
    let ns = report::Stat::of(
        &v.iter()
            .filter(|(_, x)| x.events > 0 && x.cpu.wall >= MIN_CPU_WALL)
            .map(|(_, x)| x.cpu.server * 1e9 / x.events as f64)
            .collect::<Vec<_>>(),
    );
    if let Some(ns) = ns {
        r.note = format!("server CPU {:.0} ns per replayed event", ns.median);
    }
    r
}

fn peak_row(scen: &str, t: Transport, v: &[(usize, Replay)]) -> Row {
    let mut r = Row::new(
        scen,
        t.label(),
        "server peak RSS during the replay",
        &values(v, |x| x.peak_kib as f64 / 1024.0),
        Unit::MiB,
    );
    let med = |f: fn(&Replay) -> f64| report::Stat::of(&values(v, f)).map_or(0.0, |s| s.median);
    let how = if v.iter().all(|(_, x)| x.hwm_reset) {
        "VmHWM, reset just before the readers"
    } else {
        "VmRSS sampled every 20 ms (the kernel refused to reset VmHWM)"
    };
    r.note = format!(
        "{how}; VmRSS {:.0} MiB once the history was written, {:.0} MiB with the stalled subscribers attached \
(just before the readers); {:.0} MiB VmHWM before that; history: {:.0} MiB of ledger written in {:.1} s (medians)",
        med(|x| x.written_kib as f64 / 1024.0),
        med(|x| x.before_kib as f64 / 1024.0),
        med(|x| x.lifetime_peak_kib as f64 / 1024.0),
        med(|x| x.ledger_bytes as f64 / (1u64 << 20) as f64),
        med(|x| x.write_s),
    );
    r
}

/// After the rounds, `runs` times: sessions written, then one word searched.
pub(super) fn measure_search<'a>(plan: &'a Plan, s: &'a mut Samples) -> Measuring<'a> {
    Box::pin(async move {
        let sizes = &plan.sizes;
        for run in 1..=sizes.runs {
            let at = Instant::now();
            let (n, q) = (sizes.search_sessions, sizes.search_queries);
            let r = scenarios::search(&plan.env, n, q).await;
            let msg = r.as_ref().map(|x| {
                format!(
                    "p50 {:.2} ms p99 {:.2} ms max {:.2} ms ({} queries), {n} sessions written in {:.1} s, {}",
                    x.p50_us / 1e3,
                    x.p99_us / 1e3,
                    x.max_us / 1e3,
                    x.queries,
                    x.write_s,
                    cpu_note(&x.cpu)
                )
            });
            log_result(format!("run {run}/{} search x{n}", sizes.runs), at, msg);
            let t = Transport::Grpc;
            s.search.push(Sample { run, subs: n, t, r });
        }
    })
}

/// p50 and p99 of a search's round trip, held to 50 ms.
pub(super) fn search_rows(s: &Samples, plan: &Plan, table: &mut Table) {
    let sizes = &plan.sizes;
    let (v, err) = ok_values(&s.search, Transport::Grpc, None);
    if v.is_empty() && err.is_none() {
        return;
    }
    let scen = format!("7. Search, the first of {} sessions' word", sizes.search_sessions);
    for (metric, vals) in [
        ("p50", values(&v, |x| x.p50_us)),
        ("p99", values(&v, |x| x.p99_us)),
    ] {
        if metric == "p50" && v.is_empty() {
            continue;
        }
        let mut r = Row::new(&scen, Transport::Grpc.label(), metric, &vals, Unit::Micros);
        if let Some(st) = &r.stat {
            r.goal = Some(Goal::at_most(st.median, 50_000.0, true, "< 50 ms"));
        }
        if metric != "p99" {
            table.push(r);
            continue;
        }
        r.cpu = median_cpu(&v.iter().map(|(_, x)| x.cpu).collect::<Vec<_>>());
        r.note = format!(
            "{} queries in a row per run, round trip through gRPC Search; sessions written in {:.1} s",
            sizes.search_queries,
            report::Stat::of(&values(&v, |x| x.write_s)).map_or(0.0, |x| x.median)
        );
        table.push_or_fail(r, err.clone());
    }
}
