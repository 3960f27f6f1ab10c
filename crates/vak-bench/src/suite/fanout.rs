//! Fan-out: one session's burst to 1, 100, 1000 subscribers per transport,
//! against raw tonic (and the peer), and again with `--durability fsync`.

use super::{
    log, log_result, median_cpu, ok_values, plural, throughput_msg, throughput_note, values, Measuring, Plan,
    Sample, Samples, Table,
};
use crate::report::{Goal, Row, Stat, Unit};
use crate::scenarios::{self, Throughput, Transport};
use crate::server::ServeOpts;
use std::time::Instant;

/// Round `run`: every subscriber count on every transport, then the fsync ones.
pub(super) fn measure<'a>(plan: &'a Plan, s: &'a mut Samples, run: usize) -> Measuring<'a> {
    Box::pin(async move {
        for &subs in &plan.sizes.fanout_subs {
            for t in order(&plan.transports, plan.peer) {
                measure_one(plan, s, run, subs, t).await;
            }
            if plan.sizes.fsync_subs.contains(&subs) {
                for &t in &plan.transports {
                    let at = Instant::now();
                    let r = scenarios::fanout(&plan.env, t, subs, plan.sizes.burst, false, ServeOpts::FSYNC)
                        .await;
                    log_result(
                        format!(
                            "{} fan-out {} x{subs} --durability fsync",
                            tag(plan, run),
                            t.label()
                        ),
                        at,
                        r.as_ref().map(throughput_msg),
                    );
                    s.fanout_fsync.push(Sample { run, subs, t, r });
                }
            }
        }
    })
}

/// The transports of a fan-out, in the order they run: raw tonic after vak's
/// gRPC (its yardstick), the peer last.
fn order(transports: &[Transport], peer: bool) -> Vec<Transport> {
    let mut order = transports.to_vec();
    if transports.contains(&Transport::Grpc) {
        order.push(Transport::Tonic);
    }
    if peer {
        order.push(Transport::Nchan);
    }
    order
}

fn tag(plan: &Plan, run: usize) -> String {
    format!("run {run}/{}", plan.sizes.runs)
}

async fn measure_one(plan: &Plan, s: &mut Samples, run: usize, subs: usize, t: Transport) {
    if s.fanout_late.contains(&(t, subs)) {
        // A run that did not finish within the limit once takes
        // the whole limit again: its figure is that failure.
        log(format!(
            "{} fan-out {} x{subs}: skipped (an earlier run did not finish)",
            tag(plan, run),
            t.label()
        ));
        return;
    }
    let at = Instant::now();
    let r = scenarios::fanout(&plan.env, t, subs, plan.sizes.burst, false, ServeOpts::default()).await;
    if r.as_ref().is_err_and(|e| e.starts_with(scenarios::NOT_FINISHED)) {
        s.fanout_late.insert((t, subs));
    }
    log_result(
        format!("{} fan-out {} x{subs}", tag(plan, run), t.label()),
        at,
        r.as_ref().map(throughput_msg),
    );
    s.fanout.push(Sample { run, subs, t, r });
}

/// Per subscriber count measured: each transport's rows, then the fsync ones.
pub(super) fn rows(s: &Samples, plan: &Plan, table: &mut Table) {
    let fanout_subs = plan
        .sizes
        .fanout_subs
        .iter()
        .copied()
        .filter(|n| s.fanout.iter().any(|x| x.subs == *n));
    for subs in fanout_subs {
        let peer = s.fanout.iter().any(|x| x.t == Transport::Nchan);
        for t in order(&plan.transports, peer) {
            process_rows(s, plan, subs, t, table);
        }
        for &t in &plan.transports {
            fsync_rows(s, subs, t, table);
        }
    }
}

fn scenario(subs: usize) -> String {
    format!("1. Fan-out, {}", plural(subs, "subscriber"))
}

/// `x`'s figure over raw tonic's of the same run (measured back to back), per run.
fn paired(v: &[(usize, Throughput)], base: &[(usize, Throughput)], f: fn(&Throughput) -> f64) -> Vec<f64> {
    v.iter()
        .filter_map(|(run, x)| base.iter().find(|(r, _)| r == run).map(|(_, b)| f(x) / f(b)))
        .collect()
}

/// `t`'s delivered events/s at `subs` subscribers (with its goal and the
/// ratio to raw tonic), and when the last subscriber had all.
fn process_rows(s: &Samples, plan: &Plan, subs: usize, t: Transport, table: &mut Table) {
    let (tonic, _) = ok_values(&s.fanout, Transport::Tonic, Some(subs));
    let (v, err) = ok_values(&s.fanout, t, Some(subs));
    let tps: Vec<_> = v.iter().map(|(_, x)| *x).collect();
    let scen = scenario(subs);
    let mut r = Row::new(
        &scen,
        t.label(),
        "delivered events/s",
        &values(&v, |x| x.eps),
        Unit::Rate,
    );
    r.cpu = median_cpu(&tps.iter().map(|x| x.cpu).collect::<Vec<_>>());
    r.note = throughput_note(&tps);
    let ratio = Stat::of(&paired(&v, &tonic, |x| x.eps));
    match t {
        Transport::Sse => sse_vs_tonic(&mut r, subs, ratio),
        Transport::Grpc => grpc_vs_tonic(&mut r, subs, ratio),
        _ => {}
    }
    if let Some(before) = before_writer(t, subs).filter(|_| plan.sizes.burst == 100_000) {
        r.note = match r.note.is_empty() {
            true => before.to_string(),
            false => format!("{}; {before}", r.note),
        };
    }
    table.push_or_fail(r, err);
    if !v.is_empty() {
        let mut r = Row::new(
            &scen,
            t.label(),
            "last subscriber has all",
            &values(&v, |x| x.last_s),
            Unit::Seconds,
        );
        if t == Transport::Grpc {
            r.vs_tonic = Stat::of(&paired(&v, &tonic, |x| 1.0 / x.last_s)).map(|x| x.median);
        }
        table.push(r);
    }
}

/// SSE's ratio to raw tonic, measured back to back on the same machine: the
/// yardstick that carries across machines; and its goal (`sse_goal`).
fn sse_vs_tonic(r: &mut Row, subs: usize, ratio: Option<Stat>) {
    r.vs_tonic = ratio.map(|x| x.median);
    match (sse_goal(subs), &r.stat, ratio) {
        (Some(SseGoal::Rate(goal, text)), Some(st), _) => {
            r.goal = Some(Goal::at_least(st.median, goal, text))
        }
        (Some(SseGoal::VsTonic(goal, text)), _, Some(x)) => {
            r.goal = Some(Goal::at_least(x.median, goal, text))
        }
        _ => {}
    }
}

/// gRPC's ratio to raw tonic, held to 0.9x for one subscriber, 0.8x for more.
fn grpc_vs_tonic(r: &mut Row, subs: usize, ratio: Option<Stat>) {
    let Some(x) = ratio else { return };
    r.vs_tonic = Some(x.median);
    let (goal, text) = if subs == 1 {
        (0.9, ">= 0.9x raw tonic")
    } else {
        (0.8, ">= 0.8x raw tonic")
    };
    r.goal = Some(Goal::at_least(x.median, goal, text));
    if x.runs > 1 {
        r.note = format!("ratio {:.2}–{:.2} over runs; {}", x.min, x.max, r.note);
    }
}

/// `t`'s fan-out against `vak serve --durability fsync`: its share of the
/// `--durability process` figure of the same run.
fn fsync_rows(s: &Samples, subs: usize, t: Transport, table: &mut Table) {
    let (v, err) = ok_values(&s.fanout_fsync, t, Some(subs));
    if v.is_empty() && err.is_none() {
        return;
    }
    let (process, _) = ok_values(&s.fanout, t, Some(subs));
    let scen = scenario(subs);
    let tps: Vec<_> = v.iter().map(|(_, x)| *x).collect();
    let label = match t {
        Transport::Sse => "SSE, --durability fsync",
        _ => "gRPC, --durability fsync",
    };
    let mut r = Row::new(
        &scen,
        label,
        "delivered events/s",
        &values(&v, |x| x.eps),
        Unit::Rate,
    );
    r.cpu = median_cpu(&tps.iter().map(|x| x.cpu).collect::<Vec<_>>());
    let mut note = throughput_note(&tps);
    if let Some(x) = Stat::of(&paired(&v, &process, |x| x.eps)) {
        note = format!("{:.2}x of --durability process; {note}", x.median);
    }
    if t == Transport::Grpc {
        let (tonic, _) = ok_values(&s.fanout, Transport::Tonic, Some(subs));
        r.vs_tonic = Stat::of(&paired(&v, &tonic, |x| x.eps)).map(|x| x.median);
    }
    r.note = note;
    table.push_or_fail(r, err);
    if !v.is_empty() {
        table.push(Row::new(
            &scen,
            label,
            "last subscriber has all",
            &values(&v, |x| x.last_s),
            Unit::Seconds,
        ));
    }
}

enum SseGoal {
    Rate(f64, &'static str),
    VsTonic(f64, &'static str),
}

/// The goal of a fan-out's SSE throughput: 1.5 M/s for one subscriber
/// (issue 11); for 100 and 1000, no worse than before the session writer
/// (6.92 and 10.32 M/s at 6f83ee3), held as the ratio to raw tonic of that
/// run (5.72 and 5.42 M/s), since that run was on another machine.
fn sse_goal(subs: usize) -> Option<SseGoal> {
    match subs {
        1 => Some(SseGoal::Rate(1.5e6, ">= 1.5 M/s")),
        100 => Some(SseGoal::VsTonic(
            1.21,
            ">= 1.21x raw tonic (as before the writer)",
        )),
        1000 => Some(SseGoal::VsTonic(
            1.90,
            ">= 1.90x raw tonic (as before the writer)",
        )),
        _ => None,
    }
}

/// The committed figures of the same rows before the session writer (commit
/// 6f83ee3, BENCHMARKS.md of 2026-11-30, on an AMD EPYC machine), for comparison in the notes.
fn before_writer(t: Transport, subs: usize) -> Option<&'static str> {
    Some(match (t, subs) {
        (Transport::Sse, 1) => "before the writer (6f83ee3, another machine): 376 k/s, 0.12x raw tonic",
        (Transport::Grpc, 1) => "before the writer (6f83ee3, another machine): 688 k/s, 0.22x raw tonic",
        (Transport::Sse, 100) => {
            "before the writer (6f83ee3, another machine): 6.92 M/s, 1.21x raw tonic, 136 ns per event"
        }
        (Transport::Grpc, 100) => {
            "before the writer (6f83ee3, another machine): 7.31 M/s, 1.36x raw tonic, 160 ns per event"
        }
        (Transport::Sse, 1000) => {
            "before the writer (6f83ee3, another machine): 10.32 M/s, 1.90x raw tonic, 96 ns per event"
        }
        (Transport::Grpc, 1000) => {
            "before the writer (6f83ee3, another machine): 11.93 M/s, 2.11x raw tonic, 114 ns per event"
        }
        (Transport::Tonic, 1) => "before the writer (6f83ee3, another machine): 3.10 M/s",
        (Transport::Tonic, 100) => "before the writer (6f83ee3, another machine): 5.72 M/s, 164 ns per event",
        (Transport::Tonic, 1000) => {
            "before the writer (6f83ee3, another machine): 5.42 M/s, 183 ns per event"
        }
        _ => return None,
    })
}
