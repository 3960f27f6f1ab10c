//! Load beside the fan-out: many sessions at once, idle streams' memory, and
//! a stalled client among readers.

use super::{
    log_result, median_cpu, ok_values, throughput_msg, throughput_note, values, Measuring, Plan, Sample,
    Samples, Table,
};
use crate::report::{self, Goal, Row, Unit};
use crate::scenarios::{self, Transport};
use crate::server::ServeOpts;
use std::time::Instant;

fn tag(plan: &Plan, run: usize) -> String {
    format!("run {run}/{}", plan.sizes.runs)
}

/// Round `run`: many sessions, each bursting to its one subscriber, per transport.
pub(super) fn measure_sessions<'a>(plan: &'a Plan, s: &'a mut Samples, run: usize) -> Measuring<'a> {
    Box::pin(async move {
        for &t in &plan.transports {
            let at = Instant::now();
            let subs = plan.sizes.sessions;
            let r = scenarios::many_sessions(&plan.env, t, subs, plan.sizes.session_burst).await;
            log_result(
                format!("{} sessions {} x{subs}", tag(plan, run), t.label()),
                at,
                r.as_ref().map(throughput_msg),
            );
            s.sessions.push(Sample { run, subs, t, r });
        }
    })
}

/// Delivered events/s of the many-sessions runs, with the server's peak RSS.
pub(super) fn sessions_rows(s: &Samples, plan: &Plan, table: &mut Table) {
    let sizes = &plan.sizes;
    for &t in &plan.transports {
        let (v, err) = ok_values(&s.sessions, t, None);
        if v.is_empty() && err.is_none() {
            continue;
        }
        let tps: Vec<_> = v.iter().map(|(_, x)| *x).collect();
        let scen = format!(
            "3. Many sessions, {} x /burst {}",
            sizes.sessions, sizes.session_burst
        );
        let mut r = Row::new(
            &scen,
            t.label(),
            "delivered events/s",
            &values(&v, |x| x.eps),
            Unit::Rate,
        );
        r.cpu = median_cpu(&tps.iter().map(|x| x.cpu).collect::<Vec<_>>());
        r.note = throughput_note(&tps);
        if let Some(peak) = report::Stat::of(&values(&v, |x| x.peak_kib as f64 / 1024.0)) {
            r.note = format!("{}; server peak RSS {:.0} MiB", r.note, peak.median);
        }
        table.push_or_fail(r, err);
    }
}

/// Round `run`: the server's memory per idle stream, per transport (the
/// idle-only ones too).
pub(super) fn measure_idle<'a>(plan: &'a Plan, s: &'a mut Samples, run: usize) -> Measuring<'a> {
    Box::pin(async move {
        for &t in &plan.idle_transports {
            let at = Instant::now();
            let subs = plan.sizes.idle;
            let r = scenarios::idle(&plan.env, t, subs).await;
            let msg = r.as_ref().map(|x| {
                format!(
                    "{:.2} KiB per stream (VmRSS {} -> {} KiB, {} connections, server RLIMIT_NOFILE {})",
                    x.kib_per_stream, x.before_kib, x.after_kib, x.connections, x.server_nofile
                )
            });
            log_result(format!("{} idle {} x{subs}", tag(plan, run), t.label()), at, msg);
            s.idle.push(Sample { run, subs, t, r });
            if t == Transport::Sse {
                let at = Instant::now();
                let r = crate::storm::storm(&plan.env, subs).await;
                let msg = r
                    .as_ref()
                    .map(|x| format!("{:.2?} KiB per stream", x.kib_per_stream));
                log_result(format!("{} storm {} x{subs}", tag(plan, run), t.label()), at, msg);
                s.storm.push(Sample { run, subs, t, r });
            }
        }
    })
}

/// Server RSS per idle stream, per transport measured.
pub(super) fn idle_rows(s: &Samples, plan: &Plan, table: &mut Table) {
    let idle_transports = [
        Transport::Sse,
        Transport::SseTls,
        Transport::SseH2,
        Transport::Grpc,
        Transport::Nchan,
    ]
    .into_iter()
    .filter(|t| s.idle.iter().any(|x| x.t == *t));
    for t in idle_transports {
        let (v, err) = ok_values(&s.idle, t, None);
        if v.is_empty() && err.is_none() {
            continue;
        }
        let scen = format!("4. Idle, {} streams", plan.sizes.idle);
        let mut r = Row::new(
            &scen,
            t.label(),
            "server RSS per stream",
            &values(&v, |x| x.kib_per_stream),
            Unit::KiB,
        );
        if t == Transport::Sse {
            if let Some(st) = &r.stat {
                r.goal = Some(Goal::at_most(st.median, 4.0, false, "<= 4 KiB"));
            }
        }
        if let Some((_, x)) = v.first() {
            r.note = format!(
                "{} TCP connections; server RLIMIT_NOFILE {}",
                x.connections, x.server_nofile
            );
        }
        table.push_or_fail(r, err);
    }
    storm_rows(s, plan, table);
}

/// Server RSS per stream a reconnect storm leaves: the first storm's, the
/// others in the note.
fn storm_rows(s: &Samples, plan: &Plan, table: &mut Table) {
    let (v, err) = ok_values(&s.storm, Transport::Sse, None);
    if v.is_empty() && err.is_none() {
        return;
    }
    let scen = format!(
        "4. Idle, reconnect storm: {} streams opened at once, {} storms",
        plan.sizes.idle,
        crate::storm::STORMS
    );
    let mut r = Row::new(
        &scen,
        Transport::Sse.label(),
        "server RSS per stream 2 s after the first storm",
        &values(&v, |x| x.kib_per_stream[0]),
        Unit::KiB,
    );
    if let Some(st) = &r.stat {
        r.goal = Some(Goal::at_most(st.median, 4.0, false, "<= 4 KiB"));
    }
    if let Some((_, x)) = v.first() {
        let kib = |a: &[f64]| a.iter().map(|k| format!("{k:.1}")).collect::<Vec<_>>().join(", ");
        r.note = format!(
            "each storm, 2 s after: {} KiB per stream; peak (VmHWM) {} KiB; above the server's {} KiB before the first",
            kib(&x.kib_per_stream),
            kib(&x.peak_kib_per_stream),
            x.before_kib
        );
    }
    table.push_or_fail(r, err);
}

/// Round `run`: per transport, a fan-out, then the same with one subscriber stalled.
pub(super) fn measure_stalled<'a>(plan: &'a Plan, s: &'a mut Samples, run: usize) -> Measuring<'a> {
    Box::pin(async move {
        let env = &plan.env;
        for &t in &plan.transports {
            let at = Instant::now();
            let subs = plan.sizes.stalled_subs;
            let n = plan.sizes.stall_burst;
            let r = match scenarios::fanout(env, t, subs, n, false, ServeOpts::default()).await {
                Ok(base) => scenarios::fanout(env, t, subs, n, true, ServeOpts::default())
                    .await
                    .map(|st| (base, st)),
                Err(e) => Err(e),
            };
            let msg = r.as_ref().map(|(b, x)| {
                format!(
                    "unstalled: {}; with one stalled, the {} readers: {}",
                    throughput_msg(b),
                    subs - 1,
                    throughput_msg(x)
                )
            });
            log_result(
                format!("{} stalled {} x{subs}", tag(plan, run), t.label()),
                at,
                msg,
            );
            s.stalled.push(Sample { run, subs, t, r });
        }
    })
}

/// The readers' throughput kept with one of them stalled, and the server's peak RSS.
pub(super) fn stalled_rows(s: &Samples, plan: &Plan, table: &mut Table) {
    for &t in &plan.transports {
        let (v, err) = ok_values(&s.stalled, t, None);
        if v.is_empty() && err.is_none() {
            continue;
        }
        let scen = format!(
            "5. Stalled client, 1 of {}, /burst {}",
            plan.sizes.stalled_subs, plan.sizes.stall_burst
        );
        // Per-reader throughput is burst / time-to-last, so the kept share is
        // the unstalled time over the stalled time of the same run.
        let kept = values(&v, |(b, x)| b.last_s / x.last_s);
        let mut r = Row::new(
            &scen,
            t.label(),
            "readers' throughput kept",
            &kept,
            Unit::Fraction,
        );
        if let Some(st) = &r.stat {
            r.goal = Some(Goal::at_least(st.median, 0.9, ">= 90% of unstalled"));
        }
        r.cpu = median_cpu(&v.iter().map(|(_, (_, x))| x.cpu).collect::<Vec<_>>());
        if let (Some(b), Some(x)) = (
            report::Stat::of(&values(&v, |(b, _)| b.eps)),
            report::Stat::of(&values(&v, |(_, x)| x.eps)),
        ) {
            r.note = format!(
                "readers {} unstalled, {} with the stalled one (medians)",
                report::fmt_value(b.median, Unit::Rate),
                report::fmt_value(x.median, Unit::Rate)
            );
        }
        table.push_or_fail(r, err);
        if !v.is_empty() {
            let mut r = Row::new(
                &scen,
                t.label(),
                "server peak RSS",
                &values(&v, |(_, x)| x.peak_kib as f64 / 1024.0),
                Unit::MiB,
            );
            if let Some(b) = report::Stat::of(&values(&v, |(b, _)| b.peak_kib as f64 / 1024.0)) {
                r.note = format!("unstalled: {:.0} MiB", b.median);
            }
            table.push(r);
        }
    }
}
