//! A command handed a document on stdin whose stdout and stderr are kept apart (a lifecycle hook): bash's `sh -c`, sandbox, process group, timeout and output cap, without live output.

use super::bash::{Kept, ProcessGroup};
use crate::tools::sandbox::Sandbox;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

/// How a piped command ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Ended {
    /// It exited with this code.
    Exited(i32),
    /// A signal ended it (its description).
    Signalled(String),
    /// Past its time: it was killed with its process group.
    TimedOut,
    /// Its caller was cancelled: it was killed with its process group.
    Cancelled,
    /// It never ran (why).
    NotStarted(String),
}

/// What a piped command did: how it ended and its output, each stream kept
/// to its cap (with a note when cut).
#[derive(Clone, Debug)]
pub(crate) struct Piped {
    pub(crate) ended: Ended,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

impl Piped {
    fn not_started(why: String) -> Piped {
        Piped {
            ended: Ended::NotStarted(why),
            stdout: String::new(),
            stderr: String::new(),
        }
    }
}

/// Runs `command` with the workspace as working directory, in `sandbox`,
/// `input` written to its stdin (a command that does not read it is not
/// held up by it), killing its whole process group when `cancel` fires or
/// `limit` passes. Each of stdout and stderr keeps its first `cap` bytes.
pub(crate) async fn run(
    workspace: &Path,
    sandbox: &Arc<Sandbox>,
    command: &str,
    input: Vec<u8>,
    limit: Duration,
    cancel: &CancellationToken,
    cap: usize,
) -> Piped {
    let mut cmd = std::process::Command::new("sh");
    cmd.arg("-c")
        .arg(command)
        .current_dir(workspace)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
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
        Ok((_, Err(why))) => return Piped::not_started(why),
        Err(e) => return Piped::not_started(format!("cannot run sh: {e}")),
    };
    let mut cmd = tokio::process::Command::from(cmd);
    cmd.kill_on_drop(true);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return Piped::not_started(format!("cannot run sh: {e}")),
    };
    let mut group = ProcessGroup(child.id().and_then(|id| i32::try_from(id).ok()));
    let (stdin, stdout, stderr) = (child.stdin.take(), child.stdout.take(), child.stderr.take());
    let (mut out, mut err) = (Kept::new(cap), Kept::new(cap));
    let feed = async move {
        if let Some(mut stdin) = stdin {
            // A command that exits without reading gives a broken pipe: fine.
            let _ = stdin.write_all(&input).await;
        }
    };
    let ended = tokio::select! {
        r = async {
            tokio::join!(feed, drain(stdout, &mut out), drain(stderr, &mut err), child.wait()).3
        } => Ok(r),
        _ = cancel.cancelled() => Err(Ended::Cancelled),
        _ = tokio::time::sleep(limit) => Err(Ended::TimedOut),
    };
    let ended = match ended {
        Ok(Ok(status)) => {
            // Finished on its own: background jobs that let go of the output live on, as with bash.
            group.0 = None;
            match status.code() {
                Some(code) => Ended::Exited(code),
                None => Ended::Signalled(status.to_string()),
            }
        }
        Ok(Err(e)) => Ended::NotStarted(format!("cannot wait for sh: {e}")),
        Err(why) => {
            group.kill();
            // SIGKILL cannot be caught: the reap is prompt, but never wait unbounded.
            let _ = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
            why
        }
    };
    Piped {
        ended,
        stdout: out.text(),
        stderr: err.text(),
    }
}

/// Reads `r` to its end into `kept` (past the cap the rest is read and dropped).
async fn drain(r: Option<impl AsyncRead + Unpin>, kept: &mut Kept) {
    let Some(mut r) = r else { return };
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match r.read(&mut buf).await {
            Ok(0) => return,
            Ok(n) => kept.push(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn piped(command: &str, input: &str, limit: Duration) -> Piped {
        let ws = tempfile::tempdir().unwrap();
        let cancel = CancellationToken::new();
        run(
            ws.path(),
            &Arc::new(Sandbox::off()),
            command,
            input.as_bytes().to_vec(),
            limit,
            &cancel,
            64,
        )
        .await
    }

    #[tokio::test]
    async fn stdin_is_handed_over_and_the_streams_and_code_come_back_apart() {
        let p = piped("cat; echo oops >&2; exit 2", "{\"a\":1}", Duration::from_secs(30)).await;
        assert_eq!(p.ended, Ended::Exited(2));
        assert_eq!((p.stdout.as_str(), p.stderr.as_str()), ("{\"a\":1}", "oops\n"));
        // A command that never reads a large input is not held up by it.
        let big = "x".repeat(1 << 20);
        let p = piped("echo done", &big, Duration::from_secs(30)).await;
        assert_eq!((p.ended, p.stdout.as_str()), (Ended::Exited(0), "done\n"));
        // Each stream keeps its cap.
        let p = piped("head -c 1000 /dev/zero | tr '\\0' y", "", Duration::from_secs(30)).await;
        assert!(
            p.stdout.starts_with(&"y".repeat(64)) && p.stdout.contains("truncated"),
            "{}",
            p.stdout
        );
    }

    #[tokio::test]
    async fn a_command_past_its_time_is_killed_with_its_group() {
        let ws = tempfile::tempdir().unwrap();
        let pidfile = ws.path().join("pid");
        let cmd = format!("sleep 1000 & echo $! > {}; wait", pidfile.display());
        let cancel = CancellationToken::new();
        let p = run(
            ws.path(),
            &Arc::new(Sandbox::off()),
            &cmd,
            Vec::new(),
            Duration::from_secs(2),
            &cancel,
            64,
        )
        .await;
        assert_eq!(p.ended, Ended::TimedOut);
        let pid: i32 = std::fs::read_to_string(&pidfile).unwrap().trim().parse().unwrap();
        // The background sleep was in the group: it has exited (a pidfd is
        // readable once its process has, also as a zombie nobody reaped).
        // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as i32;
        if fd >= 0 {
            let mut p = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: p is one valid pollfd; fd is ours and closed right after.
            let n = unsafe { libc::poll(&mut p, 1, 10_000) };
            unsafe { libc::close(fd) };
            assert_eq!(n, 1, "the group's sleep outlived the timeout");
        }
    }
}
