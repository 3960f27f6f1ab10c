//! The scenario table: each scenario's `--only` name, how it is measured and
//! which rows of the results table it makes, and the loops that run them.

mod fanout;
mod latency;
mod load;
mod realistic;
mod replay;
mod scale;

use crate::report::{Row, Stat};
use crate::scenarios::{self, Env, Transport};
use crate::sizes::Sizes;
use crate::{cluster, machine, memory};
use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::time::Instant;

use scale::GrowthSample;

/// A measurement under way; it adds what it measured to the samples.
pub(crate) type Measuring<'a> = Pin<Box<dyn Future<Output = ()> + 'a>>;

/// One scenario of the bench.
pub(crate) struct Scenario {
    /// The name `--only` selects it by.
    pub(crate) name: &'static str,
    /// Measured in each round `1..=runs` (every scenario's round 1, then
    /// every scenario's round 2, ...): back-to-back figures of one round pair up.
    pub(crate) each_run: Option<for<'a> fn(&'a Plan, &'a mut Samples, usize) -> Measuring<'a>>,
    /// Measured once, after every round.
    pub(crate) after_runs: Option<for<'a> fn(&'a Plan, &'a mut Samples) -> Measuring<'a>>,
    /// Its rows of the table, from the samples (none when it was not measured).
    pub(crate) rows: fn(&Samples, &Plan, &mut Table),
}

/// Every scenario, in the order of the table's rows; the rounds measure in
/// this order too, then the once-after scenarios in it.
pub(crate) const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "fanout",
        each_run: Some(fanout::measure),
        after_runs: None,
        rows: fanout::rows,
    },
    Scenario {
        name: "latency",
        each_run: Some(latency::measure),
        after_runs: Some(latency::measure_crossing),
        rows: latency::rows,
    },
    Scenario {
        name: "sessions",
        each_run: Some(load::measure_sessions),
        after_runs: None,
        rows: load::sessions_rows,
    },
    Scenario {
        name: "idle",
        each_run: Some(load::measure_idle),
        after_runs: None,
        rows: load::idle_rows,
    },
    Scenario {
        name: "stalled",
        each_run: Some(load::measure_stalled),
        after_runs: None,
        rows: load::stalled_rows,
    },
    Scenario {
        name: "replay",
        each_run: Some(replay::measure),
        after_runs: None,
        rows: replay::rows,
    },
    Scenario {
        name: "search",
        each_run: None,
        after_runs: Some(replay::measure_search),
        rows: replay::search_rows,
    },
    Scenario {
        name: "growth",
        each_run: None,
        after_runs: Some(scale::measure_growth),
        rows: scale::growth_rows,
    },
    Scenario {
        name: "cluster",
        each_run: None,
        after_runs: Some(scale::measure_cluster),
        rows: scale::cluster_rows,
    },
    Scenario {
        name: "memory",
        each_run: None,
        after_runs: Some(measure_memory),
        rows: memory_rows,
    },
    Scenario {
        name: "realistic",
        each_run: Some(realistic::measure),
        after_runs: None,
        rows: realistic::rows,
    },
];

/// What a run of the bench measures, and with what.
pub(crate) struct Plan {
    pub(crate) env: Env,
    pub(crate) sizes: Sizes,
    /// The transports asked for (SSE, gRPC; raw tonic runs with gRPC's fan-out).
    pub(crate) transports: Vec<Transport>,
    /// Those, SSE over TLS and over HTTP/2, and the peer: the idle scenario's.
    pub(crate) idle_transports: Vec<Transport>,
    /// nginx + nchan is measured too (fan-out and idle).
    pub(crate) peer: bool,
    /// `--only`: the scenarios to measure (every one when empty).
    pub(crate) only: Vec<String>,
}

impl Plan {
    fn wants(&self, name: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|o| o == name)
    }
}

/// One measurement: which run, how many subscribers, which transport, what came out.
pub(crate) struct Sample<T> {
    pub(crate) run: usize,
    pub(crate) subs: usize,
    pub(crate) t: Transport,
    pub(crate) r: Result<T, String>,
}

/// Every figure of every run, by scenario.
#[derive(Default)]
pub(crate) struct Samples {
    pub(crate) fanout: Vec<Sample<scenarios::Throughput>>,
    /// Fan-outs that did not finish within the limit once: not run again.
    pub(crate) fanout_late: HashSet<(Transport, usize)>,
    /// The latency curve, by rate (events/s).
    pub(crate) latency: Vec<(u64, Sample<scenarios::Latency>)>,
    /// The latency floor (`floor.rs`) at the curve's rates.
    pub(crate) floor: Vec<(u64, Sample<scenarios::Latency>)>,
    /// Per transport, the rates measured while bisecting where p99 crosses 10 ms.
    pub(crate) crossing: Vec<(Transport, Vec<RatePoint>)>,
    pub(crate) growth: Vec<GrowthSample>,
    pub(crate) cluster: Vec<Sample<cluster::ClusterRun>>,
    /// Why the cluster rows were not measured (no nats-server).
    pub(crate) cluster_missing: Option<String>,
    pub(crate) sessions: Vec<Sample<scenarios::Throughput>>,
    pub(crate) idle: Vec<Sample<scenarios::Idle>>,
    pub(crate) storm: Vec<Sample<crate::storm::Storm>>,
    /// (unstalled, stalled), measured back to back.
    pub(crate) stalled: Vec<Sample<(scenarios::Throughput, scenarios::Throughput)>>,
    /// Fan-out against `vak serve --durability fsync`.
    pub(crate) fanout_fsync: Vec<Sample<scenarios::Throughput>>,
    pub(crate) replay: Vec<Sample<scenarios::Replay>>,
    pub(crate) search: Vec<Sample<scenarios::SearchLatency>>,
    pub(crate) memory: Vec<memory::MemoryRun>,
    /// The realistic-load scenario, by point.
    pub(crate) realistic: Vec<(crate::realistic::LoadSize, Sample<crate::realistic::Load>)>,
    /// The same points with no vak (`floor_load.rs`).
    pub(crate) realistic_floor: Vec<(crate::realistic::LoadSize, Sample<crate::realistic::Load>)>,
    /// Realistic points whose floor cannot run on this machine, and why (not a failure).
    pub(crate) realistic_floor_skipped: Vec<(crate::realistic::LoadSize, String)>,
}

/// A latency point measured at a rate (events/s).
pub(crate) type RatePoint = (u64, Result<scenarios::Latency, String>);

/// The table's rows, and how many of them carry a failed measurement.
#[derive(Default)]
pub(crate) struct Table {
    pub(crate) rows: Vec<Row>,
    pub(crate) failures: usize,
}

impl Table {
    fn push(&mut self, row: Row) {
        self.rows.push(row);
    }

    /// Adds `row`, marked failed with `err` (and counted) when a run failed.
    fn push_or_fail(&mut self, mut row: Row, err: Option<String>) {
        if let Some(e) = err {
            self.failures += 1;
            row.failure = Some(e);
        }
        self.rows.push(row);
    }
}

/// Measures every scenario `plan` wants: the rounds, then the once-after ones.
pub(crate) async fn measure(plan: &Plan) -> Samples {
    let mut s = Samples::default();
    let chosen: Vec<&Scenario> = SCENARIOS.iter().filter(|x| plan.wants(x.name)).collect();
    for run in 1..=plan.sizes.runs {
        for each_run in chosen.iter().filter_map(|x| x.each_run) {
            each_run(plan, &mut s, run).await;
        }
    }
    for after_runs in chosen.iter().filter_map(|x| x.after_runs) {
        after_runs(plan, &mut s).await;
    }
    s
}

/// The table's rows from every run's figures, scenario by scenario.
pub(crate) fn rows(s: &Samples, plan: &Plan) -> Table {
    let mut table = Table::default();
    for scenario in SCENARIOS {
        (scenario.rows)(s, plan, &mut table);
    }
    table
}

fn measure_memory<'a>(plan: &'a Plan, s: &'a mut Samples) -> Measuring<'a> {
    Box::pin(async move {
        if !plan.transports.contains(&Transport::Sse) {
            return;
        }
        for run in 1..=plan.sizes.memory_runs {
            let at = Instant::now();
            s.memory.push(memory::run(&plan.env, &plan.sizes.memory).await);
            log(format!(
                "run {run}/{} memory done in {:.1} s",
                plan.sizes.memory_runs,
                at.elapsed().as_secs_f64()
            ));
        }
    })
}

fn memory_rows(s: &Samples, plan: &Plan, table: &mut Table) {
    memory::rows(
        &s.memory,
        &plan.sizes.memory,
        &mut table.rows,
        &mut table.failures,
    );
}

pub(crate) fn log(msg: String) {
    eprintln!("vak-bench: {msg}");
}

fn log_result(what: String, at: Instant, r: Result<String, &String>) {
    match r {
        Ok(m) => log(format!("{what}: {m} [{:.1} s]", at.elapsed().as_secs_f64())),
        Err(e) => log(format!("{what}: FAILED: {e}")),
    }
}

fn cpu_note(c: &machine::CpuUse) -> String {
    let w = c.wall.max(1e-9);
    format!(
        "CPU: server {:.2} cores, bench {:.2}, others {:.2}",
        c.server / w,
        c.bench / w,
        c.others / w
    )
}

/// A throughput run, as logged.
fn throughput_msg(x: &scenarios::Throughput) -> String {
    format!(
        "{:.0} events/s, last at {:.1} ms, {} frames for {} events, peak RSS {} KiB, {}",
        x.eps,
        x.last_s * 1e3,
        x.frames,
        x.events,
        x.peak_kib,
        cpu_note(&x.cpu)
    )
}

/// A latency run, as logged.
fn latency_msg(x: &scenarios::Latency) -> String {
    format!(
        "p50 {:.2} ms p99 {:.2} ms max {:.2} ms ({} samples, {:.0} delivered/s), {}",
        x.p50_us / 1e3,
        x.p99_us / 1e3,
        x.max_us / 1e3,
        x.samples,
        x.eps,
        cpu_note(&x.cpu)
    )
}

/// The successful figures of `t` (and the last error, if any run failed).
fn ok_values<T: Copy>(
    items: &[Sample<T>],
    t: Transport,
    subs: Option<usize>,
) -> (Vec<(usize, T)>, Option<String>) {
    let mut v = Vec::new();
    let mut err = None;
    for x in items
        .iter()
        .filter(|x| x.t == t && subs.is_none_or(|n| n == x.subs))
    {
        match &x.r {
            Ok(val) => v.push((x.run, *val)),
            Err(e) => err = Some(e.clone()),
        }
    }
    (v, err)
}

/// CPU time comes from /proc in clock ticks (10 ms): shorter intervals say nothing.
const MIN_CPU_WALL: f64 = 0.25;

/// The transport column of every floor row (no vak: `floor.rs`, `floor_load.rs`).
const FLOOR_LABEL: &str = "SSE floor: one plain thread writes the sockets, no vak";

fn median_cpu(c: &[machine::CpuUse]) -> Option<(f64, f64, f64)> {
    let m = |f: fn(&machine::CpuUse) -> f64| {
        Stat::of(
            &c.iter()
                .filter(|c| c.wall >= MIN_CPU_WALL)
                .map(|c| f(c) / c.wall)
                .collect::<Vec<_>>(),
        )
        .map(|s| s.median)
    };
    Some((m(|c| c.server)?, m(|c| c.bench)?, m(|c| c.others)?))
}

/// Server CPU per delivered event, the median over runs, in nanoseconds:
/// less sensitive to other load than events/s.
fn ns_per_event(v: &[scenarios::Throughput]) -> Option<f64> {
    Stat::of(
        &v.iter()
            .filter(|x| x.events > 0 && x.cpu.wall >= MIN_CPU_WALL)
            .map(|x| x.cpu.server * 1e9 / x.events as f64)
            .collect::<Vec<_>>(),
    )
    .map(|s| s.median)
}

fn throughput_note(v: &[scenarios::Throughput]) -> String {
    let (frames, events) = v
        .iter()
        .fold((0u64, 0u64), |a, x| (a.0 + x.frames, a.1 + x.events));
    if events == 0 {
        return String::new();
    }
    let merged = format!("{:.2} events per frame", events as f64 / frames.max(1) as f64);
    match ns_per_event(v) {
        Some(ns) => format!("{merged}; server CPU {ns:.0} ns per event"),
        None => merged,
    }
}

fn values<T>(v: &[(usize, T)], f: impl Fn(&T) -> f64) -> Vec<f64> {
    v.iter().map(|(_, x)| f(x)).collect()
}

/// `1 subscriber`, `100 subscribers`.
fn plural(n: usize, word: &str) -> String {
    format!("{n} {word}{}", if n == 1 { "" } else { "s" })
}

/// The median share of the cores other processes used during the measurements.
pub(crate) fn others_cores(s: &Samples) -> Option<f64> {
    let mut all = Vec::new();
    let mut add = |c: &machine::CpuUse| {
        if c.wall >= MIN_CPU_WALL {
            all.push(c.others / c.wall);
        }
    };
    s.fanout
        .iter()
        .chain(&s.sessions)
        .chain(&s.fanout_fsync)
        .filter_map(|x| x.r.as_ref().ok())
        .for_each(|x| add(&x.cpu));
    s.latency
        .iter()
        .filter_map(|(_, x)| x.r.as_ref().ok())
        .for_each(|x| add(&x.cpu));
    s.growth
        .iter()
        .filter_map(|x| x.r.as_ref().ok())
        .for_each(|x| add(&x.cpu));
    s.stalled
        .iter()
        .filter_map(|x| x.r.as_ref().ok())
        .for_each(|(b, x)| {
            add(&b.cpu);
            add(&x.cpu)
        });
    s.replay
        .iter()
        .filter_map(|x| x.r.as_ref().ok())
        .for_each(|x| add(&x.cpu));
    s.realistic
        .iter()
        .filter_map(|(_, x)| x.r.as_ref().ok())
        .for_each(|x| add(&x.cpu));
    Stat::of(&all).map(|st| st.median)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenarios::{SearchLatency, Throughput};
    use clap::CommandFactory;
    use std::time::Duration;

    fn plan() -> Plan {
        Plan {
            env: Env {
                vak: "vak".into(),
                exe: "vak-bench".into(),
                per_conn: 100,
                capacity: 1 << 17,
                limit: Duration::from_secs(30),
                serve_args: Vec::new(),
                serve_env: Vec::new(),
            },
            sizes: Sizes::quick(),
            transports: vec![Transport::Sse, Transport::Grpc],
            idle_transports: vec![Transport::Sse, Transport::Grpc],
            peer: false,
            only: Vec::new(),
        }
    }

    #[test]
    fn every_scenario_has_one_entry_and_the_only_flag_names_them_in_order() {
        let names: Vec<&str> = SCENARIOS.iter().map(|s| s.name).collect();
        let cmd = crate::Args::command();
        let only = cmd
            .get_arguments()
            .find(|a| a.get_id() == "only")
            .expect("--only");
        let help = only.get_help().expect("its help").to_string();
        let listed = help
            .split_once(": ")
            .expect("a list")
            .1
            .split_once(" (")
            .expect("its end")
            .0;
        assert_eq!(listed.split(", ").collect::<Vec<_>>(), names);
        for s in SCENARIOS {
            assert!(
                s.each_run.is_some() || s.after_runs.is_some(),
                "{} is never measured",
                s.name
            );
        }
    }

    #[test]
    fn only_selects_by_name_and_none_selects_all() {
        let mut p = plan();
        assert!(SCENARIOS.iter().all(|s| p.wants(s.name)));
        p.only = vec!["idle".into(), "search".into()];
        let chosen: Vec<&str> = SCENARIOS
            .iter()
            .filter(|s| p.wants(s.name))
            .map(|s| s.name)
            .collect();
        assert_eq!(chosen, ["idle", "search"]);
    }

    #[test]
    fn nothing_measured_makes_no_rows() {
        let t = rows(&Samples::default(), &plan());
        assert!(t.rows.is_empty());
        assert_eq!(t.failures, 0);
    }

    #[test]
    fn rows_come_in_the_table_order_and_failures_are_counted() {
        let mut p = plan();
        // With gRPC asked for, its and raw tonic's fan-out rows would say "not measured".
        p.transports = vec![Transport::Sse];
        let mut s = Samples::default();
        let ok = Ok(Throughput {
            eps: 1e6,
            last_s: 0.1,
            frames: 10,
            events: 100,
            ..Throughput::default()
        });
        s.fanout.push(Sample {
            run: 1,
            subs: 1,
            t: Transport::Sse,
            r: ok,
        });
        s.search.push(Sample {
            run: 1,
            subs: 20,
            t: Transport::Grpc,
            r: Ok(SearchLatency::default()),
        });
        s.growth.push(GrowthSample {
            axis: scale::Axis::Subscribers,
            x: 1,
            n: 5000,
            r: Err("gone".into()),
            floor: None,
        });
        s.cluster_missing = Some("no nats-server".into());
        let t = rows(&s, &p);
        let numbers: Vec<&str> = t
            .rows
            .iter()
            .map(|r| r.scenario.split_once('.').unwrap().0)
            .collect();
        assert_eq!(numbers, ["1", "1", "7", "7", "8", "9"]);
        let metrics: Vec<&str> = t.rows.iter().map(|r| r.metric.as_str()).collect();
        assert_eq!(
            metrics,
            [
                "delivered events/s",
                "last subscriber has all",
                "p50",
                "p99",
                "server CPU per delivered event",
                "delivered events/s"
            ]
        );
        assert_eq!(t.failures, 1, "the growth point's failure");
        assert_eq!(t.rows[4].failure.as_deref(), Some("gone"));
        assert_eq!(t.rows[5].note, "no nats-server");
    }
}
