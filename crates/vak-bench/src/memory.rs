//! The memory scenario (issue 26): whether the server's RSS goes back after cycles of stalled SSE readers that close and whose session unloads, and how much RSS stalled readers pin against `--max-queued-mib`.

use crate::clients::{self, Mode, Shared};
use crate::control::Control;
use crate::machine;
use crate::report::{Goal, Row, Unit};
use crate::scenarios::{Env, Transport};
use crate::server::{ServeOpts, Server};
use std::time::{Duration, Instant};
use vak_proto::v1 as pb;

/// The scenario's sizes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MemorySizes {
    /// Stalled SSE readers per cycle, and per pinned-memory run.
    pub readers: usize,
    /// `/burst N SIZE`: deltas and their bytes.
    pub burst: u64,
    pub size: u64,
    /// Cycles of readers opened, burst, readers closed, session unloaded.
    pub cycles: usize,
    /// `--max-queued-mib` of the pinned-memory runs.
    pub cap_mib: u64,
    /// The longest wait for RSS to settle after a step.
    pub settle_max: Duration,
}

impl MemorySizes {
    pub(crate) fn full() -> MemorySizes {
        MemorySizes {
            readers: 200,
            burst: 200_000,
            size: 200,
            cycles: 5,
            cap_mib: 64,
            settle_max: Duration::from_secs(20),
        }
    }

    pub(crate) fn quick() -> MemorySizes {
        MemorySizes {
            readers: 10,
            burst: 5_000,
            size: 200,
            cycles: 2,
            cap_mib: 4,
            settle_max: Duration::from_secs(2),
        }
    }

    fn prompt(&self) -> String {
        format!("/burst {} {}", self.burst, self.size)
    }
}

/// RSS of one server over the cycles, in KiB.
#[derive(Clone, Debug, Default)]
pub(crate) struct Cycles {
    /// Settled, before the first cycle.
    pub start_kib: u64,
    /// With the cycle's readers still stalled, once its run had settled.
    pub stalled_kib: Vec<u64>,
    /// Settled, after the cycle's readers closed and its session unloaded.
    pub after_kib: Vec<u64>,
}

impl Cycles {
    /// The most RSS any later cycle left over the first cycle's, in KiB.
    pub(crate) fn growth_kib(&self) -> Option<f64> {
        let first = *self.after_kib.first()?;
        let most = self.after_kib.iter().skip(1).copied().max().unwrap_or(first);
        Some(most as f64 - first as f64)
    }
}

/// RSS of the same burst with and without stalled readers, each on a fresh
/// server with `--max-queued-mib cap_mib`, in KiB.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Pinned {
    pub without_kib: u64,
    pub with_kib: u64,
    pub with_peak_kib: u64,
}

impl Pinned {
    pub(crate) fn added_kib(&self) -> f64 {
        self.with_kib as f64 - self.without_kib as f64
    }
}

/// Both measurements of one run.
#[derive(Default)]
pub(crate) struct MemoryRun {
    pub cycles: Option<Result<Cycles, String>>,
    pub pinned: Option<Result<Pinned, String>>,
}

pub(crate) async fn run(env: &Env, sizes: &MemorySizes) -> MemoryRun {
    MemoryRun {
        cycles: Some(cycles(env, sizes).await),
        pinned: Some(pinned(env, sizes).await),
    }
}

/// RSS once it stops moving: sampled every 250 ms until four samples in a
/// row lie within 1 MiB (an allocator that gives memory back does so on a
/// timer of its own), or `max` passed.
async fn settled_rss(pid: u32, max: Duration) -> Result<u64, String> {
    let start = Instant::now();
    let mut last: Vec<u64> = Vec::new();
    loop {
        let now = machine::rss_kib(pid).ok_or("no VmRSS: the server exited")?;
        last.push(now);
        if last.len() > 4 {
            last.remove(0);
        }
        let spread = last.iter().max().unwrap_or(&0) - last.iter().min().unwrap_or(&0);
        if (last.len() == 4 && spread <= 1024) || start.elapsed() >= max {
            return Ok(now);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The session's summary as `ListSessions` reports it.
async fn summary(ctl: &Control, sid: &str) -> Result<Option<pb::SessionSummary>, String> {
    Ok(ctl.sessions().await?.into_iter().find(|s| s.session_id == sid))
}

/// Waits until `sid` has published past `after` and is no longer busy.
async fn wait_settled(ctl: &Control, sid: &str, after: u64, limit: Duration) -> Result<(), String> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(s) = summary(ctl, sid).await? {
            if !s.busy && s.latest_seq > after {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            return Err(format!("the run in {sid} did not settle within {limit:?}"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until `sid` is no longer loaded (the server's idle unloading).
async fn wait_unloaded(ctl: &Control, sid: &str, limit: Duration) -> Result<(), String> {
    let deadline = Instant::now() + limit;
    loop {
        if summary(ctl, sid).await?.is_some_and(|s| !s.loaded) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("{sid} was not unloaded within {limit:?}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `readers` SSE streams of `sid` that read stream_opened and then stop
/// reading; they close their connections when `shared` is cancelled.
async fn stall(
    server: &Server,
    sid: &str,
    readers: usize,
) -> Result<
    (
        std::sync::Arc<Shared>,
        Vec<tokio::task::JoinHandle<clients::SubResult>>,
    ),
    String,
> {
    let shared = Shared::new();
    let handles = (0..readers)
        .map(|_| {
            tokio::spawn(clients::sse_subscriber(
                server.target.clone(),
                sid.to_string(),
                None,
                Mode::Stalled,
                shared.clone(),
            ))
        })
        .collect();
    shared.wait_opened(readers, Duration::from_secs(60)).await?;
    Ok((shared, handles))
}

/// Closes the stalled readers and checks none failed.
async fn close(
    shared: &Shared,
    handles: Vec<tokio::task::JoinHandle<clients::SubResult>>,
) -> Result<(), String> {
    shared.cancel.cancel();
    for h in handles {
        let r = h.await.map_err(|e| format!("reader task failed: {e}"))?;
        if let Some(e) = r.error {
            return Err(format!("a stalled reader failed: {e}"));
        }
    }
    Ok(())
}

/// One server (default `--max-queued-mib`, sessions unloaded after 1 s
/// idle); per cycle a new session, `readers` stalled readers, the burst,
/// the readers closed, the session unloaded, RSS settled.
async fn cycles(env: &Env, sizes: &MemorySizes) -> Result<Cycles, String> {
    let extra = ["--unload-idle-after".to_string(), "1".to_string()];
    let server = Server::start_with(env, Transport::Sse, ServeOpts::default(), &extra, None).await?;
    let r = async {
        let ctl = Control::connect(&server.target).await?;
        let mut out = Cycles {
            start_kib: settled_rss(server.pid, sizes.settle_max).await?,
            ..Cycles::default()
        };
        for cycle in 1..=sizes.cycles {
            let sid = ctl.create_session().await?;
            let (shared, handles) = stall(&server, &sid, sizes.readers).await?;
            ctl.run(&sid, &sizes.prompt()).await?;
            wait_settled(&ctl, &sid, 0, env.limit).await?;
            out.stalled_kib.push(machine::rss_kib(server.pid).unwrap_or(0));
            close(&shared, handles).await?;
            wait_unloaded(&ctl, &sid, Duration::from_secs(60)).await?;
            let after = settled_rss(server.pid, sizes.settle_max).await?;
            crate::log(format!(
                "memory cycle {cycle}: VmRSS {} KiB with the readers stalled, {after} KiB once closed and unloaded",
                out.stalled_kib.last().unwrap_or(&0)
            ));
            out.after_kib.push(after);
        }
        Ok(out)
    }
    .await;
    server.stop().await;
    r
}

/// The burst on a fresh server with `--max-queued-mib cap_mib`: settled RSS
/// once the run settled, with `readers` stalled readers attached or none.
async fn one_pinned(env: &Env, sizes: &MemorySizes, readers: usize) -> Result<(u64, u64), String> {
    let extra = [
        "--max-queued-mib".to_string(),
        sizes.cap_mib.to_string(),
        "--first-subscriber-wait-ms".to_string(),
        "0".to_string(),
    ];
    let server = Server::start_with(env, Transport::Sse, ServeOpts::default(), &extra, None).await?;
    let r = async {
        let ctl = Control::connect(&server.target).await?;
        let sid = ctl.create_session().await?;
        let stalled = match readers {
            0 => None,
            n => Some(stall(&server, &sid, n).await?),
        };
        machine::reset_hwm(server.pid);
        ctl.run(&sid, &sizes.prompt()).await?;
        wait_settled(&ctl, &sid, 0, env.limit).await?;
        let rss = settled_rss(server.pid, sizes.settle_max).await?;
        let peak = machine::hwm_kib(server.pid).unwrap_or(0);
        if let Some((shared, handles)) = stalled {
            close(&shared, handles).await?;
        }
        Ok((rss, peak))
    }
    .await;
    server.stop().await;
    r
}

async fn pinned(env: &Env, sizes: &MemorySizes) -> Result<Pinned, String> {
    let (without_kib, _) = one_pinned(env, sizes, 0).await?;
    let (with_kib, with_peak_kib) = one_pinned(env, sizes, sizes.readers).await?;
    let p = Pinned {
        without_kib,
        with_kib,
        with_peak_kib,
    };
    crate::log(format!(
        "memory pinned: VmRSS {without_kib} KiB without readers, {with_kib} KiB with {} stalled (peak {with_peak_kib} KiB): {:.1} MiB added",
        sizes.readers,
        p.added_kib() / 1024.0
    ));
    Ok(p)
}

fn mib(kib: u64) -> String {
    format!("{:.0}", kib as f64 / 1024.0)
}

/// The scenario's rows: RSS left after the cycles, and RSS the stalled
/// readers pin at `--max-queued-mib`.
pub(crate) fn rows(runs: &[MemoryRun], sizes: &MemorySizes, rows: &mut Vec<Row>, failures: &mut usize) {
    cycles_row(runs, sizes, rows, failures);
    pinned_row(runs, sizes, rows, failures);
}

/// The most RSS a later cycle left over the first.
fn cycles_row(runs: &[MemoryRun], sizes: &MemorySizes, rows: &mut Vec<Row>, failures: &mut usize) {
    let transport = Transport::Sse.label();
    let scen = format!(
        "10. Memory, {} cycles of {} stalled readers on /burst {} {}, closed and the session unloaded",
        sizes.cycles, sizes.readers, sizes.burst, sizes.size
    );
    let mut vals = Vec::new();
    let mut err = None;
    let mut note = String::new();
    for c in runs.iter().filter_map(|r| r.cycles.as_ref()) {
        match c {
            Ok(c) => {
                if let Some(g) = c.growth_kib() {
                    vals.push(g / 1024.0);
                }
                note = format!(
                    "VmRSS {} MiB before; after each cycle (readers closed, session unloaded): {} MiB; with the readers stalled: {} MiB",
                    mib(c.start_kib),
                    c.after_kib.iter().map(|&k| mib(k)).collect::<Vec<_>>().join(", "),
                    c.stalled_kib.iter().map(|&k| mib(k)).collect::<Vec<_>>().join(", ")
                );
            }
            Err(e) => err = Some(e.clone()),
        }
    }
    if !vals.is_empty() || err.is_some() {
        let mut r = Row::new(
            &scen,
            transport,
            "most RSS a later cycle left over the first",
            &vals,
            Unit::MiB,
        );
        if let Some(st) = &r.stat {
            r.goal = Some(Goal::at_most(st.median, 64.0, false, "<= 64 MiB"));
        }
        r.note = note;
        if let Some(e) = err {
            *failures += 1;
            r.failure = Some(e);
        }
        rows.push(r);
    }
}

/// The RSS the stalled readers add at `--max-queued-mib`, held to 1.25x the cap.
fn pinned_row(runs: &[MemoryRun], sizes: &MemorySizes, rows: &mut Vec<Row>, failures: &mut usize) {
    let transport = Transport::Sse.label();
    let scen = format!(
        "10. Memory, {} stalled readers, --max-queued-mib {}, /burst {} {}",
        sizes.readers, sizes.cap_mib, sizes.burst, sizes.size
    );
    let goal = sizes.cap_mib as f64 * 1.25;
    let mut vals = Vec::new();
    let mut err = None;
    let mut note = String::new();
    for p in runs.iter().filter_map(|r| r.pinned.as_ref()) {
        match p {
            Ok(p) => {
                vals.push(p.added_kib() / 1024.0);
                note = format!(
                    "settled VmRSS once the run settled: {} MiB with the readers stalled (peak {} MiB), {} MiB on a server with no reader",
                    mib(p.with_kib),
                    mib(p.with_peak_kib),
                    mib(p.without_kib)
                );
            }
            Err(e) => err = Some(e.clone()),
        }
    }
    if !vals.is_empty() || err.is_some() {
        let mut r = Row::new(&scen, transport, "RSS the stalled readers add", &vals, Unit::MiB);
        if let Some(st) = &r.stat {
            r.goal = Some(Goal::at_most(
                st.median,
                goal,
                false,
                &format!("<= {goal:.0} MiB (1.25x the cap)"),
            ));
        }
        r.note = note;
        if let Some(e) = err {
            *failures += 1;
            r.failure = Some(e);
        }
        rows.push(r);
    }
}

/// The method paragraph's sentences on this scenario.
pub(crate) fn method(sizes: &MemorySizes) -> String {
    format!(
        "Memory: one server started with `--unload-idle-after 1`; {cycles} times a new session gets {readers} SSE \
readers that read stream_opened and then stop reading, `/burst {burst} {size}`, and once the run settled the readers \
close and the session unloads (ListSessions says it is not loaded); the row is the most VmRSS any later cycle left \
over the first cycle's, every RSS \"settled\" (sampled every 250 ms until four samples in a row lie within 1 MiB, at \
most {settle} s). Pinned: the same burst on two fresh servers with `--max-queued-mib {cap}` and \
`--first-subscriber-wait-ms 0`, one with {readers} stalled readers attached and one with none; the row is the \
difference of their settled VmRSS once the run settled (readers still attached).",
        cycles = sizes.cycles,
        readers = sizes.readers,
        burst = sizes.burst,
        size = sizes.size,
        settle = sizes.settle_max.as_secs(),
        cap = sizes.cap_mib,
    )
}
