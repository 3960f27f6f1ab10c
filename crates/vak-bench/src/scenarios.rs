//! The servers under test (a release `vak serve`, or the raw tonic baseline,
//! each a child process with its own temp home) and one run of each scenario
//! against a fresh server: fan-out, latency, many sessions, idle cost, stalled client.

use crate::clients::{self, Mode, Shared, SubResult, Target};
use crate::control::Control;
pub(crate) use crate::env::{Env, Transport};
use crate::machine::{self, CpuMark, CpuUse};
use crate::server::{ServeOpts, Server};
use crate::web;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Opens one subscriber per entry of `sessions` (SSE connections, or gRPC
/// streams `per_conn` to an HTTP/2 connection). Subscriber `stalled`, if any,
/// stops reading after stream_opened; on gRPC it gets a connection of its own.
pub(crate) async fn open(
    env: &Env,
    transport: Transport,
    target: &Target,
    sessions: &[String],
    mode: Mode,
    stalled: Option<usize>,
    shared: &Arc<Shared>,
) -> Result<Vec<JoinHandle<SubResult>>, String> {
    let mode_of = |i: usize| if Some(i) == stalled { Mode::Stalled } else { mode };
    let mut handles = Vec::with_capacity(sessions.len());
    match transport {
        Transport::Sse | Transport::Nchan => {
            for (i, sid) in sessions.iter().enumerate() {
                handles.push(tokio::spawn(clients::sse_subscriber(
                    target.clone(),
                    sid.clone(),
                    None,
                    mode_of(i),
                    shared.clone(),
                )));
            }
        }
        Transport::SseTls | Transport::SseH2 => {
            return Err(format!("{} is measured idle only", transport.label()))
        }
        Transport::Grpc | Transport::Tonic => {
            let n = sessions.len();
            let conns = clients::grpc_connections(target, n.div_ceil(env.per_conn).max(1)).await?;
            let own = match stalled {
                Some(_) => Some(clients::grpc_connections(target, 1).await?.remove(0)),
                None => None,
            };
            for (i, sid) in sessions.iter().enumerate() {
                let ch = match (&own, Some(i) == stalled) {
                    (Some(c), true) => c.clone(),
                    _ => conns[i / env.per_conn].clone(),
                };
                handles.push(tokio::spawn(clients::grpc_subscriber(
                    ch,
                    target.token.clone(),
                    sid.clone(),
                    None,
                    mode_of(i),
                    shared.clone(),
                )));
            }
        }
    }
    Ok(handles)
}

/// Awaits every subscriber; past `limit` the rest are cancelled.
pub(crate) async fn collect(
    handles: Vec<JoinHandle<SubResult>>,
    shared: &Shared,
    limit: Duration,
) -> Vec<SubResult> {
    let deadline = tokio::time::Instant::now() + limit;
    let mut out = Vec::with_capacity(handles.len());
    for mut h in handles {
        let r = match tokio::time::timeout_at(deadline, &mut h).await {
            Ok(r) => r,
            Err(_) => {
                shared.cancel.cancel();
                h.await
            }
        };
        out.push(r.unwrap_or_else(|e| SubResult {
            error: Some(format!("subscriber task failed: {e}")),
            ..Default::default()
        }));
    }
    out
}

/// How the error of a run that hit its time limit starts.
pub(crate) const NOT_FINISHED: &str = "not finished within the";

/// When `collect` hit its limit (it cancels the rest only then): how far the
/// subscribers got, which says more than the cancellation errors.
pub(crate) fn timed_out(
    results: &[SubResult],
    shared: &Shared,
    limit: Duration,
    expect: u64,
) -> Result<(), String> {
    if !shared.cancel.is_cancelled() {
        return Ok(());
    }
    let delivered: u64 = results.iter().map(|r| r.tokens).sum();
    let done = results.iter().filter(|r| r.all_at.is_some()).count();
    Err(format!(
        "{NOT_FINISHED} {} s limit: {delivered} of {} events delivered ({:.0}/s), {done} of {} subscribers had all of theirs",
        limit.as_secs(),
        expect * results.len() as u64,
        delivered as f64 / limit.as_secs_f64(),
        results.len()
    ))
}

pub(crate) fn first_error(results: &[SubResult]) -> Result<(), String> {
    let failed = results.iter().filter(|r| r.error.is_some()).count();
    match results.iter().find_map(|r| r.error.as_ref()) {
        Some(e) => Err(format!(
            "{failed} of {} subscribers failed; first: {e}",
            results.len()
        )),
        None => Ok(()),
    }
}

/// When the last subscriber had every event, from the moment Run was sent.
fn last_complete(results: &[SubResult], t0: Instant) -> Result<f64, String> {
    let mut last = t0;
    for r in results {
        last = last.max(r.all_at.ok_or("a subscriber never had all of its events")?);
    }
    Ok(last.duration_since(t0).as_secs_f64().max(1e-9))
}

/// One fan-out (or stalled-client) run.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Throughput {
    /// Delivered events per second, all (reading) subscribers together.
    pub eps: f64,
    /// Seconds from Run until the last (reading) subscriber had every event.
    pub last_s: f64,
    /// Frames the subscribers received (events / frames = how much merged).
    pub frames: u64,
    pub events: u64,
    /// Peak server RSS (VmHWM) in KiB.
    pub peak_kib: u64,
    pub cpu: CpuUse,
}

impl Throughput {
    /// The figures of the subscribers' `results`, the last of which had all
    /// of its deltas `last_s` after Run.
    fn of(results: &[SubResult], last_s: f64, peak_kib: u64, cpu: CpuUse) -> Throughput {
        let events: u64 = results.iter().map(|r| r.tokens).sum();
        Throughput {
            eps: events as f64 / last_s,
            last_s,
            frames: results.iter().map(|r| r.frames).sum(),
            events,
            peak_kib,
            cpu,
        }
    }
}

/// Fan-out: one session, `subs` subscribers, `/burst n`, on a server started
/// with `opts`. With `stall`, subscriber 0 stops reading after stream_opened
/// and is left out of the figures.
pub(crate) async fn fanout(
    env: &Env,
    transport: Transport,
    subs: usize,
    n: u64,
    stall: bool,
    opts: ServeOpts,
) -> Result<Throughput, String> {
    let server = Server::start(env, transport, opts).await?;
    let r = fanout_on(env, &server, transport, subs, n, 0, stall).await;
    server.stop().await;
    r
}

/// Fan-out of `/burst n size` (deltas of `size` bytes) over SSE, for the growth table.
pub(crate) async fn fanout_sized(env: &Env, subs: usize, n: u64, size: u64) -> Result<Throughput, String> {
    let server = Server::start(env, Transport::Sse, ServeOpts::default()).await?;
    let r = fanout_on(env, &server, Transport::Sse, subs, n, size, false).await;
    server.stop().await;
    r
}

async fn fanout_on(
    env: &Env,
    server: &Server,
    transport: Transport,
    subs: usize,
    n: u64,
    size: u64,
    stall: bool,
) -> Result<Throughput, String> {
    // nchan: a channel, fed by the bench's publisher instead of a run.
    let ctl = match transport {
        Transport::Nchan => None,
        _ => Some(Control::connect(&server.target).await?),
    };
    let sid = match &ctl {
        Some(ctl) => ctl.create_session().await?,
        None => "bench".to_string(),
    };
    let shared = Shared::new();
    let sessions = vec![sid.clone(); subs];
    let stalled = stall.then_some(0);
    let mut handles = open(
        env,
        transport,
        &server.target,
        &sessions,
        Mode::Count { expect: n },
        stalled,
        &shared,
    )
    .await?;
    shared.wait_opened(subs, Duration::from_secs(120)).await?;
    let stalled_handle = stalled.map(|i| handles.remove(i));
    let mark = CpuMark::now(server.pid);
    let t0 = Instant::now();
    // The peer's publisher runs alongside the subscribers, so a peer that
    // takes in messages slower than the limit is cut by it like a slow run.
    let publisher = match &ctl {
        Some(ctl) => {
            ctl.run(&sid, &burst_prompt(n, size)).await?;
            None
        }
        None => Some(tokio::spawn(crate::peer::publish(
            server.target.addr,
            sid.clone(),
            n,
        ))),
    };
    let results = collect(handles, &shared, env.limit).await;
    if let Some(p) = publisher {
        if !p.is_finished() {
            p.abort();
        } else if let Ok(Err(e)) = p.await {
            return Err(e);
        }
    }
    let cpu = mark.since(server.pid);
    let peak_kib = machine::hwm_kib(server.pid).unwrap_or(0);
    let late = timed_out(&results, &shared, env.limit, n);
    shared.cancel.cancel();
    if let Some(h) = stalled_handle {
        let _ = h.await;
    }
    late?;
    first_error(&results)?;
    let last_s = last_complete(&results, t0)?;
    Ok(Throughput::of(&results, last_s, peak_kib, cpu))
}

/// `/burst n`, or `/burst n size` for deltas of `size` bytes.
fn burst_prompt(n: u64, size: u64) -> String {
    match size {
        0 => format!("/burst {n}"),
        size => format!("/burst {n} {size}"),
    }
}

/// Publish-to-receipt latency of a paced stream, in microseconds.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Latency {
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
    pub samples: u64,
    /// Delivered events per second: samples over the time from Run until
    /// the last subscriber had its last delta.
    pub eps: f64,
    pub cpu: CpuUse,
}

/// Latency: one session, `subs` subscribers, `/pace n rate`; each delta
/// carries its send time, each subscriber stamps its receipt (same clock).
pub(crate) async fn latency(
    env: &Env,
    transport: Transport,
    subs: usize,
    n: u64,
    rate: u64,
) -> Result<Latency, String> {
    let server = Server::start(env, transport, ServeOpts::default()).await?;
    let r = paced_on(env, &[&server], transport, subs, n, rate).await;
    server.stop().await;
    r
}

/// Opens `subs` subscribers of `sid`, subscriber i on `servers[i % len]`.
async fn open_spread(
    env: &Env,
    transport: Transport,
    servers: &[&Server],
    sid: &str,
    subs: usize,
    mode: Mode,
    shared: &Arc<Shared>,
) -> Result<Vec<JoinHandle<SubResult>>, String> {
    let k = servers.len();
    let mut handles = Vec::with_capacity(subs);
    for (j, server) in servers.iter().enumerate() {
        let count = (subs + k - 1 - j) / k;
        let sessions = vec![sid.to_string(); count];
        handles.extend(open(env, transport, &server.target, &sessions, mode, None, shared).await?);
    }
    Ok(handles)
}

/// CPU of every server together (the first's pid stands for them in `others`).
struct Marks(Vec<(u32, CpuMark)>);

impl Marks {
    fn now(servers: &[&Server]) -> Marks {
        Marks(servers.iter().map(|s| (s.pid, CpuMark::now(s.pid))).collect())
    }

    fn since(&self) -> CpuUse {
        let mut all = self.0.iter().map(|(pid, m)| m.since(*pid));
        let mut cpu = all.next().unwrap_or_default();
        for c in all {
            cpu.server += c.server;
            cpu.others -= c.server;
        }
        cpu.others = cpu.others.max(0.0);
        cpu
    }
}

/// One run of `prompt` in a session made on `servers[0]` (which runs it,
/// so it owns the session), to `subs` subscribers in `mode` spread over
/// `servers`: what each saw, the servers' CPU, and the seconds from Run
/// until the last had all `expect` deltas.
async fn spread_run(
    env: &Env,
    servers: &[&Server],
    transport: Transport,
    subs: usize,
    mode: Mode,
    prompt: &str,
    expect: u64,
) -> Result<(Vec<SubResult>, CpuUse, f64), String> {
    let ctl = Control::connect(&servers[0].target).await?;
    let sid = ctl.create_session().await?;
    let shared = Shared::new();
    let handles = open_spread(env, transport, servers, &sid, subs, mode, &shared).await?;
    shared.wait_opened(subs, Duration::from_secs(120)).await?;
    let marks = Marks::now(servers);
    let t0 = Instant::now();
    ctl.run(&sid, prompt).await?;
    let results = collect(handles, &shared, env.limit).await;
    let cpu = marks.since();
    timed_out(&results, &shared, env.limit, expect)?;
    first_error(&results)?;
    let last_s = last_complete(&results, t0)?;
    Ok((results, cpu, last_s))
}

/// `/pace n rate` to `subs` subscribers spread over `servers` (see `spread_run`).
pub(crate) async fn paced_on(
    env: &Env,
    servers: &[&Server],
    transport: Transport,
    subs: usize,
    n: u64,
    rate: u64,
) -> Result<Latency, String> {
    let mode = Mode::Latency { expect: n };
    let prompt = format!("/pace {n} {rate}");
    let (results, cpu, last_s) = spread_run(env, servers, transport, subs, mode, &prompt, n).await?;
    summarize(results, cpu, last_s)
}

/// The latency floor (`floor.rs`): the same `/pace n rate` frames to `subs`
/// SSE subscribers, written by one plain thread in this process; its CPU is
/// counted as the bench's (server 0).
pub(crate) async fn floor_latency(env: &Env, subs: usize, n: u64, rate: u64) -> Result<Latency, String> {
    let mode = Mode::Latency { expect: n };
    let (results, cpu, last_s) = floor_run(env, subs, n, crate::floor::Frames::Paced { rate }, mode).await?;
    summarize(results, cpu, last_s)
}

/// The large-delta floor (`floor.rs`): `/burst n size`'s frames to `subs`
/// SSE subscribers, all at once, written by one plain thread in this
/// process, read and checked as a growth size point's; its CPU is counted
/// as the bench's (server 0), its peak RSS is not measured (0).
pub(crate) async fn floor_sized(env: &Env, subs: usize, n: u64, size: u64) -> Result<Throughput, String> {
    let mode = Mode::Count { expect: n };
    let (results, cpu, last_s) = floor_run(env, subs, n, crate::floor::Frames::Sized { size }, mode).await?;
    Ok(Throughput::of(&results, last_s, 0, cpu))
}

/// One floor run: `subs` SSE readers in `mode` open on a floor writing `n`
/// deltas as `frames` says; their results, the CPU (the floor's counted as
/// the bench's) and when the last reader had all.
async fn floor_run(
    env: &Env,
    subs: usize,
    n: u64,
    frames: crate::floor::Frames,
    mode: Mode,
) -> Result<(Vec<SubResult>, CpuUse, f64), String> {
    let mut floor = crate::floor::Floor::start(subs, n, frames).map_err(|e| format!("floor: {e}"))?;
    let target = Target {
        addr: floor.addr,
        token: String::new(),
        peer: false,
    };
    let shared = Shared::new();
    let sessions = vec![crate::floor::SESSION.to_string(); subs];
    let handles = open(env, Transport::Sse, &target, &sessions, mode, None, &shared).await?;
    shared.wait_opened(subs, Duration::from_secs(120)).await?;
    let mark = CpuMark::now(std::process::id());
    let t0 = Instant::now();
    floor.run();
    let results = collect(handles, &shared, env.limit).await;
    let mut cpu = mark.since(std::process::id());
    cpu.bench = cpu.server;
    cpu.server = 0.0;
    floor.finish()?;
    timed_out(&results, &shared, env.limit, n)?;
    first_error(&results)?;
    let last_s = last_complete(&results, t0)?;
    Ok((results, cpu, last_s))
}

/// Percentiles of publish-to-receipt latency, in microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Pcts {
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
    pub samples: u64,
}

/// Nearest-rank percentiles of `v` (reordered in place); None when empty.
pub(crate) fn percentiles(v: &mut [u32]) -> Option<Pcts> {
    let n = v.len();
    if n == 0 {
        return None;
    }
    let mut at = |p: f64| {
        let k = ((n as f64 * p).ceil() as usize).clamp(1, n) - 1;
        f64::from(*v.select_nth_unstable(k).1)
    };
    let p50_us = at(0.50);
    let p99_us = at(0.99);
    let max_us = at(1.0);
    Some(Pcts {
        p50_us,
        p99_us,
        max_us,
        samples: n as u64,
    })
}

/// Percentiles of every subscriber's latencies.
fn summarize(results: Vec<SubResult>, cpu: CpuUse, last_s: f64) -> Result<Latency, String> {
    let subs = results.len();
    let n = results.first().map_or(0, |r| r.latencies.len());
    let mut all: Vec<u32> = Vec::with_capacity(subs * n);
    for r in results {
        all.extend_from_slice(&r.latencies);
    }
    let Pcts {
        p50_us,
        p99_us,
        max_us,
        samples,
    } = percentiles(&mut all).ok_or("no latency samples")?;
    Ok(Latency {
        p50_us,
        p99_us,
        max_us,
        samples,
        eps: samples as f64 / last_s,
        cpu,
    })
}

/// `/burst n` to `subs` SSE subscribers spread over `servers` (see `spread_run`).
pub(crate) async fn burst_on(
    env: &Env,
    servers: &[&Server],
    subs: usize,
    n: u64,
) -> Result<Throughput, String> {
    let mode = Mode::Count { expect: n };
    let prompt = format!("/burst {n}");
    let (results, cpu, last_s) = spread_run(env, servers, Transport::Sse, subs, mode, &prompt, n).await?;
    Ok(Throughput::of(
        &results,
        last_s,
        servers.iter().map(|s| machine::hwm_kib(s.pid).unwrap_or(0)).sum(),
        cpu,
    ))
}

/// `n` new sessions, created 64 at a time.
pub(crate) async fn create_sessions(ctl: &Control, n: usize) -> Result<Vec<String>, String> {
    let mut ids = Vec::with_capacity(n);
    for chunk in (0..n).collect::<Vec<_>>().chunks(64) {
        let made = futures_util::future::join_all(chunk.iter().map(|_| ctl.create_session())).await;
        for m in made {
            ids.push(m?);
        }
    }
    Ok(ids)
}

/// Many sessions: `sessions` sessions with one subscriber each, all running `/burst n` at once.
pub(crate) async fn many_sessions(
    env: &Env,
    transport: Transport,
    sessions: usize,
    n: u64,
) -> Result<Throughput, String> {
    let server = Server::start(env, transport, ServeOpts::default()).await?;
    let r = async {
        let ctl = Control::connect(&server.target).await?;
        let ids = create_sessions(&ctl, sessions).await?;
        let shared = Shared::new();
        let handles = open(
            env,
            transport,
            &server.target,
            &ids,
            Mode::Count { expect: n },
            None,
            &shared,
        )
        .await?;
        shared.wait_opened(sessions, Duration::from_secs(120)).await?;
        let mark = CpuMark::now(server.pid);
        let t0 = Instant::now();
        let prompt = format!("/burst {n}");
        let runs = futures_util::future::join_all(ids.iter().map(|sid| ctl.run(sid, &prompt))).await;
        for r in runs {
            r?;
        }
        let results = collect(handles, &shared, env.limit).await;
        let cpu = mark.since(server.pid);
        timed_out(&results, &shared, env.limit, n)?;
        first_error(&results)?;
        let last_s = last_complete(&results, t0)?;
        Ok(Throughput::of(
            &results,
            last_s,
            machine::hwm_kib(server.pid).unwrap_or(0),
            cpu,
        ))
    }
    .await;
    server.stop().await;
    r
}

/// Server memory held by idle streams.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Idle {
    pub kib_per_stream: f64,
    pub before_kib: u64,
    pub after_kib: u64,
    /// The server's soft RLIMIT_NOFILE, from /proc/<pid>/limits.
    pub server_nofile: u64,
    pub connections: usize,
}

/// Idle cost: `streams` subscribers to one session that never receive an
/// event; VmRSS before opening them and after all have had stream_opened.
pub(crate) async fn idle(env: &Env, transport: Transport, streams: usize) -> Result<Idle, String> {
    let server = Server::start(env, transport, ServeOpts::default()).await?;
    let r = async {
        let web = matches!(transport, Transport::SseTls | Transport::SseH2);
        let sid = if web {
            web::web_create_session(&server.target, transport == Transport::SseTls).await?
        } else if transport == Transport::Nchan {
            "bench".to_string()
        } else {
            Control::connect(&server.target).await?.create_session().await?
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        let before_kib = machine::rss_kib(server.pid).ok_or("no VmRSS")?;
        let shared = Shared::new();
        let handles = if web {
            (0..streams)
                .map(|_| {
                    tokio::spawn(web::web_idle_subscriber(
                        server.target.clone(),
                        sid.clone(),
                        transport == Transport::SseTls,
                        shared.clone(),
                    ))
                })
                .collect()
        } else {
            open(
                env,
                transport,
                &server.target,
                &vec![sid.clone(); streams],
                Mode::Idle,
                None,
                &shared,
            )
            .await?
        };
        shared.wait_opened(streams, Duration::from_secs(180)).await?;
        tokio::time::sleep(Duration::from_millis(1000)).await;
        let after_kib = machine::rss_kib(server.pid).ok_or("no VmRSS")?;
        let server_nofile = machine::nofile_of(server.pid).unwrap_or(0);
        shared.cancel.cancel();
        let results = collect(handles, &shared, Duration::from_secs(60)).await;
        first_error(&results)?;
        Ok(Idle {
            kib_per_stream: after_kib.saturating_sub(before_kib) as f64 / streams as f64,
            before_kib,
            after_kib,
            server_nofile,
            connections: match transport {
                Transport::Sse | Transport::SseTls | Transport::SseH2 | Transport::Nchan => streams,
                _ => streams.div_ceil(env.per_conn),
            },
        })
    }
    .await;
    server.stop().await;
    r
}

/// Replay from the ledger on disk, with a stalled subscriber per session.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Replay {
    /// Seconds from opening the readers until the last one had its last event.
    pub replay_s: f64,
    /// Events replayed per second, all readers together.
    pub eps: f64,
    pub events: u64,
    /// Frames the readers received (fewer than events only if deltas merged).
    pub frames: u64,
    /// Server VmRSS once the history was written (sessions loaded, nobody subscribed).
    pub written_kib: u64,
    /// Server VmRSS once the stalled subscribers were attached, just before the readers.
    pub before_kib: u64,
    /// Peak server RSS while the readers replayed: VmHWM, reset just before
    /// them through /proc/<pid>/clear_refs (`hwm_reset`), else VmRSS sampled every 20 ms.
    pub peak_kib: u64,
    pub hwm_reset: bool,
    /// VmHWM before the readers: writing the history and attaching the stalled subscribers.
    pub lifetime_peak_kib: u64,
    /// Seconds it took to write the history, and the home's bytes on disk then.
    pub write_s: f64,
    pub ledger_bytes: u64,
    pub cpu: CpuUse,
}

/// Each of `ids`' latest seq, once none is busy and two looks 250 ms apart
/// agree: a session is idle as soon as its run ends, while its writer may
/// still be making the run's last events visible.
async fn wait_idle(ctl: &Control, ids: &[String], limit: Duration) -> Result<Vec<u64>, String> {
    let start = Instant::now();
    let mut before: Option<Vec<u64>> = None;
    loop {
        let listed = ctl.list_sessions().await?;
        let state: std::collections::HashMap<&str, (u64, bool)> = listed
            .iter()
            .map(|(id, latest, busy)| (id.as_str(), (*latest, *busy)))
            .collect();
        let latest: Option<Vec<u64>> = ids
            .iter()
            .map(|id| state.get(id.as_str()).filter(|(_, busy)| !busy).map(|(l, _)| *l))
            .collect();
        match latest {
            Some(latest) if before.as_ref() == Some(&latest) => return Ok(latest),
            latest => before = latest,
        }
        if start.elapsed() > limit {
            let busy = ids
                .iter()
                .filter(|id| state.get(id.as_str()).is_none_or(|(_, b)| *b))
                .count();
            return Err(format!(
                "{busy} of {} sessions still busy after {limit:?}",
                ids.len()
            ));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Replay from disk: `sessions` sessions each get `history` events (one
/// `/burst history` run each, all at once, nobody watching), then one
/// stalled subscriber each (a stream from `after=0` that reads stream_opened
/// and nothing more), then one reader each from a cursor `history` events
/// before the session's latest seq (far older than the replay ring) to the
/// end. Measures the readers' time to the last event and the server's peak
/// RSS while they replay.
pub(crate) async fn replay(
    env: &Env,
    transport: Transport,
    sessions: usize,
    history: u64,
) -> Result<Replay, String> {
    let opts = ServeOpts {
        no_subscriber_wait: true,
        ..ServeOpts::default()
    };
    let server = Server::start(env, transport, opts).await?;
    let r = replay_on(env, &server, transport, sessions, history).await;
    server.stop().await;
    r
}

/// The history a replay reads: written, settled, and measured.
struct History {
    ids: Vec<String>,
    /// Each session's latest seq once written.
    latest: Vec<u64>,
    write_s: f64,
    ledger_bytes: u64,
    written_kib: u64,
}

/// `/burst history` in each of `sessions` new sessions at once, with nobody watching.
async fn write_history(
    ctl: &Control,
    server: &Server,
    sessions: usize,
    history: u64,
) -> Result<History, String> {
    let ids = create_sessions(ctl, sessions).await?;
    let written = Instant::now();
    let prompt = format!("/burst {history}");
    for r in futures_util::future::join_all(ids.iter().map(|sid| ctl.run(sid, &prompt))).await {
        r?;
    }
    let latest = wait_idle(ctl, &ids, Duration::from_secs(900)).await?;
    Ok(History {
        ids,
        latest,
        write_s: written.elapsed().as_secs_f64(),
        ledger_bytes: server.home_bytes(),
        written_kib: machine::rss_kib(server.pid).ok_or("no VmRSS")?,
    })
}

/// One stalled subscriber per session, replaying from the start (on gRPC
/// each on a connection of its own, so its flow-control window holds up
/// nobody else).
async fn open_stalled(
    server: &Server,
    transport: Transport,
    ids: &[String],
    stalled: &Arc<Shared>,
) -> Result<Vec<JoinHandle<SubResult>>, String> {
    let mut handles = Vec::with_capacity(ids.len());
    match transport {
        Transport::Sse => {
            for sid in ids {
                handles.push(tokio::spawn(clients::sse_subscriber(
                    server.target.clone(),
                    sid.clone(),
                    Some(0),
                    Mode::Stalled,
                    stalled.clone(),
                )));
            }
        }
        Transport::SseTls | Transport::SseH2 | Transport::Nchan => {
            return Err(format!(
                "{} is measured in fan-out and idle only",
                transport.label()
            ))
        }
        Transport::Grpc | Transport::Tonic => {
            let conns = clients::grpc_connections(&server.target, ids.len()).await?;
            for (sid, ch) in ids.iter().zip(conns) {
                handles.push(tokio::spawn(clients::grpc_subscriber(
                    ch,
                    server.target.token.clone(),
                    sid.clone(),
                    Some(0),
                    Mode::Stalled,
                    stalled.clone(),
                )));
            }
        }
    }
    Ok(handles)
}

/// One reader per session from `afters[i]` until `latest[i]` (gRPC streams
/// `per_conn` to a connection).
async fn open_readers(
    env: &Env,
    server: &Server,
    transport: Transport,
    h: &History,
    afters: &[u64],
    readers: &Arc<Shared>,
) -> Result<Vec<JoinHandle<SubResult>>, String> {
    let sessions = h.ids.len();
    let conns = match transport {
        Transport::Sse => Vec::new(),
        _ => clients::grpc_connections(&server.target, sessions.div_ceil(env.per_conn).max(1)).await?,
    };
    let mut handles = Vec::with_capacity(sessions);
    for (i, sid) in h.ids.iter().enumerate() {
        let mode = Mode::Replay { until: h.latest[i] };
        handles.push(match transport {
            Transport::Sse => tokio::spawn(clients::sse_subscriber(
                server.target.clone(),
                sid.clone(),
                Some(afters[i]),
                mode,
                readers.clone(),
            )),
            _ => tokio::spawn(clients::grpc_subscriber(
                conns[i / env.per_conn].clone(),
                server.target.token.clone(),
                sid.clone(),
                Some(afters[i]),
                mode,
                readers.clone(),
            )),
        });
    }
    Ok(handles)
}

/// Samples `pid`'s VmRSS every 20 ms until cancelled; the task's result is the peak, in KiB.
fn rss_sampler(pid: u32) -> (CancellationToken, JoinHandle<u64>) {
    let sampling = CancellationToken::new();
    let stop = sampling.clone();
    let sampler = tokio::spawn(async move {
        let mut peak = 0;
        while !stop.is_cancelled() {
            peak = peak.max(machine::rss_kib(pid).unwrap_or(0));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        peak
    });
    (sampling, sampler)
}

async fn replay_on(
    env: &Env,
    server: &Server,
    transport: Transport,
    sessions: usize,
    history: u64,
) -> Result<Replay, String> {
    let ctl = Control::connect(&server.target).await?;
    let h = write_history(&ctl, server, sessions, history).await?;
    let stalled = Shared::new();
    let stalled_handles = open_stalled(server, transport, &h.ids, &stalled).await?;
    stalled.wait_opened(sessions, Duration::from_secs(120)).await?;
    // Let the stalled streams fill their socket buffers and stop.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let lifetime_peak_kib = machine::hwm_kib(server.pid).unwrap_or(0);
    let hwm_reset = machine::reset_hwm(server.pid);
    let before_kib = machine::rss_kib(server.pid).ok_or("no VmRSS")?;
    let (sampling, sampler) = rss_sampler(server.pid);
    let mark = CpuMark::now(server.pid);
    let t0 = Instant::now();
    let readers = Shared::new();
    let afters: Vec<u64> = h.latest.iter().map(|l| l.saturating_sub(history)).collect();
    let handles = open_readers(env, server, transport, &h, &afters, &readers).await?;
    let results = collect(handles, &readers, env.limit * 3).await;
    let cpu = mark.since(server.pid);
    sampling.cancel();
    let sampled = sampler.await.unwrap_or(0);
    let peak_kib = match hwm_reset {
        true => machine::hwm_kib(server.pid).unwrap_or(0),
        false => sampled,
    };
    stalled.cancel.cancel();
    let stalled_results = collect(stalled_handles, &stalled, Duration::from_secs(30)).await;
    first_error(&results)?;
    first_error(&stalled_results).map_err(|e| format!("stalled subscribers: {e}"))?;
    let now: Vec<u64> = wait_idle(&ctl, &h.ids, Duration::from_secs(10)).await?;
    if now != h.latest {
        return Err("the history grew after it was taken as written".into());
    }
    let replay_s = last_complete(&results, t0)?;
    let events: u64 = results.iter().zip(&afters).map(|(r, a)| r.last_seq - a).sum();
    Ok(Replay {
        replay_s,
        eps: events as f64 / replay_s,
        events,
        frames: results.iter().map(|r| r.seq_frames).sum(),
        written_kib: h.written_kib,
        before_kib,
        peak_kib,
        hwm_reset,
        lifetime_peak_kib,
        write_s: h.write_s,
        ledger_bytes: h.ledger_bytes,
        cpu,
    })
}

/// Search latency over many sessions.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct SearchLatency {
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
    pub queries: usize,
    /// Time to write the sessions (create and a settled run each).
    pub write_s: f64,
    pub cpu: CpuUse,
}

/// Sessions written at once while filling the server.
const SEARCH_WRITERS: usize = 16;

/// Search: `sessions` sessions, each a run whose prompt carries a word of
/// its own (`w<i>k`) among common ones; once the last is searchable, the
/// word of the first one is searched `queries` times, one after another,
/// through gRPC `Search` (the time is the round trip the client sees).
pub(crate) async fn search(env: &Env, sessions: usize, queries: usize) -> Result<SearchLatency, String> {
    let server = Server::start(env, Transport::Grpc, ServeOpts::default()).await?;
    let r = async {
        let ctl = Control::connect(&server.target).await?;
        let ids = create_sessions(&ctl, sessions).await?;
        let word = |i: usize| format!("w{i}k");
        let t0 = Instant::now();
        for chunk in ids.chunks(SEARCH_WRITERS).enumerate() {
            let (c, batch) = chunk;
            let runs = batch.iter().enumerate().map(|(j, sid)| {
                let i = c * SEARCH_WRITERS + j;
                let prompt = format!(
                    "session {i} notes the word {} among common words of a coding chat",
                    word(i)
                );
                let ctl = ctl.clone();
                async move { ctl.run_settled(sid, &prompt).await }
            });
            for r in futures_util::future::join_all(runs).await {
                r?;
            }
        }
        let write_s = t0.elapsed().as_secs_f64();
        // Indexing is asynchronous: wait until the last session is searchable.
        let last = word(sessions - 1);
        let deadline = Instant::now() + Duration::from_secs(120);
        while ctl.search(&last, 1).await?.is_empty() {
            if Instant::now() > deadline {
                return Err(format!("{last} was not searchable within 120 s"));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let first = word(0);
        let mark = CpuMark::now(server.pid);
        let mut us = Vec::with_capacity(queries);
        for _ in 0..queries {
            let at = Instant::now();
            let hits = ctl.search(&first, 20).await?;
            us.push(at.elapsed().as_secs_f64() * 1e6);
            if hits.first() != Some(&ids[0]) {
                return Err(format!("searching {first} found {hits:?}, not {}", ids[0]));
            }
        }
        let cpu = mark.since(server.pid);
        us.sort_by(f64::total_cmp);
        let at = |q: f64| us[((us.len() - 1) as f64 * q).round() as usize];
        Ok(SearchLatency {
            p50_us: at(0.5),
            p99_us: at(0.99),
            max_us: at(1.0),
            queries,
            write_s,
            cpu,
        })
    }
    .await;
    server.stop().await;
    r
}
