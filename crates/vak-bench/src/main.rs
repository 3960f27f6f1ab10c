//! `vak-bench`: fan-out (also with `--durability fsync`), a latency curve,
//! many-session, idle-cost, stalled-client, replay-from-disk, growth and
//! cluster benchmarks of a release `vak serve` over SSE and gRPC, against a
//! raw tonic baseline, with this process's own async clients. `make bench` runs it and
//! writes BENCHMARKS.md; `make bench-quick` runs the same code at small sizes.

mod baseline;
mod clients;
mod cluster;
mod floor;
mod growth;
mod machine;
mod memory;
mod peer;
mod report;
mod scenarios;

use clap::{Parser, Subcommand};
use report::{Goal, Row, Unit};
use scenarios::{Env, ServeOpts, Transport};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
#[command(
    name = "vak-bench",
    about = "Benchmarks a release `vak serve`: fan-out, latency curve, many sessions, idle cost, stalled client, replay from disk, search, growth, cluster, vs raw tonic"
)]
struct Args {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    /// Small sizes and one run (< 1 minute); writes nothing unless --out is given.
    #[arg(long)]
    quick: bool,
    /// Runs per figure (the median and min–max are reported).
    #[arg(long)]
    runs: Option<usize>,
    /// The vak binary to benchmark (default: `vak` next to this binary).
    #[arg(long)]
    vak: Option<PathBuf>,
    /// Where to write the report (default BENCHMARKS.md, none with --quick).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Print the table only.
    #[arg(long)]
    no_write: bool,
    /// Only these scenarios: fanout, latency, sessions, idle, stalled, replay, search, growth, cluster, memory (comma-separated).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// gRPC streams per HTTP/2 connection.
    #[arg(long, default_value_t = 100)]
    per_conn: usize,
    /// Fan-out subscriber counts (comma-separated).
    #[arg(long, value_delimiter = ',')]
    subs: Vec<usize>,
    /// Deltas per fan-out burst.
    #[arg(long)]
    burst: Option<u64>,
    /// Fan-out subscriber counts also measured against `vak serve --durability fsync`
    /// (comma-separated; 0 for none).
    #[arg(long, value_delimiter = ',')]
    fsync_subs: Vec<usize>,
    /// Sessions in the many-sessions scenario, and deltas each bursts.
    #[arg(long)]
    sessions: Option<usize>,
    #[arg(long)]
    session_burst: Option<u64>,
    /// Idle streams per transport.
    #[arg(long)]
    idle: Option<usize>,
    /// Subscribers of the latency curve, its rates (events/s, comma-separated)
    /// and how many seconds each rate is paced for.
    #[arg(long)]
    latency_subs: Option<usize>,
    #[arg(long, value_delimiter = ',')]
    latency_rates: Vec<u64>,
    #[arg(long)]
    latency_secs: Option<f64>,
    /// Runs of the growth and cluster scenarios (default 1).
    #[arg(long)]
    growth_runs: Option<usize>,
    /// Subscribers of the cluster fan-out, spread over its 3 replicas.
    #[arg(long)]
    cluster_subs: Option<usize>,
    /// Deltas in the stalled-client runs (default: the fan-out burst).
    #[arg(long)]
    stall_burst: Option<u64>,
    /// Sessions in the replay-from-disk scenario, and the history each gets
    /// (and is replayed from that many events back), for every transport.
    #[arg(long)]
    replay_sessions: Option<usize>,
    #[arg(long)]
    replay_history: Option<u64>,
    /// Runs of the replay scenario (default: --runs).
    #[arg(long)]
    replay_runs: Option<usize>,
    /// Sessions written before the search scenario searches the first one's word, and its queries.
    #[arg(long)]
    search_sessions: Option<usize>,
    #[arg(long)]
    search_queries: Option<usize>,
    /// An extra `vak serve` flag for every vak server (repeatable; for
    /// diagnosis, e.g. `--serve-arg=--max-queued-mib=4096`).
    #[arg(long, allow_hyphen_values = true)]
    serve_arg: Vec<String>,
    /// An extra environment variable of every vak server, KEY=VALUE (repeatable;
    /// e.g. `--serve-env LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2` to
    /// compare allocators).
    #[arg(long)]
    serve_env: Vec<String>,
    /// Runs of the memory scenario (default 1).
    #[arg(long)]
    memory_runs: Option<usize>,
    /// A peer server measured in the same run on the fan-out and idle
    /// scenarios, with the same SSE client: `nchan` (nginx + nchan, `make
    /// bench-peer` installs it). The report goes to its own block of the file.
    #[arg(long)]
    peer: Option<String>,
    /// Transports to run (sse, grpc; raw tonic runs whenever grpc fan-out does;
    /// sse-tls and sse-h2, idle only, run with sse or by name).
    #[arg(long, value_delimiter = ',')]
    transports: Vec<String>,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// The raw tonic baseline server (the bench starts it itself).
    #[command(hide = true)]
    BaselineServer {
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: SocketAddr,
        #[arg(long, default_value_t = 1 << 17)]
        capacity: usize,
    },
}

/// Every size the scenarios use.
#[derive(Clone, Debug)]
struct Sizes {
    runs: usize,
    fanout_subs: Vec<usize>,
    burst: u64,
    latency_subs: usize,
    /// The curve's rates, events/s; each paced for `latency_secs`.
    latency_rates: Vec<u64>,
    latency_secs: f64,
    /// Bisection steps between the curve's rates where p99 crosses 10 ms.
    cross_steps: usize,
    /// The growth table: subscribers of one session, sessions of one
    /// subscriber each, and delta sizes (to `growth_size_subs` subscribers).
    growth_subs: Vec<usize>,
    growth_sessions: Vec<usize>,
    growth_sizes: Vec<u64>,
    growth_size_subs: usize,
    /// Deliveries each growth point aims at (subscribers x deltas), the
    /// fewest deltas a point sends, and the bytes a size point delivers.
    growth_deliveries: u64,
    growth_min_events: u64,
    growth_size_bytes: u64,
    growth_runs: usize,
    cluster: cluster::ClusterSizes,
    sessions: usize,
    session_burst: u64,
    idle: usize,
    stalled_subs: usize,
    stall_burst: u64,
    fsync_subs: Vec<usize>,
    /// The replay scenario's (transport, sessions, history) runs.
    replay: Vec<(Transport, usize, u64)>,
    replay_runs: usize,
    search_sessions: usize,
    search_queries: usize,
    /// The memory scenario (memory.rs) and its runs.
    memory: memory::MemorySizes,
    memory_runs: usize,
}

impl Sizes {
    fn full() -> Sizes {
        Sizes {
            runs: 3,
            fanout_subs: vec![1, 100, 1000],
            burst: 100_000,
            latency_subs: 1000,
            latency_rates: vec![1000, 3000, 10_000],
            latency_secs: 2.0,
            cross_steps: 3,
            growth_subs: vec![1, 10, 100, 1000, 10_000],
            growth_sessions: vec![1, 100, 1000, 10_000],
            growth_sizes: vec![16, 1024, 64 * 1024],
            growth_size_subs: 10,
            growth_deliveries: 2_000_000,
            growth_min_events: 100,
            growth_size_bytes: 256 << 20,
            growth_runs: 1,
            cluster: cluster::ClusterSizes {
                subs: 1000,
                burst: 5000,
                pace: 2000,
                rate: 1000,
                one_burst: 100_000,
            },
            sessions: 1000,
            session_burst: 2_000,
            idle: 10_000,
            stalled_subs: 100,
            stall_burst: 100_000,
            fsync_subs: vec![1],
            replay: vec![(Transport::Sse, 100, 100_000), (Transport::Grpc, 100, 100_000)],
            replay_runs: 1,
            search_sessions: 1000,
            search_queries: 200,
            memory: memory::MemorySizes::full(),
            memory_runs: 1,
        }
    }

    fn quick() -> Sizes {
        Sizes {
            runs: 1,
            fanout_subs: vec![1, 10, 50],
            burst: 10_000,
            latency_subs: 50,
            latency_rates: vec![1000, 3000, 10_000],
            latency_secs: 0.05,
            cross_steps: 1,
            growth_subs: vec![1, 10, 30],
            growth_sessions: vec![1, 10, 20],
            growth_sizes: vec![16, 1024, 64 * 1024],
            growth_size_subs: 3,
            growth_deliveries: 5_000,
            growth_min_events: 20,
            growth_size_bytes: 1 << 20,
            growth_runs: 1,
            cluster: cluster::ClusterSizes {
                subs: 9,
                burst: 300,
                pace: 100,
                rate: 1000,
                one_burst: 2000,
            },
            sessions: 50,
            session_burst: 2_000,
            idle: 200,
            stalled_subs: 10,
            stall_burst: 10_000,
            fsync_subs: vec![1],
            replay: vec![(Transport::Sse, 5, 10_000), (Transport::Grpc, 1, 3_000)],
            replay_runs: 1,
            search_sessions: 20,
            search_queries: 20,
            memory: memory::MemorySizes::quick(),
            memory_runs: 1,
        }
    }
}

/// One measurement: which run, how many subscribers, which transport, what came out.
struct Sample<T> {
    run: usize,
    subs: usize,
    t: Transport,
    r: Result<T, String>,
}

/// Every figure of every run, by scenario.
#[derive(Default)]
struct Samples {
    fanout: Vec<Sample<scenarios::Throughput>>,
    /// The latency curve, by rate (events/s).
    latency: Vec<(u64, Sample<scenarios::Latency>)>,
    /// The latency floor (`floor.rs`) at the curve's rates.
    floor: Vec<(u64, Sample<scenarios::Latency>)>,
    /// Per transport, the rates measured while bisecting where p99 crosses 10 ms.
    crossing: Vec<(Transport, Vec<RatePoint>)>,
    growth: Vec<GrowthSample>,
    cluster: Vec<Sample<cluster::ClusterRun>>,
    /// Why the cluster rows were not measured (no nats-server).
    cluster_missing: Option<String>,
    sessions: Vec<Sample<scenarios::Throughput>>,
    idle: Vec<Sample<scenarios::Idle>>,
    /// (unstalled, stalled), measured back to back.
    stalled: Vec<Sample<(scenarios::Throughput, scenarios::Throughput)>>,
    /// Fan-out against `vak serve --durability fsync`.
    fanout_fsync: Vec<Sample<scenarios::Throughput>>,
    replay: Vec<Sample<scenarios::Replay>>,
    search: Vec<Sample<scenarios::SearchLatency>>,
    memory: Vec<memory::MemoryRun>,
}

/// A latency point measured at a rate (events/s).
type RatePoint = (u64, Result<scenarios::Latency, String>);

/// The growth table's axes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Axis {
    /// One session, x subscribers.
    Subscribers,
    /// x sessions, one subscriber each.
    Sessions,
    /// Deltas of x bytes, to `growth_size_subs` subscribers.
    Size,
}

/// One point of the growth table: its axis value, the deltas each stream got, what came out.
struct GrowthSample {
    axis: Axis,
    x: u64,
    n: u64,
    r: Result<scenarios::Throughput, String>,
}

/// The p99 bound of the latency goal and of the crossing search, in µs.
const P99_BOUND_US: f64 = 10_000.0;

fn log(msg: String) {
    eprintln!("vak-bench: {msg}");
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

fn main() {
    let args = Args::parse();
    if let Some(Cmd::BaselineServer { listen, capacity }) = args.cmd {
        if let Err(e) = baseline::serve(listen, capacity) {
            eprintln!("baseline: error: {e}");
            std::process::exit(1);
        }
        return;
    }
    let (before, after) = machine::raise_nofile();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let code = runtime.block_on(bench(args, before, after));
    std::process::exit(code);
}

async fn bench(args: Args, nofile_before: (u64, u64), nofile_after: u64) -> i32 {
    let started = Instant::now();
    let mut sizes = if args.quick { Sizes::quick() } else { Sizes::full() };
    if let Some(r) = args.runs {
        sizes.runs = r.max(1);
    }
    if !args.subs.is_empty() {
        sizes.fanout_subs = args.subs.clone();
    }
    sizes.burst = args.burst.unwrap_or(sizes.burst);
    sizes.stall_burst = args.stall_burst.or(args.burst).unwrap_or(sizes.stall_burst);
    sizes.sessions = args.sessions.unwrap_or(sizes.sessions);
    sizes.session_burst = args.session_burst.unwrap_or(sizes.session_burst);
    sizes.idle = args.idle.unwrap_or(sizes.idle);
    sizes.latency_subs = args.latency_subs.unwrap_or(sizes.latency_subs);
    if !args.latency_rates.is_empty() {
        sizes.latency_rates = args.latency_rates.iter().copied().filter(|&r| r > 0).collect();
    }
    sizes.latency_secs = args.latency_secs.unwrap_or(sizes.latency_secs).max(0.01);
    sizes.growth_runs = args.growth_runs.unwrap_or(sizes.growth_runs).max(1);
    sizes.cluster.subs = args.cluster_subs.unwrap_or(sizes.cluster.subs).max(1);
    if !args.fsync_subs.is_empty() {
        sizes.fsync_subs = args.fsync_subs.iter().copied().filter(|&n| n > 0).collect();
    }
    for (_, sessions, history) in &mut sizes.replay {
        *sessions = args.replay_sessions.unwrap_or(*sessions);
        *history = args.replay_history.unwrap_or(*history);
    }
    sizes.replay_runs = args.replay_runs.or(args.runs).unwrap_or(sizes.replay_runs).max(1);
    sizes.search_sessions = args.search_sessions.unwrap_or(sizes.search_sessions).max(1);
    sizes.search_queries = args.search_queries.unwrap_or(sizes.search_queries).max(1);
    sizes.memory_runs = args.memory_runs.unwrap_or(sizes.memory_runs).max(1);

    let exe = std::env::current_exe().expect("the bench's own path");
    let vak = args.vak.clone().unwrap_or_else(|| scenarios::default_vak(&exe));
    if !vak.is_file() {
        log(format!(
            "no vak binary at {} (build it: cargo build --release --bins)",
            vak.display()
        ));
        return 2;
    }
    let env = Env {
        vak,
        exe,
        per_conn: args.per_conn.max(1),
        capacity: (sizes.burst as usize + 64).next_power_of_two(),
        limit: Duration::from_secs(if args.quick { 30 } else { 120 }),
        serve_args: args.serve_arg.clone(),
        serve_env: args
            .serve_env
            .iter()
            .filter_map(|kv| kv.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())))
            .collect(),
    };
    let machine = machine::Machine::probe(nofile_before, nofile_after);
    log(format!("machine: {machine}"));
    log(format!("sizes: {sizes:?}"));
    let want = |s: &str| args.only.is_empty() || args.only.iter().any(|o| o == s);
    let transports: Vec<Transport> = [Transport::Sse, Transport::Grpc]
        .into_iter()
        .filter(|t| {
            args.transports.is_empty()
                || args
                    .transports
                    .iter()
                    .any(|a| a.eq_ignore_ascii_case(t.label()) || (a == "grpc" && *t == Transport::Grpc))
        })
        .collect();
    sizes.replay.retain(|(t, _, _)| transports.contains(t));
    let peer = match args.peer.as_deref() {
        None => false,
        Some("nchan") if peer::installed() => true,
        Some("nchan") => {
            log(format!(
                "--peer nchan: nginx or {} is missing (make bench-peer installs them)",
                peer::MODULE
            ));
            return 2;
        }
        Some(other) => {
            log(format!("--peer {other}: the only peer is nchan"));
            return 2;
        }
    };
    // SSE over TLS and over HTTP/2 are measured idle only (with sse, or by name).
    let idle_transports: Vec<Transport> = transports
        .iter()
        .copied()
        .chain(
            [(Transport::SseTls, "sse-tls"), (Transport::SseH2, "sse-h2")]
                .into_iter()
                .filter(|(_, name)| {
                    args.transports.is_empty() || args.transports.iter().any(|a| a == name || a == "sse")
                })
                .map(|(t, _)| t),
        )
        .chain(peer.then_some(Transport::Nchan))
        .collect();

    let mut s = Samples::default();
    let mut late = std::collections::HashSet::new();
    let tp = |x: &scenarios::Throughput| {
        format!(
            "{:.0} events/s, last at {:.1} ms, {} frames for {} events, peak RSS {} KiB, {}",
            x.eps,
            x.last_s * 1e3,
            x.frames,
            x.events,
            x.peak_kib,
            cpu_note(&x.cpu)
        )
    };
    for run in 1..=sizes.runs {
        let tag = format!("run {run}/{}", sizes.runs);
        if want("fanout") {
            for &subs in &sizes.fanout_subs {
                let mut order = transports.clone();
                if transports.contains(&Transport::Grpc) {
                    order.push(Transport::Tonic);
                }
                if peer {
                    order.push(Transport::Nchan);
                }
                for t in order {
                    if late.contains(&(t, subs)) {
                        // A run that did not finish within the limit once takes
                        // the whole limit again: its figure is that failure.
                        log(format!(
                            "{tag} fan-out {} x{subs}: skipped (an earlier run did not finish)",
                            t.label()
                        ));
                        continue;
                    }
                    let at = Instant::now();
                    let r = scenarios::fanout(&env, t, subs, sizes.burst, false, ServeOpts::default()).await;
                    if r.as_ref().is_err_and(|e| e.starts_with(scenarios::NOT_FINISHED)) {
                        late.insert((t, subs));
                    }
                    log_result(
                        format!("{tag} fan-out {} x{subs}", t.label()),
                        at,
                        r.as_ref().map(tp),
                    );
                    s.fanout.push(Sample { run, subs, t, r });
                }
                if sizes.fsync_subs.contains(&subs) {
                    for &t in &transports {
                        let at = Instant::now();
                        let r = scenarios::fanout(&env, t, subs, sizes.burst, false, ServeOpts::FSYNC).await;
                        log_result(
                            format!("{tag} fan-out {} x{subs} --durability fsync", t.label()),
                            at,
                            r.as_ref().map(tp),
                        );
                        s.fanout_fsync.push(Sample { run, subs, t, r });
                    }
                }
            }
        }
        if want("latency") {
            for &t in &transports {
                for &rate in &sizes.latency_rates {
                    let at = Instant::now();
                    let subs = sizes.latency_subs;
                    let r = measure_latency(&env, t, subs, rate, sizes.latency_secs).await;
                    log_result(
                        format!("{tag} latency {} x{subs} at {rate}/s", t.label()),
                        at,
                        r.as_ref().map(latency_msg),
                    );
                    s.latency.push((rate, Sample { run, subs, t, r }));
                }
            }
            if transports.contains(&Transport::Sse) {
                for rate in floor_rates(&sizes) {
                    let at = Instant::now();
                    let subs = sizes.latency_subs;
                    let n = ((rate as f64 * sizes.latency_secs) as u64).max(10);
                    let r = scenarios::floor_latency(&env, subs, n, rate).await;
                    log_result(
                        format!("{tag} latency floor x{subs} at {rate}/s"),
                        at,
                        r.as_ref().map(latency_msg),
                    );
                    s.floor.push((
                        rate,
                        Sample {
                            run,
                            subs,
                            t: Transport::Sse,
                            r,
                        },
                    ));
                }
            }
        }
        if want("sessions") {
            for &t in &transports {
                let at = Instant::now();
                let subs = sizes.sessions;
                let r = scenarios::many_sessions(&env, t, subs, sizes.session_burst).await;
                log_result(
                    format!("{tag} sessions {} x{subs}", t.label()),
                    at,
                    r.as_ref().map(tp),
                );
                s.sessions.push(Sample { run, subs, t, r });
            }
        }
        if want("idle") {
            for &t in &idle_transports {
                let at = Instant::now();
                let subs = sizes.idle;
                let r = scenarios::idle(&env, t, subs).await;
                let msg = r.as_ref().map(|x| {
                    format!(
                        "{:.2} KiB per stream (VmRSS {} -> {} KiB, {} connections, server RLIMIT_NOFILE {})",
                        x.kib_per_stream, x.before_kib, x.after_kib, x.connections, x.server_nofile
                    )
                });
                log_result(format!("{tag} idle {} x{subs}", t.label()), at, msg);
                s.idle.push(Sample { run, subs, t, r });
            }
        }
        if want("stalled") {
            for &t in &transports {
                let at = Instant::now();
                let subs = sizes.stalled_subs;
                let n = sizes.stall_burst;
                let r = match scenarios::fanout(&env, t, subs, n, false, ServeOpts::default()).await {
                    Ok(base) => scenarios::fanout(&env, t, subs, n, true, ServeOpts::default())
                        .await
                        .map(|st| (base, st)),
                    Err(e) => Err(e),
                };
                let msg = r.as_ref().map(|(b, x)| {
                    format!(
                        "unstalled: {}; with one stalled, the {} readers: {}",
                        tp(b),
                        subs - 1,
                        tp(x)
                    )
                });
                log_result(format!("{tag} stalled {} x{subs}", t.label()), at, msg);
                s.stalled.push(Sample { run, subs, t, r });
            }
        }
        if want("replay") && run <= sizes.replay_runs {
            for &(t, subs, history) in &sizes.replay {
                let at = Instant::now();
                let r = scenarios::replay(&env, t, subs, history).await;
                let msg = r.as_ref().map(|x| {
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
                });
                log_result(format!("{tag} replay {} x{subs} x{history}", t.label()), at, msg);
                s.replay.push(Sample { run, subs, t, r });
            }
        }
    }

    if want("latency") {
        for &t in &transports {
            let points = find_crossing(&env, t, &sizes, &s.latency).await;
            s.crossing.push((t, points));
        }
    }
    if want("growth") {
        growth_runs(&env, &sizes, &mut s.growth).await;
    }
    if want("cluster") {
        match cluster::nats_server(&env.exe) {
            None => {
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
            }
            Some(bin) => {
                for run in 1..=sizes.growth_runs {
                    let at = Instant::now();
                    let r = cluster::run(&env, &bin, sizes.cluster).await;
                    let msg = r.as_ref().map(|x| {
                        format!(
                            "fan-out {}; paced {}; one subscriber on the owner {}; embedded {}",
                            tp(&x.fanout),
                            latency_msg(&x.latency),
                            tp(&x.one),
                            tp(&x.embedded)
                        )
                    });
                    log_result(format!("run {run} cluster x{}", sizes.cluster.subs), at, msg);
                    s.cluster.push(Sample {
                        run,
                        subs: sizes.cluster.subs,
                        t: Transport::Sse,
                        r,
                    });
                }
            }
        }
    }

    if want("search") {
        for run in 1..=sizes.runs {
            let at = Instant::now();
            let (n, q) = (sizes.search_sessions, sizes.search_queries);
            let r = scenarios::search(&env, n, q).await;
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
            s.search.push(Sample {
                run,
                subs: n,
                t: Transport::Grpc,
                r,
            });
        }
    }

    if want("memory") && transports.contains(&Transport::Sse) {
        for run in 1..=sizes.memory_runs {
            let at = Instant::now();
            s.memory.push(memory::run(&env, &sizes.memory).await);
            log(format!(
                "run {run}/{} memory done in {:.1} s",
                sizes.memory_runs,
                at.elapsed().as_secs_f64()
            ));
        }
    }

    let (rows, failures) = rows(&s, &sizes, &transports);
    let table = report::table(&rows);
    println!("\n{table}");
    println!("{}", report::goals(&rows));
    let wall = started.elapsed().as_secs_f64();
    log(format!("done in {wall:.0} s"));

    let out = match (&args.out, args.quick, args.no_write) {
        (_, _, true) => None,
        (Some(p), _, _) => Some(p.clone()),
        (None, false, _) => Some(PathBuf::from("BENCHMARKS.md")),
        (None, true, _) => None,
    };
    if let Some(path) = out {
        let command = std::env::var("VAK_BENCH_COMMAND").unwrap_or_else(|_| {
            std::env::args()
                .map(|a| if a.contains(' ') { format!("'{a}'") } else { a })
                .collect::<Vec<_>>()
                .join(" ")
        });
        let method = method(&sizes, &env);
        let ctx = report::Context {
            machine: &machine,
            command: &command,
            revision: revision(),
            method: &method,
            wall_s: wall,
            load_at_end: machine::load_average(),
            others_cores: others_cores(&s),
        };
        match report::write_markdown(&path, &report::section(&ctx, &rows), peer) {
            Ok(()) => log(format!("wrote {}", path.display())),
            Err(e) => {
                log(format!("cannot write {}: {e}", path.display()));
                return 1;
            }
        }
    }
    if failures > 0 {
        log(format!("{failures} measurements failed"));
        return 1;
    }
    0
}

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

fn log_result(what: String, at: Instant, r: Result<String, &String>) {
    match r {
        Ok(m) => log(format!("{what}: {m} [{:.1} s]", at.elapsed().as_secs_f64())),
        Err(e) => log(format!("{what}: FAILED: {e}")),
    }
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

/// Deltas each stream of a growth point gets: about `growth_deliveries`
/// deliveries in all (half as many for sessions, which deliver slower), at
/// least `growth_min_events`; a size point's bytes are bounded too.
fn growth_events(sizes: &Sizes, axis: Axis, x: u64) -> u64 {
    let min = sizes.growth_min_events;
    let subs = sizes.growth_size_subs.max(1) as u64;
    match axis {
        Axis::Subscribers => (sizes.growth_deliveries / x.max(1)).max(min),
        Axis::Sessions => (sizes.growth_deliveries / 2 / x.max(1)).max(min),
        Axis::Size => (sizes.growth_size_bytes / (x.max(1) * subs))
            .min(sizes.growth_deliveries / subs)
            .max(min),
    }
}

/// Every point of the growth table, `growth_runs` times, over SSE.
async fn growth_runs(env: &Env, sizes: &Sizes, out: &mut Vec<GrowthSample>) {
    for run in 1..=sizes.growth_runs {
        let points = sizes
            .growth_subs
            .iter()
            .map(|&x| (Axis::Subscribers, x as u64))
            .chain(sizes.growth_sessions.iter().map(|&x| (Axis::Sessions, x as u64)))
            .chain(sizes.growth_sizes.iter().map(|&x| (Axis::Size, x)));
        for (axis, x) in points {
            let n = growth_events(sizes, axis, x);
            let at = Instant::now();
            let r = match axis {
                Axis::Subscribers => {
                    scenarios::fanout(env, Transport::Sse, x as usize, n, false, ServeOpts::default()).await
                }
                Axis::Sessions => scenarios::many_sessions(env, Transport::Sse, x as usize, n).await,
                Axis::Size => scenarios::fanout_sized(env, sizes.growth_size_subs, n, x).await,
            };
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
            out.push(GrowthSample { axis, x, n, r });
        }
    }
}

/// The median share of the cores other processes used during the measurements.
fn others_cores(s: &Samples) -> Option<f64> {
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
    report::Stat::of(&all).map(|st| st.median)
}

/// The commit measured, from git when available.
fn revision() -> String {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    match git(&["rev-parse", "--short", "HEAD"]) {
        Some(rev) => {
            let dirty =
                git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
            format!(
                "commit {rev}{}",
                if dirty { " (with uncommitted changes)" } else { "" }
            )
        }
        None => "an unknown revision".into(),
    }
}

/// `1, 10, 100` for a list of sizes.
fn list<T: ToString>(v: &[T]) -> String {
    v.iter().map(T::to_string).collect::<Vec<_>>().join(", ")
}

fn method(sizes: &Sizes, env: &Env) -> String {
    format!(
        "How: the bench starts `target/release/vak serve --listen 127.0.0.1:0` as a child process \
(its own temp home and workspace, a random token, `--max-streams` and `--max-streams-per-client` \
raised to 1 000 000 because every client shares one address), a fresh server for every measurement, \
and drives it with its own clients on a multi-threaded tokio runtime in a separate process. \
Both processes share this machine's cores: the CPU column says how much each used. \
SSE subscribers are raw HTTP/1.1 connections, one per subscriber; gRPC subscribers are tonic \
streams, {per} per HTTP/2 connection (so 1000 subscribers use {c1000} connections and {idle} idle streams \
{cidle}). A run is started with gRPC `Run` after every subscriber has its `stream_opened`. \
Delivered events are counted as `t{{i}} ` tokens in text_delta text, not frames: under backpressure vak \
merges queued deltas into one frame. Every frame's first and last token are checked to continue the \
sequence and one frame in 1024 is decoded in full (serde_json / prost) and compared. \
Throughput = subscribers x deltas / time from `Run` until the last subscriber has its last delta. \
Latency curve: {lsubs} subscribers of one session (SSE, and gRPC) and `/pace N R` at each rate R of {rates} events/s \
for {lsecs} s (N = R x {lsecs}); the server stamps each delta with its send time (unix microseconds), each client \
subtracts it from its receipt time (both clocks are this machine's one clock) and p50/p99/max are over every \
delta of every subscriber; the p99 goal (< 10 ms) is held at 1 000 events/s ({lsubs} x 1 000 deliveries/s). \
The floor rows (`SSE floor`) run the same curve with no vak: one plain thread in the bench process accepts the \
same SSE clients and, at each rate, writes the same frames to their sockets, each socket once per sweep with \
every frame it has not had (non-blocking writes, sleeping until the next frame is due): what loopback TCP and \
the bench's own reading cost on this machine; its CPU is counted as the bench's. It also runs at 10 events/s, \
where each event reaches every subscriber before the next is due. \
Where p99 crosses 10 ms: the curve's median p99 per rate brackets it (the last rate under 10 ms, the first at or \
over), then up to {steps} bisection steps each measure the bracket's geometric middle once (rounded to 10/s) and keep \
the half that still brackets it (a curve at or over 10 ms already at its lowest rate is first measured at a tenth of \
that rate); the row gives the final bracket and its geometric middle, and every bisection point. \
Growth (SSE, {gruns} run(s) per point): server CPU per delivered event (the server's CPU time over the run, from \
/proc, divided by subscribers x deltas) and server peak RSS (VmHWM) as one session gets more subscribers \
({gsubs}), as more sessions run at once with one subscriber each ({gsess}, all `/burst` at once), and as deltas \
grow ({gsizes} bytes, `/burst N SIZE` pads each `t{{i}}` token with `_`, to {gsizesubs} subscribers); each point \
sends about {gdel} deliveries (half that for sessions; sized points at most {gbytes} MiB of deltas; never fewer \
than {gmin} deltas per stream), the count is in the row. A point is flagged **faster than linear** when its CPU per \
event exceeds the previous point's by more than 1.5x (on the size axis: by more than 1.5x the size ratio), or when \
the RSS each added subscriber, session or byte costs over the first point rises by more than 1.5x from one step to \
the next (and by more than 16 MiB). \
Cluster: 3 nats-server nodes ({cnodes}; JetStream, an R3 stream) on loopback and 3 `vak serve --bus ... --bus-replicas 3` \
replicas with one token; a session made and run on replica 0 (which takes its lease), {csubs} SSE subscribers \
spread round-robin over the 3 replicas: delivered events/s of `/burst {cburst}`, then p50/p99/max of `/pace {cpace} {crate}` \
in a fresh session; then a fresh session with one subscriber on replica 0 gets `/burst {cone}`, and an embedded \
server (no `--bus`) the same right after: the ratio of the two events/s. CPU is the three replicas' together. \
Raw tonic: the bench re-executes itself as a plain tonic server of vak's own generated `AgentService` whose \
Subscribe is a `tokio::sync::broadcast` receiver (capacity {cap}, so nothing lags) and whose `Run(\"/burst N\")` \
sends the same Events; same client code, same connection sharing. \
Every server runs with the default `--durability process` (a batch reaches the kernel before any client sees it) \
except in the rows that say `--durability fsync` (fdatasync per batch before it is visible), measured right after the process rows of the same run. \
Idle: VmRSS of the server before the streams and after every one had stream_opened (plus 1 s), divided \
by the streams; the SSE rows over TLS (`--tls-self-signed`, HTTP/1.1) and over HTTP/2 (h2c) use reqwest, one \
connection per stream. nginx + nchan (with `--peer nchan`): nginx 1.22 with Debian's nchan module, one worker \
process, a subscriber location `nchan_subscriber eventsource` read by the same raw SSE client, and a publisher \
location fed by the bench on one connection with pipelined POSTs of the JSON vak writes for a delta (event name \
from `X-EventSource-Event`), then a run_finished; RSS and CPU are the worker's, and its stream is open once its \
response head is in (nchan sends no stream_opened); throughput is from the first publish, not from a Run. Stalled: one of {stalled} subscribers reads stream_opened and then never reads again (on gRPC on its own \
connection); its peers' time to the last delta is compared with an unstalled {stalled}-subscriber fan-out run just \
before it; peak RSS is the server's VmHWM; /burst {sburst_stall}. \
Replay from disk: S sessions each get H events of history (`/burst H` in each, all at once, \
with nobody watching: `--first-subscriber-wait-ms 0`); then each gets a stalled subscriber (a stream with `after=0` that \
reads stream_opened and never reads again; on gRPC each on its own connection) and, 0.5 s later, one reader from a \
cursor H events before its latest seq, far older than the 1024-frame replay ring, so the ledger on disk \
serves it (S and H in the row: {replay}); each reader checks every seq continues the last one (a merged delta must cover exactly the seqs it skips), \
the tokens continue and no resync comes, until the session's latest seq. Time: from opening the readers until the \
last has its last event; peak RSS: the server's VmHWM reset (/proc/<pid>/clear_refs) just before the readers. \
Search: S sessions (S in the row), each created and given one run (gRPC `Run` with `wait`, 16 at a time) whose \
prompt carries a word of its own; once the last session's word is found, the first session's word is searched \
{squeries} times in a row with gRPC `Search` (limit 20), each round trip timed by the client. \
The CPU column is the median share of the measured interval each \
process used, in cores; \"others\" is everything else on the machine (/proc/stat), which competes for the same cores. {memory} Sizes: burst {burst}, {sessions} sessions x {sburst}, {runs} runs each ({rruns} of the replay).\n",
        per = env.per_conn,
        c1000 = 1000usize.div_ceil(env.per_conn),
        idle = sizes.idle,
        cidle = format_args!("{} connections", sizes.idle.div_ceil(env.per_conn)),
        lsubs = sizes.latency_subs,
        rates = list(&sizes.latency_rates),
        lsecs = sizes.latency_secs,
        steps = sizes.cross_steps,
        gruns = sizes.growth_runs,
        gsubs = list(&sizes.growth_subs),
        gsess = list(&sizes.growth_sessions),
        gsizes = list(&sizes.growth_sizes),
        gsizesubs = sizes.growth_size_subs,
        gdel = sizes.growth_deliveries,
        gbytes = sizes.growth_size_bytes >> 20,
        gmin = sizes.growth_min_events,
        cnodes = if std::env::var_os("VAK_NATS_SERVER").is_some() {
            "the binary VAK_NATS_SERVER names"
        } else {
            "target/nats-venv, from `make nats`"
        },
        csubs = sizes.cluster.subs,
        cburst = sizes.cluster.burst,
        cpace = sizes.cluster.pace,
        crate = sizes.cluster.rate,
        cone = sizes.cluster.one_burst,
        cap = env.capacity,
        stalled = sizes.stalled_subs,
        burst = sizes.burst,
        sessions = sizes.sessions,
        sburst = sizes.session_burst,
        sburst_stall = sizes.stall_burst,
        runs = sizes.runs,
        replay = sizes
            .replay
            .iter()
            .map(|(t, s, h)| format!("{} {s} x {h}", t.label()))
            .collect::<Vec<_>>()
            .join(", "),
        rruns = sizes.replay_runs.min(sizes.runs),
        squeries = sizes.search_queries,
        memory = memory::method(&sizes.memory),
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

fn median_cpu(c: &[machine::CpuUse]) -> Option<(f64, f64, f64)> {
    let m = |f: fn(&machine::CpuUse) -> f64| {
        report::Stat::of(
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
    report::Stat::of(
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

fn fail(row: &mut Row, err: Option<String>, failures: &mut usize) {
    if let Some(e) = err {
        *failures += 1;
        row.failure = Some(e);
    }
}

fn values<T>(v: &[(usize, T)], f: impl Fn(&T) -> f64) -> Vec<f64> {
    v.iter().map(|(_, x)| f(x)).collect()
}

/// The table's rows from every run's figures.
fn rows(s: &Samples, sizes: &Sizes, transports: &[Transport]) -> (Vec<Row>, usize) {
    let mut rows = Vec::new();
    let mut failures = 0;
    let fanout_subs: Vec<usize> = sizes
        .fanout_subs
        .iter()
        .copied()
        .filter(|n| s.fanout.iter().any(|x| x.subs == *n))
        .collect();
    for subs in fanout_subs {
        let (tonic, _) = ok_values(&s.fanout, Transport::Tonic, Some(subs));
        let mut order = transports.to_vec();
        if transports.contains(&Transport::Grpc) {
            order.push(Transport::Tonic);
        }
        if s.fanout.iter().any(|x| x.t == Transport::Nchan) {
            order.push(Transport::Nchan);
        }
        for t in order {
            let (v, err) = ok_values(&s.fanout, t, Some(subs));
            let tps: Vec<_> = v.iter().map(|(_, x)| *x).collect();
            let scen = format!(
                "1. Fan-out, {subs} subscriber{}",
                if subs == 1 { "" } else { "s" }
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
            // Ratios to raw tonic pair the measurements of one run (taken back to back).
            let ratios = |f: fn(&scenarios::Throughput) -> f64| -> Vec<f64> {
                v.iter()
                    .filter_map(|(run, x)| tonic.iter().find(|(r, _)| r == run).map(|(_, b)| f(x) / f(b)))
                    .collect()
            };
            if t == Transport::Sse {
                // Raw tonic, measured back to back on the same machine, is the
                // yardstick that carries across machines.
                let ratio = report::Stat::of(&ratios(|x| x.eps));
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
            if t == Transport::Grpc {
                if let Some(x) = report::Stat::of(&ratios(|x| x.eps)) {
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
            }
            if let Some(before) = before_writer(t, subs).filter(|_| sizes.burst == 100_000) {
                r.note = match r.note.is_empty() {
                    true => before.to_string(),
                    false => format!("{}; {before}", r.note),
                };
            }
            fail(&mut r, err.clone(), &mut failures);
            rows.push(r);
            if !v.is_empty() {
                let mut r = Row::new(
                    &scen,
                    t.label(),
                    "last subscriber has all",
                    &values(&v, |x| x.last_s),
                    Unit::Seconds,
                );
                if t == Transport::Grpc {
                    r.vs_tonic = report::Stat::of(&ratios(|x| 1.0 / x.last_s)).map(|x| x.median);
                }
                rows.push(r);
            }
        }
        for &t in transports {
            let (v, err) = ok_values(&s.fanout_fsync, t, Some(subs));
            if v.is_empty() && err.is_none() {
                continue;
            }
            let (process, _) = ok_values(&s.fanout, t, Some(subs));
            let scen = format!(
                "1. Fan-out, {subs} subscriber{}",
                if subs == 1 { "" } else { "s" }
            );
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
            let paired = |base: &[(usize, scenarios::Throughput)]| -> Vec<f64> {
                v.iter()
                    .filter_map(|(run, x)| base.iter().find(|(r, _)| r == run).map(|(_, b)| x.eps / b.eps))
                    .collect()
            };
            let mut note = throughput_note(&tps);
            if let Some(x) = report::Stat::of(&paired(&process)) {
                note = format!("{:.2}x of --durability process; {note}", x.median);
            }
            if t == Transport::Grpc {
                let (tonic, _) = ok_values(&s.fanout, Transport::Tonic, Some(subs));
                r.vs_tonic = report::Stat::of(&paired(&tonic)).map(|x| x.median);
            }
            r.note = note;
            fail(&mut r, err, &mut failures);
            rows.push(r);
            if !v.is_empty() {
                rows.push(Row::new(
                    &scen,
                    label,
                    "last subscriber has all",
                    &values(&v, |x| x.last_s),
                    Unit::Seconds,
                ));
            }
        }
    }
    for &t in transports {
        latency_rows(s, sizes, t, &mut rows, &mut failures);
    }
    let rates = floor_rates(sizes);
    curve_rows(
        &s.floor,
        sizes,
        &rates,
        Transport::Sse,
        FLOOR_LABEL,
        &mut rows,
        &mut failures,
    );
    for &t in transports {
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
        fail(&mut r, err, &mut failures);
        rows.push(r);
    }
    let idle_transports: Vec<Transport> = [
        Transport::Sse,
        Transport::SseTls,
        Transport::SseH2,
        Transport::Grpc,
        Transport::Nchan,
    ]
    .into_iter()
    .filter(|t| s.idle.iter().any(|x| x.t == *t))
    .collect();
    for &t in &idle_transports {
        let (v, err) = ok_values(&s.idle, t, None);
        if v.is_empty() && err.is_none() {
            continue;
        }
        let scen = format!("4. Idle, {} streams", sizes.idle);
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
        fail(&mut r, err, &mut failures);
        rows.push(r);
    }
    for &t in transports {
        let (v, err) = ok_values(&s.stalled, t, None);
        if v.is_empty() && err.is_none() {
            continue;
        }
        let scen = format!(
            "5. Stalled client, 1 of {}, /burst {}",
            sizes.stalled_subs, sizes.stall_burst
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
        fail(&mut r, err, &mut failures);
        rows.push(r);
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
            rows.push(r);
        }
    }
    for &(t, sessions, history) in &sizes.replay {
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
        fail(&mut r, err, &mut failures);
        rows.push(r);
        if v.is_empty() {
            continue;
        }
        let mut r = Row::new(
            &scen,
            t.label(),
            "replayed events/s",
            &values(&v, |x| x.eps),
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
        rows.push(r);
        let mut r = Row::new(
            &scen,
            t.label(),
            "server peak RSS during the replay",
            &values(&v, |x| x.peak_kib as f64 / 1024.0),
            Unit::MiB,
        );
        let med =
            |f: fn(&scenarios::Replay) -> f64| report::Stat::of(&values(&v, f)).map_or(0.0, |s| s.median);
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
        rows.push(r);
    }
    let (v, err) = ok_values(&s.search, Transport::Grpc, None);
    if !v.is_empty() || err.is_some() {
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
            if metric == "p99" {
                r.cpu = median_cpu(&v.iter().map(|(_, x)| x.cpu).collect::<Vec<_>>());
                r.note = format!(
                    "{} queries in a row per run, round trip through gRPC Search; sessions written in {:.1} s",
                    sizes.search_queries,
                    report::Stat::of(&values(&v, |x| x.write_s)).map_or(0.0, |x| x.median)
                );
                fail(&mut r, err.clone(), &mut failures);
            }
            rows.push(r);
        }
    }
    growth_rows(s, sizes, &mut rows, &mut failures);
    cluster_rows(s, sizes, &mut rows, &mut failures);
    memory::rows(&s.memory, &sizes.memory, &mut rows, &mut failures);
    (rows, failures)
}

/// The latency curve of `t` (p50, p99, max at each rate; the goal on p99 at
/// 1 000 events/s) and the rate where its p99 crosses 10 ms.
fn latency_rows(s: &Samples, sizes: &Sizes, t: Transport, rows: &mut Vec<Row>, failures: &mut usize) {
    curve_rows(
        &s.latency,
        sizes,
        &sizes.latency_rates,
        t,
        t.label(),
        rows,
        failures,
    );
    crossing_row(s, sizes, t, rows);
}

/// The transport column of the latency floor's rows (`floor.rs`).
const FLOOR_LABEL: &str = "SSE floor: one plain thread writes the sockets, no vak";

/// The floor's rates: first 10 events/s, where each event reaches every
/// subscriber before the next is due (what one event costs), then the curve's.
fn floor_rates(sizes: &Sizes) -> Vec<u64> {
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
    rows: &mut Vec<Row>,
    failures: &mut usize,
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
                fail(&mut r, err.clone(), failures);
            } else if v.is_empty() {
                continue;
            }
            rows.push(r);
        }
    }
}

/// The rate where `t`'s p99 crosses 10 ms, from its curve and bisection points.
fn crossing_row(s: &Samples, sizes: &Sizes, t: Transport, rows: &mut Vec<Row>) {
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
    rows.push(r);
}

/// The growth table: per point, server CPU per delivered event and peak
/// RSS, with the points that grow faster than linearly flagged.
fn growth_rows(s: &Samples, sizes: &Sizes, rows: &mut Vec<Row>, failures: &mut usize) {
    for (axis, unit, per_byte) in [
        (Axis::Subscribers, "subscriber", false),
        (Axis::Sessions, "session", false),
        (Axis::Size, "byte of delta", true),
    ] {
        let xs: Vec<u64> = match axis {
            Axis::Subscribers => sizes.growth_subs.iter().map(|&x| x as u64).collect(),
            Axis::Sessions => sizes.growth_sessions.iter().map(|&x| x as u64).collect(),
            Axis::Size => sizes.growth_sizes.clone(),
        };
        let per_point: Vec<(u64, u64, Vec<scenarios::Throughput>, Option<String>)> = xs
            .iter()
            .filter_map(|&x| {
                let all: Vec<&GrowthSample> =
                    s.growth.iter().filter(|g| g.axis == axis && g.x == x).collect();
                let n = all.first()?.n;
                let ok = all.iter().filter_map(|g| g.r.as_ref().ok().copied()).collect();
                let err = all.iter().rev().find_map(|g| g.r.as_ref().err().cloned());
                Some((x, n, ok, err))
            })
            .collect();
        let points: Vec<(u64, growth::Point)> = per_point
            .iter()
            .filter_map(|(x, _, ok, _)| {
                let rss = report::Stat::of(&ok.iter().map(|t| t.peak_kib as f64).collect::<Vec<_>>())?;
                Some((
                    *x,
                    growth::Point {
                        x: *x as f64,
                        ns: ns_per_event(ok),
                        rss_kib: rss.median,
                    },
                ))
            })
            .collect();
        let flags = growth::flags(
            &points.iter().map(|(_, p)| *p).collect::<Vec<_>>(),
            per_byte,
            unit,
        );
        for (x, n, ok, err) in &per_point {
            let scen = match axis {
                Axis::Subscribers => format!(
                    "8. Growth, {x} subscriber{} of 1 session, /burst {n}",
                    if *x == 1 { "" } else { "s" }
                ),
                Axis::Sessions => format!(
                    "8. Growth, {x} session{}, 1 subscriber each, /burst {n}",
                    if *x == 1 { "" } else { "s" }
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
            if let Some(flag) = points
                .iter()
                .position(|(px, _)| px == x)
                .and_then(|i| flags[i].clone())
            {
                r.note = format!("{flag}; {}", r.note);
            }
            fail(&mut r, err.clone(), failures);
            rows.push(r);
            if !ok.is_empty() {
                rows.push(Row::new(
                    &scen,
                    "SSE",
                    "server peak RSS",
                    &ok.iter().map(|t| t.peak_kib as f64 / 1024.0).collect::<Vec<_>>(),
                    Unit::MiB,
                ));
            }
        }
    }
}

/// The cluster rows: fan-out through 3 replicas (delivered events/s, and
/// p50/p99/max at the paced rate), and one subscriber on the owning replica
/// against the embedded mode.
fn cluster_rows(s: &Samples, sizes: &Sizes, rows: &mut Vec<Row>, failures: &mut usize) {
    let c = sizes.cluster;
    let scen = format!(
        "9. Cluster (3 nats nodes, 3 replicas), 1 session -> {} SSE subscribers over the replicas",
        c.subs
    );
    const LABEL: &str = "SSE via --bus";
    if let Some(why) = &s.cluster_missing {
        let mut r = Row::new(&scen, LABEL, "delivered events/s", &[], Unit::Rate);
        r.note = why.clone();
        rows.push(r);
        return;
    }
    let (v, err) = ok_values(&s.cluster, Transport::Sse, None);
    if v.is_empty() && err.is_none() {
        return;
    }
    let mut r = Row::new(
        &scen,
        LABEL,
        "delivered events/s",
        &values(&v, |x| x.fanout.eps),
        Unit::Rate,
    );
    let fan: Vec<_> = v.iter().map(|(_, x)| x.fanout).collect();
    r.cpu = median_cpu(&fan.iter().map(|x| x.cpu).collect::<Vec<_>>());
    r.note = format!("/burst {}; {}", c.burst, throughput_note(&fan));
    fail(&mut r, err, failures);
    rows.push(r);
    if v.is_empty() {
        return;
    }
    let paced = format!("{scen}, {} events/s", c.rate);
    for (metric, vals) in [
        ("p50", values(&v, |x| x.latency.p50_us)),
        ("p99", values(&v, |x| x.latency.p99_us)),
        ("max", values(&v, |x| x.latency.max_us)),
    ] {
        let mut r = Row::new(&paced, LABEL, metric, &vals, Unit::Micros);
        if metric == "p99" {
            if let Some(st) = &r.stat {
                r.goal = Some(Goal::at_most(st.median, P99_BOUND_US, true, "< 10 ms"));
            }
            r.cpu = median_cpu(&v.iter().map(|(_, x)| x.latency.cpu).collect::<Vec<_>>());
            r.note = format!("/pace {} {}, across all 3 replicas", c.pace, c.rate);
        }
        rows.push(r);
    }
    let one = "9. Cluster, a run to 1 subscriber on the owning replica";
    let mut r = Row::new(
        one,
        LABEL,
        "delivered events/s",
        &values(&v, |x| x.one.eps),
        Unit::Rate,
    );
    r.note = format!(
        "/burst {}; embedded (no --bus) {} in the same run",
        c.one_burst,
        report::Stat::of(&values(&v, |x| x.embedded.eps))
            .map_or("?".into(), |e| report::fmt_value(e.median, Unit::Rate))
    );
    rows.push(r);
    let mut r = Row::new(
        one,
        LABEL,
        "throughput vs embedded",
        &values(&v, |x| x.one.eps / x.embedded.eps.max(1e-9)),
        Unit::Fraction,
    );
    r.note = "the replica's events/s over the embedded server's, paired within each run".into();
    rows.push(r);
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
