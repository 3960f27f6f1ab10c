//! The realistic-load floor: a process of its own (this binary re-executed) where one thread paces S sessions' deltas at R per second to K SSE sockets each, writing each delta to its sockets when it is due (no runtime, no bus, no HTTP library): what S x R x K small socket writes a second cost on this machine's loopback TCP before vak costs anything.

use crate::floor::{chunk, open, Conn, SESSION};
use std::io::{self, Write};
use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, BufReader};
use vak_proto::sse;

/// After the last reader is accepted, pacing starts this much later: the
/// bench sees every stream_opened by then.
pub(crate) const LEAD: Duration = Duration::from_millis(500);
/// The floor gives up on readers that never all connect.
const ACCEPT_FOR: Duration = Duration::from_secs(300);

/// What the floor process paces: `sessions` x `readers` sockets, `deltas`
/// per session at `rate` per second, the sessions' first deltas spread over
/// one period 1/R as vak's realistic runs spread theirs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Plan {
    pub sessions: usize,
    pub readers: usize,
    pub deltas: u64,
    pub rate: u64,
}

impl Plan {
    /// Event `k` of the whole run (sessions interleaved in their phase
    /// order): its session, its index in that session, and when it is due
    /// after the start.
    pub(crate) fn event(&self, k: u64) -> (usize, u64, Duration) {
        let s = self.sessions.max(1) as u64;
        let due = Duration::from_secs_f64(k as f64 / (s as f64 * self.rate.max(1) as f64));
        ((k % s) as usize, k / s, due)
    }

    pub(crate) fn events(&self) -> u64 {
        self.sessions as u64 * self.deltas
    }
}

/// The running floor process: its address and pid (the bench samples its CPU and RSS like a server's).
pub(crate) struct FloorProcess {
    child: tokio::process::Child,
    /// Closed by `finish`: the floor stays (its RSS readable) until then.
    stdin: Option<tokio::process::ChildStdin>,
    pub addr: SocketAddr,
    pub pid: u32,
}

impl FloorProcess {
    pub(crate) async fn start(exe: &std::path::Path, plan: Plan) -> Result<FloorProcess, String> {
        let mut child = tokio::process::Command::new(exe)
            .arg("load-floor-server")
            .args(["--sessions", &plan.sessions.to_string()])
            .args(["--readers", &plan.readers.to_string()])
            .args(["--deltas", &plan.deltas.to_string()])
            .args(["--rate", &plan.rate.to_string()])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("the load floor did not start: {e}"))?;
        let pid = child.id().ok_or("the load floor exited at once")?;
        let out = child.stdout.take().ok_or("no stdout")?;
        let mut lines = BufReader::new(out).lines();
        let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .map_err(|_| "the load floor did not announce itself within 30 s".to_string())?
            .map_err(|e| e.to_string())?
            .ok_or("the load floor exited at startup")?;
        let addr = line
            .rsplit_once("listening on http://")
            .map(|(_, a)| a.trim().to_string())
            .ok_or_else(|| format!("unexpected line {line:?}"))?;
        let addr = addr.parse().map_err(|e| format!("bad address {addr:?}: {e}"))?;
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let stdin = child.stdin.take();
        Ok(FloorProcess {
            child,
            stdin,
            addr,
            pid,
        })
    }

    /// Tells the floor to exit once its run is over and waits for it; its
    /// error, if it failed.
    pub(crate) async fn finish(mut self, within: Duration) -> Result<(), String> {
        drop(self.stdin.take());
        match tokio::time::timeout(within, self.child.wait()).await {
            Ok(Ok(s)) if s.success() => Ok(()),
            Ok(Ok(s)) => Err(format!("the load floor failed: {s}")),
            Ok(Err(e)) => Err(format!("the load floor: {e}")),
            Err(_) => {
                let _ = self.child.kill().await;
                Err("the load floor did not finish".into())
            }
        }
    }
}

/// `vak-bench load-floor-server`: accepts the plan's readers, paces the run
/// to them, and once every socket has had everything exits when stdin closes.
pub(crate) fn serve(plan: Plan) -> Result<(), String> {
    crate::machine::raise_nofile();
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("bind: {e}"))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    println!("load floor: listening on http://{addr}");
    let _ = io::stdout().flush();
    let opened = crate::floor::opened();
    let want = plan.sessions * plan.readers;
    let mut conns: Vec<Conn> = Vec::with_capacity(want);
    let deadline = Instant::now() + ACCEPT_FOR;
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("listen: {e}"))?;
    while conns.len() < want {
        match listener.accept() {
            Ok((tcp, _)) => conns.push(open(tcp, &opened).map_err(|e| format!("accept: {e}"))?),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if Instant::now() > deadline {
                    return Err(format!("{} of {want} readers connected", conns.len()));
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => return Err(format!("accept: {e}")),
        }
    }
    std::thread::sleep(LEAD);
    pace(&plan, &mut conns, Instant::now())?;
    // The bench reads this process's peak RSS before it lets it go: until
    // the bench closes stdin.
    let _ = io::copy(&mut io::stdin().lock(), &mut io::sink());
    Ok(())
}

/// Writes every event when it is due to its session's sockets (socket i is
/// session i / K's), then run_finished to all, until every socket has all.
fn pace(plan: &Plan, conns: &mut [Conn], t0: Instant) -> Result<(), String> {
    let total = plan.events();
    let mut k = 0u64;
    // Sockets with bytes a full send buffer did not take yet.
    let mut behind: Vec<usize> = Vec::new();
    let mut frame = bytes::BytesMut::new();
    let mut wire = Vec::new();
    while k < total {
        let now = Instant::now();
        let mut wrote = false;
        while k < total {
            let (s, j, due) = plan.event(k);
            if t0 + due > now {
                break;
            }
            let seq = j + 2;
            let micros = crate::clients::unix_micros();
            let json = format!(
                "{{\"seq\":{seq},\"session_id\":\"{SESSION}\",\"text_delta\":{{\"text\":\"p{j}@{micros} \"}}}}"
            );
            frame.clear();
            sse::write_frame(&mut frame, "text_delta", Some(&seq.to_string()), json.as_bytes());
            wire.clear();
            chunk(&mut wire, &frame);
            let first = s * plan.readers;
            for (c, conn) in conns[first..first + plan.readers].iter_mut().enumerate() {
                give(conn, &wire, first + c, &mut behind)?;
            }
            k += 1;
            wrote = true;
        }
        retry(conns, &mut behind)?;
        if !wrote && k < total {
            // Never spin: sleep until the next event is due (the kernel's
            // timer slack rounds a short sleep up to about 50 us, and the
            // events due meanwhile go out together on waking).
            let (_, _, due) = plan.event(k);
            let wait = (t0 + due).saturating_duration_since(Instant::now());
            std::thread::sleep(wait.min(Duration::from_millis(1)));
        }
    }
    let mut last = Vec::new();
    chunk(
        &mut last,
        &sse::frame(
            "run_finished",
            None,
            format!("{{\"session_id\":\"{SESSION}\"}}").as_bytes(),
        ),
    );
    for (c, conn) in conns.iter_mut().enumerate() {
        give(conn, &last, c, &mut behind)?;
    }
    while !behind.is_empty() {
        retry(conns, &mut behind)?;
        if !behind.is_empty() {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    Ok(())
}

/// Writes `bytes` to `c` now, or queues them behind what it has not taken.
fn give(c: &mut Conn, bytes: &[u8], at: usize, behind: &mut Vec<usize>) -> Result<(), String> {
    if !c.out.is_empty() {
        c.out.extend_from_slice(bytes);
        return Ok(());
    }
    let k = match c.tcp.write(bytes) {
        Ok(k) => k,
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
        Err(e) => return Err(format!("write: {e}")),
    };
    if k < bytes.len() {
        c.out.extend_from_slice(&bytes[k..]);
        behind.push(at);
    }
    Ok(())
}

/// Writes what the sockets behind have queued, as far as they take it.
fn retry(conns: &mut [Conn], behind: &mut Vec<usize>) -> Result<(), String> {
    let mut err = None;
    behind.retain(|&i| {
        let c = &mut conns[i];
        match c.tcp.write(&c.out) {
            Ok(k) => {
                c.out.drain(..k);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => err = Some(format!("write: {e}")),
        }
        !c.out.is_empty()
    });
    err.map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_interleave_the_sessions_and_are_due_evenly() {
        let p = Plan {
            sessions: 4,
            readers: 2,
            deltas: 3,
            rate: 50,
        };
        assert_eq!(p.events(), 12);
        // 4 sessions at 50/s: one event every 5 ms, session by session.
        assert_eq!(p.event(0), (0, 0, Duration::ZERO));
        assert_eq!(p.event(1), (1, 0, Duration::from_millis(5)));
        assert_eq!(p.event(4).0, 0);
        assert_eq!(p.event(4).1, 1);
        // A session's own deltas are 1/R apart.
        let gap = p.event(6).2 - p.event(2).2;
        assert!((gap.as_secs_f64() - 0.02).abs() < 1e-9, "{gap:?}");
    }
}
