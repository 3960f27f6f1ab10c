//! A real shell on a pseudo-terminal in a workspace, for the browser terminal: bounded queues both ways, resizable, and hung up (then killed) when its owner lets go, so no shell outlives its client.

use crate::error::{Error, ErrorKind, Result};
use bytes::Bytes;
use portable_pty::{CommandBuilder, MasterPty, PtySize};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};

/// Terminals open at once in one server: each is a shell and three threads.
pub const MAX_TERMINALS: usize = 8;
/// Bytes one read of the pty hands on (one output message at most).
pub const CHUNK: usize = 16 << 10;
/// Chunks queued each way. A client that stops reading stalls the reader,
/// the pty's kernel buffer fills and the shell blocks writing: output is
/// never dropped and memory never grows.
const QUEUE: usize = 32;
/// How long a hung-up shell has to exit before it is killed.
const HANGUP_GRACE: Duration = Duration::from_secs(2);
/// The largest size a client may ask for, each way.
pub const MAX_SIDE: u16 = 1000;

/// Environment variables the shell does not inherit from the server: those
/// no agent command inherits either (the providers' API keys, the server's
/// token, the bus's secrets): a terminal user types commands, and a key or
/// token in `env` output would end up on screen, in scrollback and in
/// screenshots. The shell itself is the user's own and runs outside the
/// command sandbox.
const WITHHELD: &[&str] = crate::tools::sandbox::WITHHELD_ENV;

/// The count of live terminals (`MAX_TERMINALS`).
#[derive(Clone)]
pub struct Terminals(Arc<Semaphore>);

impl Default for Terminals {
    fn default() -> Self {
        Terminals(Arc::new(Semaphore::new(MAX_TERMINALS)))
    }
}

impl Terminals {
    /// A slot for one more terminal, or a refusal naming the bound.
    pub fn permit(&self) -> Result<OwnedSemaphorePermit> {
        self.0.clone().try_acquire_owned().map_err(|_| {
            Error::new(
                ErrorKind::ResourceExhausted,
                format!("{MAX_TERMINALS} terminals are open already, the most one server runs"),
            )
            .with_reason("too_many_terminals")
        })
    }
}

/// Checks a terminal size a client asked for.
pub fn size(cols: u16, rows: u16) -> Result<PtySize> {
    if cols == 0 || rows == 0 || cols > MAX_SIDE || rows > MAX_SIDE {
        return Err(Error::invalid(format!(
            "a terminal is 1 to {MAX_SIDE} columns and rows, not {cols}x{rows}"
        )));
    }
    Ok(PtySize {
        rows,
        cols,
        pixel_width: 0,
        pixel_height: 0,
    })
}

/// The shell to run: `configured` (`[server.web] terminal_shell`), else the
/// user's (`$SHELL` when it is an absolute path to a file), else /bin/sh.
pub fn shell(configured: Option<&Path>) -> PathBuf {
    configured.map(Path::to_path_buf).unwrap_or_else(|| {
        std::env::var_os("SHELL")
            .map(PathBuf::from)
            .filter(|p| p.is_absolute() && p.is_file())
            .unwrap_or_else(|| PathBuf::from("/bin/sh"))
    })
}

/// One shell on a pty. Dropping it hangs the shell up: SIGHUP to its
/// process group (as a terminal closing does), SIGKILL if it has not
/// exited within `HANGUP_GRACE`.
pub struct Terminal {
    master: Box<dyn MasterPty + Send>,
    pid: u32,
    pub shell: PathBuf,
    /// Typed input for the shell (a full queue waits: see `QUEUE`).
    pub input: mpsc::Sender<Bytes>,
    /// The shell's output; closed once the pty is (the shell and whatever
    /// it started that kept the terminal have exited).
    pub output: mpsc::Receiver<Bytes>,
    /// The shell's exit code, once it has exited.
    exit: watch::Receiver<Option<u32>>,
    /// Set by the waiter thread once the shell is reaped: no signal is sent
    /// after that (its pid may be reused).
    reaped: Arc<AtomicBool>,
    _permit: OwnedSemaphorePermit,
}

impl Terminal {
    /// Starts `shell` in `workspace`. Blocking (opens the pty, forks):
    /// call it off the runtime's workers.
    pub fn spawn(
        shell: PathBuf,
        workspace: &Path,
        size: PtySize,
        permit: OwnedSemaphorePermit,
    ) -> Result<Terminal> {
        let fail = |what: &str, e: String| Error::internal(format!("terminal: {what}: {e}"));
        let pair = portable_pty::native_pty_system()
            .openpty(size)
            .map_err(|e| fail("openpty", e.to_string()))?;
        let mut cmd = CommandBuilder::new(&shell);
        cmd.cwd(workspace);
        cmd.env("TERM", "xterm-256color");
        for k in WITHHELD {
            cmd.env_remove(k);
        }
        let mut child = pair
            .slave
            .spawn_command(cmd)
            .map_err(|e| fail("spawn", e.to_string()))?;
        // Only the shell holds the slave side now: its exit (and its
        // children's) ends the reader with EOF.
        drop(pair.slave);
        let pid = child.process_id().unwrap_or(0);
        let mut reader = pair
            .master
            .try_clone_reader()
            .map_err(|e| fail("reader", e.to_string()))?;
        let mut writer = pair
            .master
            .take_writer()
            .map_err(|e| fail("writer", e.to_string()))?;

        let (out_tx, output) = mpsc::channel::<Bytes>(QUEUE);
        let (input, mut in_rx) = mpsc::channel::<Bytes>(QUEUE);
        let (exit_tx, exit) = watch::channel(None);
        let reaped = Arc::new(AtomicBool::new(false));
        let spawn = |name: &str, f: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new()
                .name(format!("pty-{name}-{pid}"))
                .spawn(f)
                .map_err(|e| fail("thread", e.to_string()))
        };
        spawn(
            "read",
            Box::new(move || {
                let mut buf = vec![0u8; CHUNK];
                // EOF or EIO (Linux's answer once the shell side is closed) ends it.
                while let Ok(n @ 1..) = reader.read(&mut buf) {
                    if out_tx.blocking_send(Bytes::copy_from_slice(&buf[..n])).is_err() {
                        break;
                    }
                }
            }),
        )?;
        spawn(
            "write",
            Box::new(move || {
                while let Some(bytes) = in_rx.blocking_recv() {
                    if writer.write_all(&bytes).and_then(|()| writer.flush()).is_err() {
                        break;
                    }
                }
            }),
        )?;
        let flag = reaped.clone();
        spawn(
            "wait",
            Box::new(move || {
                let code = child.wait().map(|s| s.exit_code()).unwrap_or(u32::MAX);
                flag.store(true, Ordering::SeqCst);
                let _ = exit_tx.send(Some(code));
            }),
        )?;
        Ok(Terminal {
            master: pair.master,
            pid,
            shell,
            input,
            output,
            exit,
            reaped,
            _permit: permit,
        })
    }

    /// The shell's process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Resizes the pty (the shell gets SIGWINCH).
    pub fn resize(&self, size: PtySize) -> Result<()> {
        self.master
            .resize(size)
            .map_err(|e| Error::internal(format!("terminal: resize: {e}")))
    }

    /// Resolves with the shell's exit code once it has exited.
    pub fn exited(&self) -> impl std::future::Future<Output = Option<u32>> + Send + 'static {
        let mut rx = self.exit.clone();
        async move { rx.wait_for(Option::is_some).await.ok().and_then(|c| *c) }
    }

    /// Signals the shell's process group (the shell leads its own session
    /// and group), unless it was reaped already.
    fn signal(reaped: &AtomicBool, pid: u32, sig: i32) {
        let Ok(pid) = i32::try_from(pid) else { return };
        if pid <= 1 || reaped.load(Ordering::SeqCst) {
            return;
        }
        // SAFETY: kill/killpg take a pid and a signal number; an exited
        // group answers ESRCH, which is fine.
        unsafe {
            libc::killpg(pid, sig);
            libc::kill(pid, sig);
        }
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        let (pid, reaped) = (self.pid, self.reaped.clone());
        Terminal::signal(&reaped, pid, libc::SIGHUP);
        let exited = self.exited();
        let kill = move || Terminal::signal(&reaped, pid, libc::SIGKILL);
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(async move {
                    if tokio::time::timeout(HANGUP_GRACE, exited).await.is_err() {
                        kill();
                    }
                });
            }
            Err(_) => kill(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_bounded() {
        assert!(size(80, 24).is_ok());
        assert!(size(0, 24).is_err());
        assert!(size(80, MAX_SIDE + 1).is_err());
    }

    #[test]
    fn the_count_of_terminals_is_bounded() {
        let t = Terminals::default();
        let held: Vec<_> = (0..MAX_TERMINALS).map(|_| t.permit().unwrap()).collect();
        let e = t.permit().unwrap_err();
        assert_eq!(
            (e.kind, e.reason),
            (ErrorKind::ResourceExhausted, Some("too_many_terminals"))
        );
        drop(held);
        assert!(t.permit().is_ok());
    }
}
