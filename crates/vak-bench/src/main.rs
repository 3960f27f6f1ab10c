//! `vak-bench`: fan-out (also with `--durability fsync`), a latency curve,
//! many-session, idle-cost, stalled-client, replay-from-disk, growth,
//! cluster, memory and realistic-load benchmarks of a release `vak serve` over SSE and gRPC, against a
//! raw tonic baseline, with this process's own async clients. `make bench` runs it and
//! writes BENCHMARKS.md; `make bench-quick` runs the same code at small sizes.

#![warn(unreachable_pub)]

mod baseline;
mod clients;
mod cluster;
mod control;
mod env;
mod floor;
mod floor_load;
mod growth;
mod machine;
mod memory;
mod method;
mod peer;
mod realistic;
mod report;
mod scenarios;
mod server;
mod sizes;
mod storm;
mod suite;
mod web;

use clap::{Parser, Subcommand};
use scenarios::{Env, Transport};
use sizes::Sizes;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use suite::{log, Plan};

#[derive(Parser, Debug)]
#[command(
    name = "vak-bench",
    about = "Benchmarks a release `vak serve`: fan-out, latency curve, many sessions, idle cost, stalled client, replay from disk, search, growth, cluster, memory, realistic load, vs raw tonic"
)]
pub(crate) struct Args {
    #[command(subcommand)]
    pub(crate) cmd: Option<Cmd>,
    /// Small sizes and one run (< 1 minute); writes nothing unless --out is given.
    #[arg(long)]
    pub(crate) quick: bool,
    /// Runs per figure (the median and min–max are reported).
    #[arg(long)]
    pub(crate) runs: Option<usize>,
    /// The vak binary to benchmark (default: `vak` next to this binary).
    #[arg(long)]
    pub(crate) vak: Option<PathBuf>,
    /// Where to write the report (default BENCHMARKS.md, none with --quick).
    #[arg(long)]
    pub(crate) out: Option<PathBuf>,
    /// Print the table only.
    #[arg(long)]
    pub(crate) no_write: bool,
    /// Only these scenarios: fanout, latency, sessions, idle, stalled, replay, search, growth, cluster, memory, realistic (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub(crate) only: Vec<String>,
    /// gRPC streams per HTTP/2 connection.
    #[arg(long, default_value_t = 100)]
    pub(crate) per_conn: usize,
    /// Fan-out subscriber counts (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub(crate) subs: Vec<usize>,
    /// Deltas per fan-out burst.
    #[arg(long)]
    pub(crate) burst: Option<u64>,
    /// Fan-out subscriber counts also measured against `vak serve --durability fsync`
    /// (comma-separated; 0 for none).
    #[arg(long, value_delimiter = ',')]
    pub(crate) fsync_subs: Vec<usize>,
    /// Sessions in the many-sessions scenario, and deltas each bursts.
    #[arg(long)]
    pub(crate) sessions: Option<usize>,
    #[arg(long)]
    pub(crate) session_burst: Option<u64>,
    /// Idle streams per transport.
    #[arg(long)]
    pub(crate) idle: Option<usize>,
    /// Subscribers of the latency curve, its rates (events/s, comma-separated)
    /// and how many seconds each rate is paced for.
    #[arg(long)]
    pub(crate) latency_subs: Option<usize>,
    #[arg(long, value_delimiter = ',')]
    pub(crate) latency_rates: Vec<u64>,
    #[arg(long)]
    pub(crate) latency_secs: Option<f64>,
    /// Runs of the growth and cluster scenarios (default 1).
    #[arg(long)]
    pub(crate) growth_runs: Option<usize>,
    /// The growth table's points: subscribers of one session, sessions of one
    /// subscriber each, delta sizes in bytes (comma-separated). Once any of
    /// the three is given, only the axes given are measured.
    #[arg(long, value_delimiter = ',')]
    pub(crate) growth_subs: Vec<usize>,
    #[arg(long, value_delimiter = ',')]
    pub(crate) growth_sessions: Vec<usize>,
    #[arg(long, value_delimiter = ',')]
    pub(crate) growth_sizes: Vec<u64>,
    /// Subscribers of the cluster fan-out, spread over its 3 replicas.
    #[arg(long)]
    pub(crate) cluster_subs: Option<usize>,
    /// Deltas in the stalled-client runs (default: the fan-out burst).
    #[arg(long)]
    pub(crate) stall_burst: Option<u64>,
    /// Sessions in the replay-from-disk scenario, and the history each gets
    /// (and is replayed from that many events back), for every transport.
    #[arg(long)]
    pub(crate) replay_sessions: Option<usize>,
    #[arg(long)]
    pub(crate) replay_history: Option<u64>,
    /// Runs of the replay scenario (default: --runs).
    #[arg(long)]
    pub(crate) replay_runs: Option<usize>,
    /// Sessions written before the search scenario searches the first one's word, and its queries.
    #[arg(long)]
    pub(crate) search_sessions: Option<usize>,
    #[arg(long)]
    pub(crate) search_queries: Option<usize>,
    /// An extra `vak serve` flag for every vak server (repeatable; for
    /// diagnosis, e.g. `--serve-arg=--max-queued-mib=4096`).
    #[arg(long, allow_hyphen_values = true)]
    pub(crate) serve_arg: Vec<String>,
    /// An extra environment variable of every vak server, KEY=VALUE (repeatable;
    /// e.g. `--serve-env LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2` to
    /// compare allocators).
    #[arg(long)]
    pub(crate) serve_env: Vec<String>,
    /// The realistic-load scenario as one point: sessions (S), deltas per
    /// second each streams (R) and readers per session (K); what is not given
    /// is the first default point's (10 000 x 50/s x 2; --quick 50 x 50/s x 2).
    #[arg(long)]
    pub(crate) realistic_sessions: Option<usize>,
    #[arg(long)]
    pub(crate) realistic_rate: Option<u64>,
    #[arg(long)]
    pub(crate) realistic_readers: Option<usize>,
    /// Seconds each realistic-load session streams (default 10; --quick 2).
    #[arg(long)]
    pub(crate) realistic_secs: Option<f64>,
    /// Runs of the memory scenario (default 1).
    #[arg(long)]
    pub(crate) memory_runs: Option<usize>,
    /// A peer server measured in the same run on the fan-out and idle
    /// scenarios, with the same SSE client: `nchan` (nginx + nchan, `make
    /// bench-peer` installs it). The report goes to its own block of the file.
    #[arg(long)]
    pub(crate) peer: Option<String>,
    /// Transports to run (sse, grpc; raw tonic runs whenever grpc fan-out does;
    /// sse-tls and sse-h2, idle only, run with sse or by name).
    #[arg(long, value_delimiter = ',')]
    pub(crate) transports: Vec<String>,
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
    /// The realistic-load floor (the bench starts it itself).
    #[command(hide = true)]
    LoadFloorServer {
        #[arg(long)]
        sessions: usize,
        #[arg(long)]
        readers: usize,
        #[arg(long)]
        deltas: u64,
        #[arg(long)]
        rate: u64,
    },
}

fn main() {
    let args = Args::parse();
    match args.cmd {
        Some(Cmd::BaselineServer { listen, capacity }) => {
            if let Err(e) = baseline::serve(listen, capacity) {
                eprintln!("baseline: error: {e}");
                std::process::exit(1);
            }
            return;
        }
        Some(Cmd::LoadFloorServer {
            sessions,
            readers,
            deltas,
            rate,
        }) => {
            let plan = floor_load::Plan {
                sessions,
                readers,
                deltas,
                rate,
            };
            if let Err(e) = floor_load::serve(plan) {
                eprintln!("load floor: error: {e}");
                std::process::exit(1);
            }
            return;
        }
        None => {}
    }
    let (before, after) = machine::raise_nofile();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let code = runtime.block_on(bench(args, before, after));
    std::process::exit(code);
}

/// The whole bench: what to measure, the measurements, the table (printed,
/// and written unless told not to); the exit code.
async fn bench(args: Args, nofile_before: (u64, u64), nofile_after: u64) -> i32 {
    let started = Instant::now();
    let machine = machine::Machine::probe(nofile_before, nofile_after);
    let plan = match plan(&args, &machine) {
        Ok(plan) => plan,
        Err(code) => return code,
    };
    let samples = suite::measure(&plan).await;
    let table = suite::rows(&samples, &plan);
    println!("\n{}", report::table(&table.rows));
    println!("{}", report::goals(&table.rows));
    let wall = started.elapsed().as_secs_f64();
    log(format!("done in {wall:.0} s"));
    if let Some(path) = out_path(&args) {
        let ctx = report::Context {
            machine: &machine,
            command: &command(),
            revision: revision(),
            method: &method::method(&plan.sizes, &plan.env),
            wall_s: wall,
            load_at_end: machine::load_average(),
            others_cores: suite::others_cores(&samples),
        };
        match report::write_markdown(&path, &report::section(&ctx, &table.rows), plan.peer) {
            Ok(()) => log(format!("wrote {}", path.display())),
            Err(e) => {
                log(format!("cannot write {}: {e}", path.display()));
                return 1;
            }
        }
    }
    if table.failures > 0 {
        log(format!("{} measurements failed", table.failures));
        return 1;
    }
    0
}

/// What the flags ask to measure, or the exit code when they cannot be
/// followed (no vak binary, no peer).
fn plan(args: &Args, machine: &machine::Machine) -> Result<Plan, i32> {
    let mut sizes = Sizes::of(args);
    let env = env(args, &sizes)?;
    log(format!("machine: {machine}"));
    log(format!("sizes: {sizes:?}"));
    let transports = transports(args);
    sizes.replay.retain(|(t, _, _)| transports.contains(t));
    let peer = peer(args)?;
    Ok(Plan {
        env,
        sizes,
        idle_transports: idle_transports(args, &transports, peer),
        transports,
        peer,
        only: args.only.clone(),
    })
}

/// The servers' binary and flags; Err(2) when there is no vak binary.
fn env(args: &Args, sizes: &Sizes) -> Result<Env, i32> {
    let exe = std::env::current_exe().expect("the bench's own path");
    let vak = args.vak.clone().unwrap_or_else(|| server::default_vak(&exe));
    if !vak.is_file() {
        log(format!(
            "no vak binary at {} (build it: cargo build --release --bins)",
            vak.display()
        ));
        return Err(2);
    }
    Ok(Env {
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
    })
}

/// `--transports`: SSE and gRPC, or those named.
fn transports(args: &Args) -> Vec<Transport> {
    [Transport::Sse, Transport::Grpc]
        .into_iter()
        .filter(|t| {
            args.transports.is_empty()
                || args
                    .transports
                    .iter()
                    .any(|a| a.eq_ignore_ascii_case(t.label()) || (a == "grpc" && *t == Transport::Grpc))
        })
        .collect()
}

/// `--peer`: whether nginx + nchan is measured too; Err(2) when it cannot be.
fn peer(args: &Args) -> Result<bool, i32> {
    match args.peer.as_deref() {
        None => Ok(false),
        Some("nchan") if peer::installed() => Ok(true),
        Some("nchan") => {
            log(format!(
                "--peer nchan: nginx or {} is missing (make bench-peer installs them)",
                peer::MODULE
            ));
            Err(2)
        }
        Some(other) => {
            log(format!("--peer {other}: the only peer is nchan"));
            Err(2)
        }
    }
}

/// SSE over TLS and over HTTP/2 are measured idle only (with sse, or by name).
fn idle_transports(args: &Args, transports: &[Transport], peer: bool) -> Vec<Transport> {
    transports
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
        .collect()
}

/// Where the report goes: `--out`, else BENCHMARKS.md, nowhere with --quick or --no-write.
fn out_path(args: &Args) -> Option<PathBuf> {
    match (&args.out, args.quick, args.no_write) {
        (_, _, true) => None,
        (Some(p), _, _) => Some(p.clone()),
        (None, false, _) => Some(PathBuf::from("BENCHMARKS.md")),
        (None, true, _) => None,
    }
}

/// The command the report says made it: VAK_BENCH_COMMAND, else this one.
fn command() -> String {
    std::env::var("VAK_BENCH_COMMAND").unwrap_or_else(|_| {
        std::env::args()
            .map(|a| if a.contains(' ') { format!("'{a}'") } else { a })
            .collect::<Vec<_>>()
            .join(" ")
    })
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
