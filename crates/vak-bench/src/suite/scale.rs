//! How vak scales: the growth table (CPU per event and peak RSS as
//! subscribers, sessions and delta sizes grow) and the cluster of 3 replicas.

use super::{
    cpu_note, latency::P99_BOUND_US, latency_msg, log, log_result, median_cpu, ns_per_event, ok_values,
    plural, throughput_msg, throughput_note, values, Measuring, Plan, Sample, Samples, Table, FLOOR_LABEL,
    MIN_CPU_WALL,
};
use crate::report::{self, Goal, Row, Unit};
use crate::scenarios::{self, Throughput, Transport};
use crate::server::ServeOpts;
use crate::sizes::Sizes;
use crate::{cluster, growth};
use std::path::PathBuf;
use std::time::Instant;

/// The growth table's axes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Axis {
    /// One session, x subscribers.
    Subscribers,
    /// x sessions, one subscriber each.
    Sessions,
    /// Deltas of x bytes, to `growth_size_subs` subscribers.
    Size,
}

/// One point of the growth table: its axis value, the deltas each stream got, what came out.
pub(crate) struct GrowthSample {
    pub(crate) axis: Axis,
    pub(crate) x: u64,
    pub(crate) n: u64,
    pub(crate) r: Result<scenarios::Throughput, String>,
    /// On the size axis: the same burst with no vak (`scenarios::floor_sized`).
    pub(crate) floor: Option<Result<scenarios::Throughput, String>>,
}

/// Deltas each stream of a growth point gets: about `growth_deliveries`
/// deliveries in all (half as many for sessions, which deliver slower, but
/// at least `growth_session_deltas` per session), at least
/// `growth_min_events`; a size point's bytes are bounded too.
pub(crate) fn growth_events(sizes: &Sizes, axis: Axis, x: u64) -> u64 {
    let min = sizes.growth_min_events;
    let subs = sizes.growth_size_subs.max(1) as u64;
    match axis {
        Axis::Subscribers => (sizes.growth_deliveries / x.max(1)).max(min),
        Axis::Sessions => (sizes.growth_deliveries / 2 / x.max(1))
            .max(sizes.growth_session_deltas)
            .max(min),
        Axis::Size => (sizes.growth_size_bytes / (x.max(1) * subs))
            .min(sizes.growth_deliveries / subs)
            .max(min),
    }
}

/// After the rounds, `growth_runs` times: every point of the growth table, over SSE.
pub(super) fn measure_growth<'a>(plan: &'a Plan, s: &'a mut Samples) -> Measuring<'a> {
    Box::pin(async move {
        let sizes = &plan.sizes;
        for run in 1..=sizes.growth_runs {
            for (axis, x) in growth_points(sizes) {
                let n = growth_events(sizes, axis, x);
                let at = Instant::now();
                let r = growth_point(plan, axis, x, n).await;
                let msg = r.as_ref().map(|x| {
                    format!(
                        "{:.0} events/s, {:.0} ns server CPU per event, peak RSS {} KiB, {}",
                        x.eps,
                        x.cpu.server * 1e9 / x.events.max(1) as f64,
                        x.peak_kib,
                        cpu_note(&x.cpu)
                    )
                });
                log_result(format!("run {run} growth {axis:?} {x} x /burst {n}"), at, msg);
                // Right after it, what the machine allows the same burst with no vak.
                let floor = match axis {
                    Axis::Size => {
                        let at = Instant::now();
                        let f = scenarios::floor_sized(&plan.env, sizes.growth_size_subs, n, x).await;
                        let msg = f
                            .as_ref()
                            .map(|t| format!("{:.0} events/s, {}", t.eps, cpu_note(&t.cpu)));
                        log_result(format!("run {run} growth floor {x} x /burst {n}"), at, msg);
                        Some(f)
                    }
                    _ => None,
                };
                s.growth.push(GrowthSample { axis, x, n, r, floor });
            }
        }
    })
}

/// Every point of the growth table: its axis and value.
fn growth_points(sizes: &Sizes) -> impl Iterator<Item = (Axis, u64)> + '_ {
    sizes
        .growth_subs
        .iter()
        .map(|&x| (Axis::Subscribers, x as u64))
        .chain(sizes.growth_sessions.iter().map(|&x| (Axis::Sessions, x as u64)))
        .chain(sizes.growth_sizes.iter().map(|&x| (Axis::Size, x)))
}

/// One growth point, `n` deltas to each stream.
async fn growth_point(plan: &Plan, axis: Axis, x: u64, n: u64) -> Result<Throughput, String> {
    let env = &plan.env;
    match axis {
        Axis::Subscribers => {
            scenarios::fanout(env, Transport::Sse, x as usize, n, false, ServeOpts::default()).await
        }
        Axis::Sessions => scenarios::many_sessions(env, Transport::Sse, x as usize, n).await,
        Axis::Size => scenarios::fanout_sized(env, plan.sizes.growth_size_subs, n, x).await,
    }
}

/// What one growth point measured over its runs: its value, the deltas per
/// stream, the successful runs, the last failure.
struct PointRuns {
    x: u64,
    n: u64,
    ok: Vec<Throughput>,
    err: Option<String>,
    /// The floor's runs (size axis), and its last failure.
    floor: Vec<Throughput>,
    floor_err: Option<String>,
}

/// The growth table: per point, server CPU per delivered event and peak
/// RSS, with the points that grow faster than linearly flagged.
pub(super) fn growth_rows(s: &Samples, plan: &Plan, table: &mut Table) {
    let sizes = &plan.sizes;
    for (axis, unit, per_byte) in [
        (Axis::Subscribers, "subscriber", false),
        (Axis::Sessions, "session", false),
        (Axis::Size, "byte of delta", true),
    ] {
        let per_point: Vec<PointRuns> = growth_points(sizes)
            .filter(|(a, _)| *a == axis)
            .filter_map(|(_, x)| point_runs(s, axis, x))
            .collect();
        let flags = point_flags(&per_point, per_byte, unit);
        for p in &per_point {
            let flag = flags.iter().find(|(x, _)| *x == p.x).and_then(|(_, f)| f.clone());
            point_rows(sizes, axis, p, flag, table);
        }
    }
}

fn point_runs(s: &Samples, axis: Axis, x: u64) -> Option<PointRuns> {
    let all: Vec<&GrowthSample> = s.growth.iter().filter(|g| g.axis == axis && g.x == x).collect();
    let n = all.first()?.n;
    let ok = all.iter().filter_map(|g| g.r.as_ref().ok().copied()).collect();
    let err = all.iter().rev().find_map(|g| g.r.as_ref().err().cloned());
    let floor = all
        .iter()
        .filter_map(|g| g.floor.as_ref()?.as_ref().ok().copied())
        .collect();
    let floor_err = all
        .iter()
        .rev()
        .find_map(|g| g.floor.as_ref()?.as_ref().err().cloned());
    Some(PointRuns {
        x,
        n,
        ok,
        err,
        floor,
        floor_err,
    })
}

/// The points (with RSS measured) that grow faster than linearly, flagged
/// by their value (`growth::flags`).
fn point_flags(per_point: &[PointRuns], per_byte: bool, unit: &str) -> Vec<(u64, Option<String>)> {
    let points: Vec<(u64, growth::Point)> = per_point
        .iter()
        .filter_map(|p| {
            let rss = report::Stat::of(&p.ok.iter().map(|t| t.peak_kib as f64).collect::<Vec<_>>())?;
            let point = growth::Point {
                x: p.x as f64,
                ns: ns_per_event(&p.ok),
                rss_kib: rss.median,
            };
            Some((p.x, point))
        })
        .collect();
    let flags = growth::flags(
        &points.iter().map(|(_, p)| *p).collect::<Vec<_>>(),
        per_byte,
        unit,
    );
    points.iter().map(|(x, _)| *x).zip(flags).collect()
}

/// One point's rows: server CPU per delivered event (flagged when it grows
/// faster than linearly), and peak RSS.
fn point_rows(sizes: &Sizes, axis: Axis, p: &PointRuns, flag: Option<String>, table: &mut Table) {
    let (x, n, ok) = (p.x, p.n, &p.ok);
    let scen = match axis {
        Axis::Subscribers => format!(
            "8. Growth, {} of 1 session, /burst {n}",
            plural(x as usize, "subscriber")
        ),
        Axis::Sessions => format!(
            "8. Growth, {}, 1 subscriber each, /burst {n}",
            plural(x as usize, "session")
        ),
        Axis::Size => format!(
            "8. Growth, {x}-byte deltas, {} subscribers, /burst {n} {x}",
            sizes.growth_size_subs
        ),
    };
    let ns: Vec<f64> = ok
        .iter()
        .filter(|t| t.events > 0 && t.cpu.wall >= MIN_CPU_WALL)
        .map(|t| t.cpu.server * 1e9 / t.events as f64)
        .collect();
    let mut r = Row::new(&scen, "SSE", "server CPU per delivered event", &ns, Unit::Nanos);
    r.cpu = median_cpu(&ok.iter().map(|t| t.cpu).collect::<Vec<_>>());
    let eps = report::Stat::of(&ok.iter().map(|t| t.eps).collect::<Vec<_>>());
    let (frames, events) = ok.iter().fold((0, 0), |a, t| (a.0 + t.frames, a.1 + t.events));
    let merged = format!("{:.2} events per frame", events as f64 / frames.max(1) as f64);
    r.note = match eps {
        Some(e) => format!("{} delivered; {merged}", report::fmt_value(e.median, Unit::Rate)),
        None => merged,
    };
    if !ok.is_empty() && ns.is_empty() {
        r.note = format!("too short to measure CPU (under {MIN_CPU_WALL} s); {}", r.note);
    }
    if let Some(flag) = flag {
        r.note = format!("{flag}; {}", r.note);
    }
    table.push_or_fail(r, p.err.clone());
    if !ok.is_empty() {
        table.push(Row::new(
            &scen,
            "SSE",
            "server peak RSS",
            &ok.iter().map(|t| t.peak_kib as f64 / 1024.0).collect::<Vec<_>>(),
            Unit::MiB,
        ));
    }
    if axis == Axis::Size {
        payload_rows(&scen, p, sizes.growth_size_subs, table);
    }
}

/// Issue 34's goal for the largest deltas: delivered payload to 10 readers.
const PAYLOAD_GOAL: f64 = 2e9;
const PAYLOAD_GOAL_FROM: u64 = 64 * 1024;
const PAYLOAD_GOAL_READERS: usize = 10;

/// A size point's delivered payload (deltas x their size, per second), vak's
/// and the floor's (the same burst with no vak, measured right after).
fn payload_rows(scen: &str, p: &PointRuns, readers: usize, table: &mut Table) {
    let bytes = |runs: &[Throughput]| runs.iter().map(|t| t.eps * p.x as f64).collect::<Vec<_>>();
    let (vak, floor) = (bytes(&p.ok), bytes(&p.floor));
    let median = |v: &[f64]| report::Stat::of(v).map(|s| s.median);
    let mut r = Row::new(scen, "SSE", "delivered payload", &vak, Unit::ByteRate);
    // The goal is for 10 readers (bench-quick's 3 are not held to it).
    if let (Some(v), true) = (
        median(&vak),
        p.x >= PAYLOAD_GOAL_FROM && readers == PAYLOAD_GOAL_READERS,
    ) {
        r.goal = Some(Goal::at_least(v, PAYLOAD_GOAL, ">= 2 GB/s"));
    }
    if let (Some(v), Some(f)) = (median(&vak), median(&floor)) {
        r.note = format!("{:.0}% of the floor's", 100.0 * v / f);
    }
    table.push_or_fail(r, p.err.clone());
    let mut f = Row::new(scen, FLOOR_LABEL, "delivered payload", &floor, Unit::ByteRate);
    f.cpu = median_cpu(&p.floor.iter().map(|t| t.cpu).collect::<Vec<_>>());
    f.note = "the same frames, all due at once, written by one thread; its CPU is the bench's".into();
    table.push_or_fail(f, p.floor_err.clone());
}

/// After the rounds, `growth_runs` times: the cluster (or why it cannot run).
pub(super) fn measure_cluster<'a>(plan: &'a Plan, s: &'a mut Samples) -> Measuring<'a> {
    Box::pin(async move {
        let Some(bin) = cluster::nats_server(&plan.env.exe) else {
            let why = match std::env::var_os("VAK_NATS_SERVER") {
                Some(p) => format!(
                    "VAK_NATS_SERVER={} is not a file: cluster rows not measured",
                    PathBuf::from(p).display()
                ),
                None => "nats-server not found (VAK_NATS_SERVER, or target/nats-venv from `make nats`): \
cluster rows not measured"
                    .to_string(),
            };
            log(why.clone());
            s.cluster_missing = Some(why);
            return;
        };
        let sizes = &plan.sizes;
        for run in 1..=sizes.growth_runs {
            let at = Instant::now();
            let r = cluster::run(&plan.env, &bin, sizes.cluster).await;
            let msg = r.as_ref().map(|x| {
                format!(
                    "fan-out {}; paced {}; one subscriber on the owner {}; embedded {}",
                    throughput_msg(&x.fanout),
                    latency_msg(&x.latency),
                    throughput_msg(&x.one),
                    throughput_msg(&x.embedded)
                )
            });
            log_result(format!("run {run} cluster x{}", sizes.cluster.subs), at, msg);
            let (subs, t) = (sizes.cluster.subs, Transport::Sse);
            s.cluster.push(Sample { run, subs, t, r });
        }
    })
}

const CLUSTER_LABEL: &str = "SSE via --bus";

/// The cluster rows: fan-out through 3 replicas (delivered events/s, and
/// p50/p99/max at the paced rate), and one subscriber on the owning replica
/// against the embedded mode.
pub(super) fn cluster_rows(s: &Samples, plan: &Plan, table: &mut Table) {
    let c = plan.sizes.cluster;
    let scen = format!(
        "9. Cluster (3 nats nodes, 3 replicas), 1 session -> {} SSE subscribers over the replicas",
        c.subs
    );
    if let Some(why) = &s.cluster_missing {
        let mut r = Row::new(&scen, CLUSTER_LABEL, "delivered events/s", &[], Unit::Rate);
        r.note = why.clone();
        table.push(r);
        return;
    }
    let (v, err) = ok_values(&s.cluster, Transport::Sse, None);
    if v.is_empty() && err.is_none() {
        return;
    }
    let mut r = Row::new(
        &scen,
        CLUSTER_LABEL,
        "delivered events/s",
        &values(&v, |x| x.fanout.eps),
        Unit::Rate,
    );
    let fan: Vec<_> = v.iter().map(|(_, x)| x.fanout).collect();
    r.cpu = median_cpu(&fan.iter().map(|x| x.cpu).collect::<Vec<_>>());
    r.note = format!("/burst {}; {}", c.burst, throughput_note(&fan));
    table.push_or_fail(r, err);
    if v.is_empty() {
        return;
    }
    paced_rows(&scen, c, &v, table);
    one_rows(c, &v, table);
}

/// p50/p99/max of the paced run across the replicas; p99 held to 10 ms.
fn paced_rows(scen: &str, c: cluster::ClusterSizes, v: &[(usize, cluster::ClusterRun)], table: &mut Table) {
    let paced = format!("{scen}, {} events/s", c.rate);
    for (metric, vals) in [
        ("p50", values(v, |x| x.latency.p50_us)),
        ("p99", values(v, |x| x.latency.p99_us)),
        ("max", values(v, |x| x.latency.max_us)),
    ] {
        let mut r = Row::new(&paced, CLUSTER_LABEL, metric, &vals, Unit::Micros);
        if metric == "p99" {
            if let Some(st) = &r.stat {
                r.goal = Some(Goal::at_most(st.median, P99_BOUND_US, true, "< 10 ms"));
            }
            r.cpu = median_cpu(&v.iter().map(|(_, x)| x.latency.cpu).collect::<Vec<_>>());
            r.note = format!("/pace {} {}, across all 3 replicas", c.pace, c.rate);
        }
        table.push(r);
    }
}

/// One subscriber on the owning replica: its events/s, and its ratio to the embedded server's.
fn one_rows(c: cluster::ClusterSizes, v: &[(usize, cluster::ClusterRun)], table: &mut Table) {
    let one = "9. Cluster, a run to 1 subscriber on the owning replica";
    let mut r = Row::new(
        one,
        CLUSTER_LABEL,
        "delivered events/s",
        &values(v, |x| x.one.eps),
        Unit::Rate,
    );
    r.note = format!(
        "/burst {}; embedded (no --bus) {} in the same run",
        c.one_burst,
        report::Stat::of(&values(v, |x| x.embedded.eps))
            .map_or("?".into(), |e| report::fmt_value(e.median, Unit::Rate))
    );
    table.push(r);
    let mut r = Row::new(
        one,
        CLUSTER_LABEL,
        "throughput vs embedded",
        &values(v, |x| x.one.eps / x.embedded.eps.max(1e-9)),
        Unit::Fraction,
    );
    r.note = "the replica's events/s over the embedded server's, paired within each run".into();
    table.push(r);
}
