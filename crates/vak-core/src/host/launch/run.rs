//! One running dev server: `sh -c` in its own process group, its output read line by line into a bounded ring and batched to the session, its exit recorded, and its group stopped with SIGTERM then SIGKILL.

use crate::error::{Error, Result};
use crate::event::{ClientEvent, OutputStream};
use crate::session::live::Session;
use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::{mpsc, oneshot, watch};

/// The most lines the ring keeps.
pub const MAX_LINES: usize = 1000;
/// The most bytes of text the ring keeps.
pub const MAX_BYTES: usize = 256 << 10;
/// The longest line kept; a longer one is cut into pieces of this size.
pub const MAX_LINE: usize = 8 << 10;
/// The most bytes of output published as events per start.
pub const MAX_PUBLISHED: usize = 8 << 20;
/// The most text in one published event.
const MAX_BATCH: usize = 64 << 10;
/// Reads' worth of lines in flight between the readers and the publisher.
const LIVE_QUEUE: usize = 16;
/// How long a stopped group has between SIGTERM and SIGKILL.
pub const STOP_GRACE: Duration = Duration::from_secs(5);

/// Finds the loaded session a dev server's output goes to (None: nobody
/// follows it now; the ring still keeps the lines).
pub type Sink = Arc<dyn Fn(&str) -> Option<Arc<Session>> + Send + Sync>;

/// The latest output lines of one run.
#[derive(Default)]
pub struct Ring {
    lines: VecDeque<(OutputStream, String)>,
    bytes: usize,
    /// Lines that fell out of the ring.
    pub dropped: u64,
}

impl Ring {
    pub fn push(&mut self, stream: OutputStream, text: String) {
        self.bytes += text.len();
        self.lines.push_back((stream, text));
        while self.lines.len() > MAX_LINES || self.bytes > MAX_BYTES {
            let Some((_, old)) = self.lines.pop_front() else {
                break;
            };
            self.bytes -= old.len();
            self.dropped += 1;
        }
    }

    /// The last `tail` lines (all of them when 0).
    pub fn tail(&self, tail: usize) -> Vec<(OutputStream, String)> {
        let skip = if tail == 0 {
            0
        } else {
            self.lines.len().saturating_sub(tail)
        };
        self.lines.iter().skip(skip).cloned().collect()
    }
}

/// What a run is now.
#[derive(Clone, Debug, Default)]
pub struct Status {
    pub running: bool,
    /// The exit code when it ended by itself (None when stopped or killed by a signal).
    pub exit_code: Option<i32>,
}

/// What `start` needs.
pub struct Spec {
    pub session_id: String,
    pub name: String,
    pub command: String,
    pub dir: PathBuf,
    pub env: BTreeMap<String, String>,
    /// Variables the process does not inherit from the server.
    pub withheld: Vec<String>,
}

/// A started run: its handle for stopping and its shared state.
pub struct Run {
    pub pid: u32,
    pub started_at: String,
    pub ring: Arc<Mutex<Ring>>,
    /// `running` turns false once the leader is reaped.
    pub status: watch::Receiver<Status>,
    stop: Mutex<Option<oneshot::Sender<()>>>,
}

impl Run {
    /// Asks the run to stop (SIGTERM to the group, SIGKILL after
    /// STOP_GRACE) and waits until its leader is reaped. Returns whether it
    /// was still running.
    pub async fn stop(&self) -> bool {
        let was_running = self.status.borrow().running;
        if let Some(tx) = lock(&self.stop).take() {
            let _ = tx.send(());
        }
        let mut rx = self.status.clone();
        let _ = rx.wait_for(|s| !s.running).await;
        was_running
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Signals the process group `pgid`; a gone group is not an error.
fn kill_group(pgid: u32, sig: libc::c_int) {
    if pgid == 0 {
        return;
    }
    // SAFETY: killpg only sends a signal; pgid is a group this server made.
    unsafe {
        libc::killpg(pgid as libc::pid_t, sig);
    }
}

/// Kills the group when dropped (the supervising task aborted by a runtime
/// that goes away): no dev server outlives its owner.
struct GroupGuard(u32);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        kill_group(self.0, libc::SIGKILL);
    }
}

/// Starts `spec` and returns its run; the supervising task, the readers
/// and the publisher run until the group is gone.
pub fn start(spec: Spec, sink: Sink) -> Result<Run> {
    let mut cmd = tokio::process::Command::new("/bin/sh");
    cmd.arg("-c")
        .arg(&spec.command)
        .current_dir(&spec.dir)
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for k in &spec.withheld {
        cmd.env_remove(k);
    }
    cmd.envs(&spec.env);
    let mut child = cmd
        .spawn()
        .map_err(|e| Error::internal(format!("cannot start {}: {e}", spec.name)))?;
    let pid = child.id().unwrap_or(0);
    let guard = GroupGuard(pid);
    let (Some(out), Some(err)) = (child.stdout.take(), child.stderr.take()) else {
        return Err(Error::internal("the dev server's pipes are missing"));
    };
    let ring = Arc::new(Mutex::new(Ring::default()));
    let (status_tx, status) = watch::channel(Status {
        running: true,
        exit_code: None,
    });
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let (live_tx, live_rx) = mpsc::channel::<Lines>(LIVE_QUEUE);
    let readers = [
        tokio::spawn(read_lines(
            out,
            OutputStream::Stdout,
            ring.clone(),
            live_tx.clone(),
        )),
        tokio::spawn(read_lines(err, OutputStream::Stderr, ring.clone(), live_tx)),
    ];
    tokio::spawn(publish(spec.session_id.clone(), spec.name.clone(), live_rx, sink));
    let name = spec.name.clone();
    tokio::spawn(async move {
        let _guard = guard;
        let stopped = tokio::select! {
            r = child.wait() => Err(r),
            _ = stop_rx => Ok(()),
        };
        let exit_code = match stopped {
            Err(r) => r.ok().and_then(|s| s.code()),
            Ok(()) => {
                kill_group(pid, libc::SIGTERM);
                if tokio::time::timeout(STOP_GRACE, child.wait()).await.is_err() {
                    tracing::info!(
                        name,
                        pid,
                        "the dev server did not stop on SIGTERM; killing its group"
                    );
                    kill_group(pid, libc::SIGKILL);
                    let _ = child.wait().await;
                }
                None
            }
        };
        // Whatever of the group is left goes with its leader (and lets the
        // readers see the end of their pipes).
        kill_group(pid, libc::SIGKILL);
        for r in readers {
            let _ = r.await;
        }
        tracing::debug!(name, pid, ?exit_code, "dev server ended");
        let _ = status_tx.send(Status {
            running: false,
            exit_code,
        });
    });
    Ok(Run {
        pid,
        started_at: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
        ring,
        status,
        stop: Mutex::new(Some(stop_tx)),
    })
}

/// What one read of a pipe completed: its lines.
type Lines = (OutputStream, Vec<String>);

/// Reads `pipe` line by line (a line over MAX_LINE is cut) into the ring
/// and on to the publisher, the lines of one read together. A full queue
/// holds the reader (and the dev server's writes) up; the publisher never
/// waits on the session, so it drains as fast as it is scheduled.
async fn read_lines(
    mut pipe: impl AsyncRead + Unpin,
    stream: OutputStream,
    ring: Arc<Mutex<Ring>>,
    live: mpsc::Sender<Lines>,
) {
    let mut buf = vec![0u8; 16 << 10];
    let mut line: Vec<u8> = Vec::new();
    let mut live = Some(live);
    loop {
        let n = match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => 0,
            Ok(n) => n,
        };
        let mut done = Vec::new();
        for &b in &buf[..n] {
            if b == b'\n' {
                done.push(String::from_utf8_lossy(&line).into_owned());
                line.clear();
            } else {
                line.push(b);
                if line.len() >= MAX_LINE {
                    done.push(String::from_utf8_lossy(&line).into_owned());
                    line.clear();
                }
            }
        }
        if n == 0 && !line.is_empty() {
            done.push(String::from_utf8_lossy(&line).into_owned());
        }
        if !done.is_empty() {
            {
                let mut ring = lock(&ring);
                for l in &done {
                    ring.push(stream, l.clone());
                }
            }
            if let Some(tx) = &live {
                if tx.send((stream, done)).await.is_err() {
                    live = None;
                }
            }
        }
        if n == 0 {
            return;
        }
    }
}

/// Publishes lines as `launch_output` events: whatever arrived together,
/// one event per stream run, at most MAX_PUBLISHED bytes per start (then
/// it goes on draining, so the readers never wait for it).
async fn publish(session_id: String, name: String, mut lines: mpsc::Receiver<Lines>, sink: Sink) {
    let mut sent = 0usize;
    while let Some(first) = lines.recv().await {
        let mut batch = vec![first];
        let mut size: usize = batch[0].1.iter().map(|l| l.len() + 1).sum();
        while size < MAX_BATCH {
            match lines.try_recv() {
                Ok(l) => {
                    size += l.1.iter().map(|l| l.len() + 1).sum::<usize>();
                    batch.push(l);
                }
                Err(_) => break,
            }
        }
        if sent >= MAX_PUBLISHED {
            continue;
        }
        let Some(session) = sink(&session_id) else {
            continue;
        };
        let mut events: Vec<(OutputStream, String)> = Vec::new();
        for (stream, texts) in batch {
            let text: String = texts.into_iter().map(|t| t + "\n").collect();
            match events.last_mut() {
                Some((s, t)) if *s == stream => t.push_str(&text),
                _ => events.push((stream, text)),
            }
        }
        for (stream, text) in events {
            sent += text.len();
            session.publish(ClientEvent::LaunchOutput {
                name: name.clone(),
                stream,
                text,
            });
            if sent >= MAX_PUBLISHED {
                session.publish(ClientEvent::LaunchOutput {
                    name: name.clone(),
                    stream: OutputStream::Stderr,
                    text: format!(
                        "[vak: {name} printed more than {} MiB since it started; the rest is only in its logs]\n",
                        MAX_PUBLISHED >> 20
                    ),
                });
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_keeps_the_latest_lines_within_both_bounds() {
        let mut r = Ring::default();
        for i in 0..1500 {
            r.push(OutputStream::Stdout, format!("{i}"));
        }
        assert_eq!(r.tail(0).len(), MAX_LINES);
        assert_eq!(r.dropped, 500);
        assert_eq!(
            r.tail(2),
            [
                (OutputStream::Stdout, "1498".into()),
                (OutputStream::Stdout, "1499".into())
            ]
        );
        let mut r = Ring::default();
        for _ in 0..100 {
            r.push(OutputStream::Stderr, "x".repeat(8 << 10));
        }
        assert_eq!(r.tail(0).len(), MAX_BYTES / (8 << 10));
        assert_eq!(r.dropped, 100 - (MAX_BYTES / (8 << 10)) as u64);
    }
}
