//! The realistic-load scenario: S sessions at once, each streaming `/pace`d deltas at R per second to
//! K readers (half SSE, half gRPC); delivered/offered in the steady window, publish-to-receipt latency,
//! the server's CPU and RSS.

use crate::clients::{Mode, Shared, SubResult};
use crate::control::Control;
use crate::env::{Env, Transport};
use crate::machine::{self, CpuUse};
use crate::scenarios::{collect, create_sessions, first_error, open, percentiles, timed_out, Pcts};
use crate::server::{ServeOpts, Server};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// One point of the scenario: S sessions x R deltas/s x K readers, for `secs` seconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct LoadSize {
    pub sessions: usize,
    /// Deltas per second each session streams.
    pub rate: u64,
    /// Readers per session.
    pub readers: usize,
    pub secs: f64,
}

impl LoadSize {
    /// The point issue 34's goals are held at: 10 000 sessions x 50/s x 2 readers.
    pub(crate) const GOAL: LoadSize = LoadSize {
        sessions: 10_000,
        rate: 50,
        readers: 2,
        secs: 10.0,
    };

    /// Deltas each session streams (`/pace N R`: N = R x secs, at least 1).
    pub(crate) fn deltas(&self) -> u64 {
        ((self.rate as f64 * self.secs).round() as u64).max(1)
    }

    /// Deliveries per second offered while every session streams: S x R x K.
    pub(crate) fn offered(&self) -> f64 {
        self.sessions as f64 * self.rate as f64 * self.readers as f64
    }

    /// Whether reader `j` of session `i` is an SSE reader (else gRPC): every
    /// other reader in the order (session, reader), so with K = 2 each session
    /// has one of each and with K = 1 the sessions alternate.
    pub(crate) fn is_sse(&self, i: usize, j: usize) -> bool {
        (i * self.readers + j).is_multiple_of(2)
    }

    /// (SSE readers, gRPC readers).
    pub(crate) fn split(&self) -> (usize, usize) {
        let all = self.sessions * self.readers;
        (all.div_ceil(2), all / 2)
    }

    /// Whether issue 34's goals (p99 < 50 ms, <= 1 core) apply to this point.
    pub(crate) fn is_goal_point(&self) -> bool {
        (self.sessions, self.rate, self.readers) == (Self::GOAL.sessions, Self::GOAL.rate, Self::GOAL.readers)
    }
}

/// What one run of the scenario measured.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Load {
    /// S x R x K.
    pub offered_eps: f64,
    /// Deliveries per second the readers received in the steady window.
    pub delivered_eps: f64,
    /// The steady window's length; false `steady`: there was none (too short
    /// a run, or a slow start) and the figures are over the whole run.
    pub window_s: f64,
    pub steady: bool,
    pub all: Pcts,
    pub sse: Option<Pcts>,
    pub grpc: Option<Pcts>,
    /// Tokens and frames the readers received over the whole run (= S x K x N: checked).
    pub deliveries: u64,
    pub frames: u64,
    /// CPU in the steady window, and over the whole run (first Run until the last delta).
    pub cpu: CpuUse,
    pub run_cpu: CpuUse,
    /// Seconds: opening every reader; from the first Run sent until every
    /// Run was admitted, and until the sessions' common start; from that
    /// start until the last reader had its last delta (nominal (N - 1) / R).
    pub open_s: f64,
    pub admit_s: f64,
    pub lead_s: f64,
    pub stream_s: f64,
    /// Sessions whose Run was sent after the common start (they started late).
    pub late: usize,
    /// Server VmRSS with every reader open before the runs, and VmHWM at the end.
    pub open_kib: u64,
    pub peak_kib: u64,
    /// The server's threads at the end of the run (its blocking pool keeps idle threads 10 s).
    pub threads: u64,
}

/// How often the sampler reads the delivered count and the CPU times.
const TICK: Duration = Duration::from_millis(100);
/// Ticks kept at most (bounded: 10 000 s of them).
const MAX_TICKS: usize = 100_000;
/// The steady window starts this long after the last Run was admitted, and
/// ends this long before the first session's last delta was due.
const START_MARGIN: Duration = Duration::from_millis(250);
const END_MARGIN: Duration = Duration::from_millis(100);
/// A steady window shorter than this says little: the whole run is used instead.
const MIN_WINDOW: Duration = Duration::from_millis(500);
/// SSE read buffers: a paced stream brings one small frame per read.
const READ_SIZE: usize = 4096;

/// The delivered count and CPU times at one moment.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Tick {
    pub at: Instant,
    pub delivered: u64,
    /// CPU seconds of the server, of the bench, and the machine's busy seconds.
    pub server_s: f64,
    pub bench_s: f64,
    pub machine_s: f64,
}

impl Tick {
    fn now(pid: u32, shared: &Shared) -> Tick {
        Tick {
            at: Instant::now(),
            delivered: shared.delivered.total(),
            server_s: machine::cpu_seconds(pid),
            bench_s: machine::cpu_seconds(0),
            machine_s: machine::machine_busy_seconds(),
        }
    }
}

/// Between two ticks: deliveries per second and the CPU used.
pub(crate) fn between(a: &Tick, b: &Tick) -> (f64, CpuUse) {
    let wall = b.at.duration_since(a.at).as_secs_f64().max(1e-9);
    let server = b.server_s - a.server_s;
    let bench = b.bench_s - a.bench_s;
    let cpu = CpuUse {
        server,
        bench,
        others: (b.machine_s - a.machine_s - server - bench).max(0.0),
        wall,
    };
    ((b.delivered - a.delivered) as f64 / wall, cpu)
}

/// The ticks bounding the steady window [from, to]: the first at or after
/// `from` and the last at or before `to`, if they are `MIN_WINDOW` apart.
pub(crate) fn window(ticks: &[Tick], from: Instant, to: Instant) -> Option<(Tick, Tick)> {
    let a = ticks.iter().find(|t| t.at >= from)?;
    let b = ticks.iter().rev().find(|t| t.at <= to)?;
    (b.at > a.at && b.at.duration_since(a.at) >= MIN_WINDOW).then_some((*a, *b))
}

/// Reads the delivered count and CPU every `TICK` until `stop`, then once more.
fn sampler(pid: u32, shared: Arc<Shared>, stop: CancellationToken) -> JoinHandle<Vec<Tick>> {
    tokio::spawn(async move {
        let mut ticks = vec![Tick::now(pid, &shared)];
        let mut every = tokio::time::interval(TICK);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        while ticks.len() < MAX_TICKS {
            tokio::select! {
                _ = every.tick() => ticks.push(Tick::now(pid, &shared)),
                _ = stop.cancelled() => break,
            }
        }
        ticks.push(Tick::now(pid, &shared));
        ticks
    })
}

/// Connections the bench and the server each hold: one per SSE reader, one
/// per `per_conn` gRPC readers, and a few more (the control channel).
pub(crate) fn connections(size: &LoadSize, per_conn: usize) -> usize {
    let (sse, grpc) = size.split();
    sse + grpc.div_ceil(per_conn.max(1)) + 8
}

/// Refuses a point whose connections do not fit the open-files limit the
/// bench has (the server inherits it and accepts at most three quarters of it).
fn check_nofile(env: &Env, size: &LoadSize) -> Result<(), String> {
    let need = connections(size, env.per_conn);
    let limit = machine::nofile_soft();
    if need > limit * 3 / 4 {
        return Err(format!(
            "{need} connections are needed, over three quarters of RLIMIT_NOFILE {limit} (the server's default --max-connections): fewer sessions or readers, or a higher `ulimit -Hn`"
        ));
    }
    Ok(())
}

/// One run on a fresh server.
pub(crate) async fn realistic(env: &Env, size: LoadSize) -> Result<Load, String> {
    check_nofile(env, &size)?;
    let server = Server::start(env, Transport::Sse, ServeOpts::default()).await?;
    let r = realistic_on(env, &server, size).await;
    server.stop().await;
    r
}

async fn realistic_on(env: &Env, server: &Server, size: LoadSize) -> Result<Load, String> {
    let ctl = Control::connect(&server.target).await?;
    let ids = create_sessions(&ctl, size.sessions).await?;
    let (mut sse_ids, mut grpc_ids) = (Vec::new(), Vec::new());
    for (i, id) in ids.iter().enumerate() {
        for j in 0..size.readers {
            match size.is_sse(i, j) {
                true => sse_ids.push(id.clone()),
                false => grpc_ids.push(id.clone()),
            }
        }
    }
    let n = size.deltas();
    let mode = Mode::Latency { expect: n };
    let shared = Shared::with_read_size(READ_SIZE);
    let opening = Instant::now();
    let target = &server.target;
    let mut handles = open(env, Transport::Sse, target, &sse_ids, mode, None, &shared).await?;
    let n_sse = handles.len();
    if !grpc_ids.is_empty() {
        handles.extend(open(env, Transport::Grpc, target, &grpc_ids, mode, None, &shared).await?);
    }
    let readers = handles.len();
    if let Err(e) = shared.wait_opened(readers, Duration::from_secs(300)).await {
        shared.cancel.cancel();
        collect(handles, &shared, Duration::from_secs(30)).await;
        return Err(e);
    }
    let open_s = opening.elapsed().as_secs_f64();
    let open_kib = machine::rss_kib(server.pid).unwrap_or(0);

    let stop = CancellationToken::new();
    let ticks = sampler(server.pid, shared.clone(), stop.clone());
    let t0 = Instant::now();
    let start = t0 + lead(&size);
    let mut late = 0;
    let mut failed_run = None;
    for (c, chunk) in ids.chunks(RUN_BATCH).enumerate() {
        let now = Instant::now();
        if now > start {
            late += chunk.len();
        }
        let runs = chunk.iter().enumerate().map(|(j, sid)| {
            let prompt = prompt(&size, c * RUN_BATCH + j, start, now);
            let ctl = &ctl;
            async move { ctl.run(sid, &prompt).await }
        });
        failed_run = futures_util::future::join_all(runs)
            .await
            .into_iter()
            .find_map(Result::err);
        if failed_run.is_some() {
            break;
        }
    }
    let admitted = Instant::now();
    if failed_run.is_some() {
        shared.cancel.cancel();
    }
    let results = collect(handles, &shared, env.limit).await;
    stop.cancel();
    let ticks = ticks.await.map_err(|e| format!("the sampler failed: {e}"))?;
    let peak_kib = machine::hwm_kib(server.pid).unwrap_or(0);
    let threads = machine::threads(server.pid).unwrap_or(0);
    if let Some(e) = failed_run {
        return Err(e);
    }
    timed_out(&results, &shared, env.limit, n)?;
    first_error(&results)?;
    summarize(&size, &results, n_sse, &ticks, start.max(t0), admitted, n).map(|l| Load {
        open_s,
        open_kib,
        peak_kib,
        threads,
        late,
        admit_s: admitted.duration_since(t0).as_secs_f64(),
        lead_s: start.duration_since(t0).as_secs_f64(),
        ..l
    })
}

/// Whether the floor's one process can hold the point's S x K readers (and
/// a few more) within three quarters of RLIMIT_NOFILE; why not, if not.
pub(crate) fn floor_fits(size: LoadSize) -> Result<(), String> {
    let need = size.sessions * size.readers + 8;
    if need > machine::nofile_soft() * 3 / 4 {
        return Err(format!(
            "{need} connections in one process do not fit RLIMIT_NOFILE {}",
            machine::nofile_soft()
        ));
    }
    Ok(())
}

/// The same point with no vak: the load floor process (`floor_load.rs`)
/// paces the same deltas to S x K SSE readers, every one SSE (the floor
/// speaks no gRPC); its CPU and RSS are read as a server's.
pub(crate) async fn realistic_floor(env: &Env, size: LoadSize) -> Result<Load, String> {
    floor_fits(size)?;
    let readers = size.sessions * size.readers;
    let n = size.deltas();
    let plan = crate::floor_load::Plan {
        sessions: size.sessions,
        readers: size.readers,
        deltas: n,
        rate: size.rate,
    };
    let floor = crate::floor_load::FloorProcess::start(&env.exe, plan).await?;
    let target = crate::clients::Target {
        addr: floor.addr,
        token: String::new(),
        peer: false,
    };
    let shared = Shared::with_read_size(READ_SIZE);
    let opening = Instant::now();
    let ids = vec![crate::floor::SESSION.to_string(); readers];
    let mode = Mode::Latency { expect: n };
    let handles = open(env, Transport::Sse, &target, &ids, mode, None, &shared).await?;
    if let Err(e) = shared.wait_opened(readers, Duration::from_secs(300)).await {
        shared.cancel.cancel();
        collect(handles, &shared, Duration::from_secs(30)).await;
        return Err(e);
    }
    let t0 = Instant::now();
    let open_s = opening.elapsed().as_secs_f64();
    let open_kib = machine::rss_kib(floor.pid).unwrap_or(0);
    let stop = CancellationToken::new();
    let ticks = sampler(floor.pid, shared.clone(), stop.clone());
    // The floor paces from its last accept plus its lead: no later than this.
    let start = t0 + crate::floor_load::LEAD;
    let results = collect(handles, &shared, env.limit).await;
    stop.cancel();
    let ticks = ticks.await.map_err(|e| format!("the sampler failed: {e}"))?;
    let peak_kib = machine::hwm_kib(floor.pid).unwrap_or(0);
    floor.finish(Duration::from_secs(30)).await?;
    timed_out(&results, &shared, env.limit, n)?;
    first_error(&results)?;
    summarize(&size, &results, results.len(), &ticks, start, start, n).map(|l| Load {
        open_s,
        open_kib,
        peak_kib,
        threads: 1,
        lead_s: crate::floor_load::LEAD.as_secs_f64(),
        ..l
    })
}

/// Runs are sent this many at a time.
const RUN_BATCH: usize = 128;
/// The common start is this long, plus `LEAD_PER_RUN` per session, after the first Run is sent.
const LEAD: Duration = Duration::from_secs(1);
const LEAD_PER_RUN: Duration = Duration::from_micros(1000);

/// How long after the first Run is sent every session starts streaming:
/// time enough to admit every run first, so all stream at once.
pub(crate) fn lead(size: &LoadSize) -> Duration {
    LEAD + LEAD_PER_RUN * size.sessions.min(1 << 20) as u32
}

/// Session `i`'s prompt, sent at `now`: sleep until `start` plus its phase
/// (the sessions' first deltas spread evenly over one period 1/R, so they do
/// not all tick at the same instant), then `/pace N R`. Late (`now` past
/// `start`), it starts at once, at its phase.
pub(crate) fn prompt(size: &LoadSize, i: usize, start: Instant, now: Instant) -> String {
    let period_us = 1e6 / size.rate as f64;
    let phase = Duration::from_micros((i as f64 * period_us / size.sessions.max(1) as f64) as u64);
    let wait = (start + phase).saturating_duration_since(now);
    format!(
        "/sleep {}\n/pace {} {}",
        wait.as_millis(),
        size.deltas(),
        size.rate
    )
}

/// The figures of one run: `results` (the first `n_sse` SSE readers), the
/// sampler's `ticks`, the sessions' common `start`, the last Run admitted at `admitted`.
fn summarize(
    size: &LoadSize,
    results: &[SubResult],
    n_sse: usize,
    ticks: &[Tick],
    start: Instant,
    admitted: Instant,
    n: u64,
) -> Result<Load, String> {
    let deliveries: u64 = results.iter().map(|r| r.tokens).sum();
    let expected = n * results.len() as u64;
    if deliveries != expected {
        return Err(format!("{deliveries} deltas delivered, {expected} expected"));
    }
    let mut last = start;
    for r in results {
        last = last.max(r.all_at.ok_or("a reader never had all of its deltas")?);
    }
    let mut all: Vec<u32> = Vec::with_capacity(deliveries as usize);
    for r in &results[..n_sse] {
        all.extend_from_slice(&r.latencies);
    }
    let sse_samples = all.len();
    for r in &results[n_sse..] {
        all.extend_from_slice(&r.latencies);
    }
    let sse = percentiles(&mut all[..sse_samples]);
    let grpc = percentiles(&mut all[sse_samples..]);
    let all = percentiles(&mut all).ok_or("no latency samples")?;

    // Every session streams from its start (at or after `start`) for (n - 1) / rate s.
    let streaming = Duration::from_secs_f64((n - 1) as f64 / size.rate as f64);
    let (from, to) = (
        admitted.max(start) + START_MARGIN,
        (start + streaming).checked_sub(END_MARGIN),
    );
    let steady = to.and_then(|to| window(ticks, from, to));
    let (a, b) = match steady {
        Some(w) => w,
        None => match (ticks.first(), ticks.last()) {
            (Some(a), Some(b)) => (*a, *b),
            _ => return Err("no CPU samples".into()),
        },
    };
    let (delivered_eps, cpu) = between(&a, &b);
    let run_cpu = match (ticks.first(), ticks.last()) {
        (Some(a), Some(b)) => between(a, b).1,
        _ => CpuUse::default(),
    };
    Ok(Load {
        offered_eps: size.offered(),
        delivered_eps,
        window_s: cpu.wall,
        steady: steady.is_some(),
        all,
        sse,
        grpc,
        deliveries,
        frames: results.iter().map(|r| r.frames).sum(),
        cpu,
        run_cpu,
        stream_s: last.duration_since(start).as_secs_f64(),
        ..Load::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let mut v: Vec<u32> = (1..=100).rev().collect();
        let p = percentiles(&mut v).unwrap();
        assert_eq!(
            (p.p50_us, p.p99_us, p.max_us, p.samples),
            (50.0, 99.0, 100.0, 100)
        );
        // With 10 samples the 99th percentile is the largest, not an interpolation.
        let mut v: Vec<u32> = vec![5, 1, 9, 3, 7, 2, 8, 4, 6, 1000];
        let p = percentiles(&mut v).unwrap();
        assert_eq!((p.p50_us, p.p99_us, p.max_us), (5.0, 1000.0, 1000.0));
        let mut one = vec![42];
        assert_eq!(percentiles(&mut one).unwrap().p99_us, 42.0);
        assert!(percentiles(&mut []).is_none());
    }

    #[test]
    fn the_default_point_offers_a_million_deliveries_a_second() {
        let s = LoadSize::GOAL;
        assert_eq!(s.offered(), 1_000_000.0);
        assert_eq!(s.deltas(), 500);
        assert_eq!(s.split(), (10_000, 10_000));
        assert!(s.is_goal_point());
        let second = LoadSize {
            sessions: 1000,
            rate: 200,
            readers: 2,
            secs: 10.0,
        };
        assert_eq!(second.offered(), 400_000.0);
        assert_eq!(second.deltas(), 2000);
        assert!(!second.is_goal_point());
        // 10 000 SSE connections and 100 gRPC ones fit 3/4 of 20 000 descriptors.
        assert_eq!(connections(&s, 100), 10_108);
    }

    #[test]
    fn readers_alternate_between_sse_and_grpc() {
        let two = LoadSize {
            sessions: 3,
            readers: 2,
            ..LoadSize::GOAL
        };
        for i in 0..3 {
            assert!(two.is_sse(i, 0) && !two.is_sse(i, 1), "one of each per session");
        }
        let one = LoadSize {
            sessions: 5,
            readers: 1,
            ..LoadSize::GOAL
        };
        let sse = (0..5).filter(|&i| one.is_sse(i, 0)).count();
        assert_eq!((sse, 5 - sse), one.split());
        assert_eq!(one.split(), (3, 2));
    }

    #[test]
    fn every_session_sleeps_until_the_common_start_plus_its_phase() {
        let size = LoadSize {
            sessions: 4,
            rate: 50,
            readers: 2,
            secs: 1.0,
        };
        let t0 = Instant::now();
        let start = t0 + Duration::from_secs(2);
        // Phases spread over one period (20 ms): 0, 5, 10, 15 ms.
        let sent = t0 + Duration::from_millis(500);
        let p: Vec<String> = (0..4).map(|i| prompt(&size, i, start, sent)).collect();
        assert_eq!(p[0], "/sleep 1500\n/pace 50 50");
        assert_eq!(p[3], "/sleep 1515\n/pace 50 50");
        // Sent after the start: at once, at its phase.
        let late = start + Duration::from_millis(7);
        assert_eq!(prompt(&size, 0, start, late), "/sleep 0\n/pace 50 50");
        assert_eq!(prompt(&size, 2, start, late), "/sleep 3\n/pace 50 50");
        assert_eq!(lead(&LoadSize::GOAL), Duration::from_secs(11));
    }

    fn tick(t0: Instant, ms: u64, delivered: u64, server_s: f64) -> Tick {
        Tick {
            at: t0 + Duration::from_millis(ms),
            delivered,
            server_s,
            bench_s: server_s / 2.0,
            machine_s: server_s * 2.0,
        }
    }

    #[test]
    fn the_steady_window_is_inside_the_bounds_and_gives_rate_and_cores() {
        let t0 = Instant::now();
        // A ramp, then 1 000 deliveries per 100 ms, half a core of server CPU.
        let mut ticks = vec![tick(t0, 0, 0, 0.0), tick(t0, 100, 10, 0.01)];
        for k in 2..=20u64 {
            ticks.push(tick(
                t0,
                k * 100,
                10 + (k - 1) * 1000,
                0.01 + (k - 1) as f64 * 0.05,
            ));
        }
        let (a, b) = window(
            &ticks,
            t0 + Duration::from_millis(150),
            t0 + Duration::from_millis(1950),
        )
        .unwrap();
        assert_eq!(
            (a.at - t0, b.at - t0),
            (Duration::from_millis(200), Duration::from_millis(1900))
        );
        let (eps, cpu) = between(&a, &b);
        assert!((eps - 10_000.0).abs() < 1e-6, "{eps}");
        assert!((cpu.server / cpu.wall - 0.5).abs() < 1e-9);
        assert!((cpu.bench / cpu.wall - 0.25).abs() < 1e-9);
        assert!((cpu.others / cpu.wall - 0.25).abs() < 1e-9);
        // Too short a window is none.
        assert!(window(
            &ticks,
            t0 + Duration::from_millis(150),
            t0 + Duration::from_millis(550)
        )
        .is_none());
        assert!(window(&ticks, t0 + Duration::from_secs(5), t0 + Duration::from_secs(6)).is_none());
    }

    fn reader(latencies: Vec<u32>, at: Instant) -> SubResult {
        SubResult {
            tokens: latencies.len() as u64,
            frames: latencies.len() as u64,
            all_at: Some(at),
            latencies,
            ..SubResult::default()
        }
    }

    #[test]
    fn a_run_is_summarized_per_transport_and_must_be_complete() {
        let t0 = Instant::now();
        let size = LoadSize {
            sessions: 1,
            rate: 10,
            readers: 2,
            secs: 2.0,
        };
        let n = size.deltas();
        let ticks: Vec<Tick> = (0..=25u64).map(|k| tick(t0, k * 100, k * 2, 0.0)).collect();
        let end = t0 + Duration::from_millis(2100);
        let sse = reader((1..=20).collect(), end);
        let grpc = reader((101..=120).collect(), end - Duration::from_millis(50));
        let admitted = t0 + Duration::from_millis(10);
        let l = summarize(&size, &[sse, grpc], 1, &ticks, t0, admitted, n).unwrap();
        assert_eq!((l.late, l.admit_s), (0, 0.0), "filled in by the caller");
        assert_eq!(l.offered_eps, 20.0);
        assert!(l.steady);
        assert!((l.delivered_eps - 20.0).abs() < 1e-6, "{}", l.delivered_eps);
        assert_eq!(l.sse.unwrap().max_us, 20.0);
        assert_eq!(l.grpc.unwrap().p50_us, 110.0);
        assert_eq!((l.all.p50_us, l.all.max_us, l.all.samples), (20.0, 120.0, 40));
        assert!((l.stream_s - 2.1).abs() < 1e-9);
        // A reader short of a delta fails the run.
        let short = reader((1..=19).collect(), end);
        let full = reader((1..=20).collect(), end);
        assert!(summarize(&size, &[short, full], 1, &ticks, t0, admitted, n).is_err());
    }
}
