//! The bash tool: `sh -c` in the sandbox, in its own process group with a timeout, stdout and stderr read from separate pipes and handed on live as they arrive (batched, bounded), the result keeping the first 1 MiB in the order received.

use super::{bytes, bytes_u64, incomplete_tail, shown, ToolOutput};
use crate::event::OutputStream;
use crate::tools::sandbox::Sandbox;
use serde_json::Value;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// A command's timeout when the call names none, and the most it may name.
pub const DEFAULT_TIMEOUT_SECS: u64 = 120;
pub const MAX_TIMEOUT_SECS: u64 = 600;
/// The most live output one call hands on; past it one note says so and the
/// command runs on (its result still has the first 1 MiB and the count).
pub const LIVE_CAP: usize = 8 << 20;
/// Live output is handed on at once when nothing was for `LIVE_INTERVAL`,
/// else held and merged until then or until `LIVE_CHUNK` bytes are held, so
/// a command that prints byte by byte is a bounded number of events.
pub(super) const LIVE_INTERVAL: Duration = Duration::from_millis(50);
pub(super) const LIVE_CHUNK: usize = 64 * 1024;
/// The note that ends a call's live output at `LIVE_CAP`.
pub const LIVE_STOPPED: &str =
    "\n[live output stopped after 8 MiB; the command runs on and its result follows]\n";

/// A piece of live output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chunk {
    pub stream: OutputStream,
    pub text: String,
}

/// Where a running command's live output goes (the agent publishes it). A
/// full channel holds up reading, and so the command: output is never
/// buffered without bound.
pub type Live = mpsc::Sender<Chunk>;

/// The timeout an input asks for: `timeout` in whole seconds, 1 to 600, or
/// the default when absent.
pub(super) fn timeout(input: &Value) -> Result<Duration, String> {
    match input.get("timeout") {
        None | Some(Value::Null) => Ok(Duration::from_secs(DEFAULT_TIMEOUT_SECS)),
        Some(v) => match v.as_u64() {
            Some(n @ 1..=MAX_TIMEOUT_SECS) => Ok(Duration::from_secs(n)),
            _ => Err(format!(
                "bash `timeout` must be a whole number of seconds from 1 to {MAX_TIMEOUT_SECS}, got {v}"
            )),
        },
    }
}

/// Kills a process group when dropped, unless disarmed: a bash command that
/// is cancelled (or whose run is dropped) takes its children with it.
pub(super) struct ProcessGroup(pub(super) Option<i32>);

impl ProcessGroup {
    pub(super) fn kill(&mut self) {
        if let Some(pgid) = self.0.take() {
            // SAFETY: killpg only sends a signal. The group's leader is our
            // child, so its id is not another group's while the group lives.
            unsafe { libc::killpg(pgid, libc::SIGKILL) };
        }
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Runs `command` with the workspace as working directory, in `sandbox`,
/// killing its whole process group when `cancel` fires or `limit` passes.
/// The result keeps the first `cap` bytes of stdout and stderr in the order
/// they were read, and a note when the sandbox likely stopped it.
pub(super) async fn run(
    workspace: &Path,
    sandbox: &Arc<Sandbox>,
    command: &str,
    limit: Duration,
    cancel: &CancellationToken,
    live: Option<&Live>,
    cap: usize,
) -> ToolOutput {
    let pipes = std::io::pipe().and_then(|o| Ok((o, std::io::pipe()?)));
    let ((out_r, out_w), (err_r, err_w)) = match pipes {
        Ok(p) => p,
        Err(e) => return ToolOutput::err(format!("cannot make pipes for sh: {e}")),
    };
    let receiver = |r: std::io::PipeReader| tokio::net::unix::pipe::Receiver::from_owned_fd(r.into());
    let (out, err) = match (receiver(out_r), receiver(err_r)) {
        (Ok(o), Ok(e)) => (o, e),
        (Err(e), _) | (_, Err(e)) => return ToolOutput::err(format!("cannot read from sh: {e}")),
    };
    let mut cmd = std::process::Command::new("sh");
    cmd.arg("-c")
        .arg(command)
        .current_dir(workspace)
        .stdin(Stdio::null())
        .stdout(out_w)
        .stderr(err_w)
        .process_group(0);
    // Building the sandbox opens folders and makes a directory: off the runtime.
    let (sb, ws) = (sandbox.clone(), workspace.to_path_buf());
    let ready = tokio::task::spawn_blocking(move || {
        let prepared = sb.prepare(&mut cmd, &ws);
        (cmd, prepared)
    })
    .await;
    let (cmd, _prepared) = match ready {
        Ok((cmd, Ok(prepared))) => (cmd, prepared),
        Ok((_, Err(why))) => return ToolOutput::err(why),
        Err(e) => return ToolOutput::err(format!("cannot run sh: {e}")),
    };
    let mut cmd = tokio::process::Command::from(cmd);
    cmd.kill_on_drop(true);
    let spawned = cmd.spawn();
    // The Command (and with it this side's write ends) is dropped here, so
    // each pipe ends when the command and whatever inherited it have closed it.
    drop(cmd);
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => return ToolOutput::err(format!("cannot run sh: {e}")),
    };
    let mut group = ProcessGroup(child.id().and_then(|id| i32::try_from(id).ok()));
    let mut kept = Kept::new(cap);
    let mut feed = Feed::new(live);
    let ended = tokio::select! {
        r = async { tokio::join!(read_both(out, err, &mut kept, &mut feed), child.wait()).1 } => Ok(r),
        _ = cancel.cancelled() => Err(None),
        _ = tokio::time::sleep(limit) => Err(Some(limit)),
    };
    let status = match ended {
        Ok(status) => {
            // Finished on its own: background jobs that let go of the output live on.
            group.0 = None;
            status
        }
        Err(timed_out) => {
            group.kill();
            // SIGKILL cannot be caught: the reap is prompt, but never wait unbounded.
            let _ = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
            feed.flush().await;
            let Some(limit) = timed_out else {
                return ToolOutput::err("cancelled: the command and its process group were killed");
            };
            let mut text = kept.text();
            text.push_str(&format!(
                "\n[timed out after {} s; the command and its process group were killed]",
                limit.as_secs()
            ));
            return ToolOutput::err(text);
        }
    };
    let status = match status {
        Ok(s) => s,
        Err(e) => return ToolOutput::err(format!("cannot wait for sh: {e}")),
    };
    let mut text = kept.text();
    if !status.success() {
        text.push_str(&format!("\n[{status}]"));
        if let Some(note) = sandbox.explain(&text) {
            text.push('\n');
            text.push_str(note);
        }
    }
    ToolOutput {
        ok: status.success(),
        output: text,
        exit_code: status.code(),
    }
}

/// How much one read takes from a pipe (a Linux pipe's default capacity).
const READ: usize = 64 * 1024;

/// Reads both pipes to their ends as they produce, into `kept` and `feed`.
async fn read_both(
    mut out: impl tokio::io::AsyncRead + Unpin,
    mut err: impl tokio::io::AsyncRead + Unpin,
    kept: &mut Kept,
    feed: &mut Feed<'_>,
) {
    let (mut out_buf, mut err_buf) = (vec![0u8; READ], vec![0u8; READ]);
    let (mut out_open, mut err_open) = (true, true);
    while out_open || err_open {
        let due = feed.due();
        let (stream, r) = tokio::select! {
            r = out.read(&mut out_buf), if out_open => (OutputStream::Stdout, r),
            r = err.read(&mut err_buf), if err_open => (OutputStream::Stderr, r),
            _ = tokio::time::sleep_until(due.unwrap_or_else(Instant::now)), if due.is_some() => {
                feed.flush_whole().await;
                continue;
            }
        };
        let buf = match stream {
            OutputStream::Stdout => &out_buf,
            OutputStream::Stderr => &err_buf,
        };
        match r {
            Ok(0) => {}
            Ok(n) => {
                kept.push(&buf[..n]);
                feed.push(stream, &buf[..n]).await;
                continue;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => {}
        }
        match stream {
            OutputStream::Stdout => out_open = false,
            OutputStream::Stderr => err_open = false,
        }
    }
    feed.flush().await;
}

/// The output a result shows: its first `cap` bytes as read, and how many
/// there were in all (the rest is read and dropped, so a command never
/// stalls on a full pipe). Holds at most `cap` bytes.
pub(super) struct Kept {
    bytes: Vec<u8>,
    total: u64,
    cap: usize,
}

impl Kept {
    pub(super) fn new(cap: usize) -> Kept {
        Kept {
            bytes: Vec::new(),
            total: 0,
            cap,
        }
    }

    pub(super) fn push(&mut self, b: &[u8]) {
        self.total += b.len() as u64;
        let take = b.len().min(self.cap - self.bytes.len());
        if take > 0 {
            // Grow by doubling, but never past the cap.
            if self.bytes.capacity() - self.bytes.len() < take {
                let want = (self.bytes.capacity() * 2)
                    .max(self.bytes.len() + take)
                    .min(self.cap);
                self.bytes.reserve_exact(want - self.bytes.len());
            }
            self.bytes.extend_from_slice(&b[..take]);
        }
    }

    /// The kept output as text, with a note when some was cut.
    pub(super) fn text(&mut self) -> String {
        let total = self.total;
        let more = total > self.bytes.len() as u64;
        let (mut text, shown) = shown(std::mem::take(&mut self.bytes), self.cap, more);
        if (shown as u64) < total {
            text.push_str(&format!(
                "\n[output truncated: {} of {} cut; this is the first {}]",
                total - shown as u64,
                bytes_u64(total),
                bytes(shown)
            ));
        }
        text
    }
}

/// Live output on its way out: held per stream between hand-ons (so at most
/// one chunk per stream per `LIVE_INTERVAL`, or per `LIVE_CHUNK` bytes), a
/// character split between reads kept back until it is whole, and nothing
/// past `LIVE_CAP` but one note.
struct Feed<'a> {
    live: Option<&'a Live>,
    /// Held bytes per stream (stdout, stderr), in the order they first arrived.
    held: Vec<(OutputStream, Vec<u8>)>,
    /// Bytes accepted so far (held or handed on).
    accepted: usize,
    stopped: bool,
    last: Option<Instant>,
}

impl<'a> Feed<'a> {
    fn new(live: Option<&'a Live>) -> Feed<'a> {
        Feed {
            live,
            held: Vec::new(),
            accepted: 0,
            stopped: live.is_none(),
            last: None,
        }
    }

    /// When what is held is due, if anything is (a character still
    /// incomplete waits for its end, not for the clock).
    fn due(&self) -> Option<Instant> {
        let held = self.held.iter().any(|(_, b)| b.len() > incomplete_tail(b));
        match (held, self.last) {
            (true, Some(last)) => Some(last + LIVE_INTERVAL),
            (true, None) => Some(Instant::now()),
            _ => None,
        }
    }

    async fn push(&mut self, stream: OutputStream, b: &[u8]) {
        if self.stopped {
            return;
        }
        let take = b.len().min(LIVE_CAP - self.accepted);
        self.accepted += take;
        match self.held.iter_mut().find(|(s, _)| *s == stream) {
            Some((_, held)) => held.extend_from_slice(&b[..take]),
            None => self.held.push((stream, b[..take].to_vec())),
        }
        if take < b.len() {
            // Whole characters only: what a cut left incomplete is dropped.
            self.flush_whole().await;
            self.held.clear();
            self.stopped = true;
            self.send(stream, LIVE_STOPPED.to_string()).await;
            return;
        }
        let held: usize = self.held.iter().map(|(_, b)| b.len()).sum();
        let idle = self.last.is_none_or(|l| l.elapsed() >= LIVE_INTERVAL);
        if idle || held >= LIVE_CHUNK {
            self.flush_whole().await;
        }
    }

    /// Hands on what is held, keeping back a character a stream has not
    /// finished yet.
    async fn flush_whole(&mut self) {
        self.last = Some(Instant::now());
        for i in 0..self.held.len() {
            let (stream, held) = &mut self.held[i];
            let keep = incomplete_tail(held);
            let whole: Vec<u8> = held.drain(..held.len() - keep).collect();
            let stream = *stream;
            if !whole.is_empty() {
                self.send(stream, String::from_utf8_lossy(&whole).into_owned())
                    .await;
            }
        }
        self.held.retain(|(_, b)| !b.is_empty());
    }

    /// Hands on everything held (the command is over).
    async fn flush(&mut self) {
        self.last = Some(Instant::now());
        for (stream, held) in std::mem::take(&mut self.held) {
            if !held.is_empty() {
                self.send(stream, String::from_utf8_lossy(&held).into_owned())
                    .await;
            }
        }
    }

    async fn send(&self, stream: OutputStream, text: String) {
        if let Some(live) = self.live {
            // A closed channel: nobody listens; the result still counts.
            let _ = live.send(Chunk { stream, text }).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    async fn sh(command: &str, cap: usize) -> ToolOutput {
        let ws = tempfile::tempdir().unwrap();
        let limit = Duration::from_secs(60);
        let off = Arc::new(Sandbox::off());
        run(
            ws.path(),
            &off,
            command,
            limit,
            &CancellationToken::new(),
            None,
            cap,
        )
        .await
    }

    /// Runs `command` and returns its result and the live chunks it handed on.
    async fn sh_live(command: &str, limit: Duration) -> (ToolOutput, Vec<Chunk>) {
        let ws = tempfile::tempdir().unwrap();
        let (tx, mut rx) = mpsc::channel(4);
        let collect = async {
            let mut got = Vec::new();
            while let Some(c) = rx.recv().await {
                got.push(c);
            }
            got
        };
        let cancel = CancellationToken::new();
        let off = Arc::new(Sandbox::off());
        let task = async move { run(ws.path(), &off, command, limit, &cancel, Some(&tx), 1 << 20).await };
        tokio::join!(task, collect)
    }

    fn joined(chunks: &[Chunk], stream: OutputStream) -> String {
        chunks
            .iter()
            .filter(|c| c.stream == stream)
            .map(|c| c.text.as_str())
            .collect()
    }

    #[test]
    fn a_timeout_is_whole_seconds_up_to_the_cap() {
        let t = |v: Value| timeout(&json!({ "command": "x", "timeout": v }));
        assert_eq!(timeout(&json!({"command": "x"})), Ok(Duration::from_secs(120)));
        assert_eq!(t(json!(5)), Ok(Duration::from_secs(5)));
        assert_eq!(t(json!(600)), Ok(Duration::from_secs(600)));
        for bad in [
            json!(0),
            json!(601),
            json!(-1),
            json!(1.5),
            json!("5"),
            json!(true),
        ] {
            let e = t(bad.clone()).unwrap_err();
            assert!(
                e.starts_with("bash `timeout` must be a whole number of seconds from 1 to 600"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn kept_output_holds_at_most_its_cap_and_counts_the_rest() {
        let cap = 100_000; // not a power of two: growth must stop at the cap
        let mut k = Kept::new(cap);
        for _ in 0..1000 {
            k.push(&[b'x'; 10_000]);
        }
        assert_eq!((k.bytes.len(), k.total), (cap, 10_000_000));
        assert!(k.bytes.capacity() <= cap, "capacity {}", k.bytes.capacity());
    }

    #[tokio::test]
    async fn stdout_and_stderr_share_one_cap() {
        let r = sh("printf abcdef; printf ghijklmnop >&2", 10).await;
        let note = "\n[output truncated: 6 of 16 bytes cut; this is the first 10 bytes]";
        assert!(r.ok && r.output.ends_with(note), "{r:?}");
        assert_eq!(r.output.len(), 10 + note.len());
        let r = sh("printf abc; printf def >&2", 10).await;
        assert!(r.output == "abcdef" || r.output == "defabc", "{r:?}");
        let r = sh(
            "head -c 1000000 /dev/zero | tr '\\0' x; echo oops >&2; exit 4",
            10,
        )
        .await;
        assert_eq!(
            r,
            ToolOutput {
                exit_code: Some(4),
                ..ToolOutput::err(
                    "xxxxxxxxxx\n[output truncated: 999995 of 1000005 bytes cut; this is the first 10 bytes]\n[exit status: 4]"
                )
            }
        );
    }

    #[tokio::test]
    async fn a_cut_never_splits_a_character_and_invalid_output_is_lossy() {
        let r = sh("printf 'abc\\303\\251'", 4).await;
        let exited = |out: ToolOutput| ToolOutput {
            exit_code: Some(0),
            ..out
        };
        assert_eq!(
            r,
            exited(ToolOutput::ok(
                "abc\n[output truncated: 2 of 5 bytes cut; this is the first 3 bytes]"
            ))
        );
        assert_eq!(
            sh("printf 'a\\377b'", 10).await,
            exited(ToolOutput::ok("a\u{FFFD}b"))
        );
        // Ten invalid bytes would be thirty bytes of U+FFFD: three fit in 10.
        let r = sh("printf '\\377\\377\\377\\377\\377\\377\\377\\377\\377\\377'", 10).await;
        assert_eq!(
            r,
            exited(ToolOutput::ok(
                "\u{FFFD}\u{FFFD}\u{FFFD}\n[output truncated: 7 of 10 bytes cut; this is the first 3 bytes]"
            ))
        );
    }

    #[tokio::test]
    async fn live_output_is_tagged_by_stream_and_adds_up_to_the_result() {
        let (r, chunks) = sh_live(
            "for i in 1 2 3; do echo out$i; echo err$i >&2; done; printf 'caf\\303'; printf '\\251'",
            Duration::from_secs(60),
        )
        .await;
        assert!(r.ok, "{r:?}");
        assert_eq!(joined(&chunks, OutputStream::Stdout), "out1\nout2\nout3\ncafé");
        assert_eq!(joined(&chunks, OutputStream::Stderr), "err1\nerr2\nerr3\n");
        // The result has every byte, each stream in its order.
        let mut o = String::new();
        let mut e = String::new();
        for c in &chunks {
            if c.stream == OutputStream::Stdout {
                o.push_str(&c.text)
            } else {
                e.push_str(&c.text)
            }
        }
        assert_eq!(r.output.len(), o.len() + e.len());
    }

    #[tokio::test(start_paused = true)]
    async fn a_character_split_between_reads_is_handed_on_whole() {
        let (tx, mut rx) = mpsc::channel(16);
        let mut feed = Feed::new(Some(&tx));
        feed.push(OutputStream::Stdout, b"caf\xc3").await;
        assert_eq!(
            rx.try_recv().unwrap().text,
            "caf",
            "at once, without the half character"
        );
        tokio::time::advance(LIVE_INTERVAL * 3).await;
        assert_eq!(feed.due(), None, "half a character is not due");
        feed.push(OutputStream::Stdout, b"\xa9!").await;
        assert_eq!(rx.try_recv().unwrap().text, "é!");
        // Within the interval output is held, then handed on merged.
        feed.push(OutputStream::Stderr, b"a").await;
        feed.push(OutputStream::Stderr, b"b").await;
        assert!(rx.try_recv().is_err());
        assert_eq!(feed.due(), Some(feed.last.unwrap() + LIVE_INTERVAL));
        tokio::time::advance(LIVE_INTERVAL).await;
        feed.flush_whole().await;
        let c = rx.try_recv().unwrap();
        assert_eq!((c.stream, c.text.as_str()), (OutputStream::Stderr, "ab"));
    }

    #[tokio::test]
    async fn live_output_stops_at_its_cap_with_one_note_and_the_command_runs_on() {
        let (r, chunks) = sh_live(
            "head -c 20000000 /dev/zero | tr '\\0' y; echo done >&2",
            Duration::from_secs(60),
        )
        .await;
        assert!(r.ok, "{r:?}");
        let out = joined(&chunks, OutputStream::Stdout);
        assert_eq!(out.len(), LIVE_CAP + LIVE_STOPPED.len());
        assert!(out.ends_with(LIVE_STOPPED));
        assert_eq!(chunks.iter().filter(|c| c.text == LIVE_STOPPED).count(), 1);
        assert!(
            !chunks.iter().any(|c| c.text == "done\n"),
            "nothing live after the note"
        );
        // Batched: 8 MiB is hundreds of chunks, not tens of thousands.
        assert!(chunks.len() < 2_000, "{} chunks", chunks.len());
        assert!(
            r.output.ends_with(
                "[output truncated: 18951429 of 20000005 bytes cut; this is the first 1048576 bytes]"
            ),
            "{}",
            &r.output[r.output.len() - 200..]
        );
    }

    #[tokio::test]
    async fn a_command_past_its_timeout_is_killed_with_its_group_and_says_so() {
        let (r, chunks) = sh_live("echo started; sleep 30 & wait", Duration::from_secs(1)).await;
        assert!(!r.ok);
        assert_eq!(
            r.output,
            "started\n\n[timed out after 1 s; the command and its process group were killed]"
        );
        assert_eq!(joined(&chunks, OutputStream::Stdout), "started\n");
    }
}
