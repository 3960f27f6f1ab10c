//! The real `vak` binary as a child process for end-to-end tests: its startup line, signals, and a kill when dropped.

use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

use super::DEADLINE;

/// The next line of a child's output (without its line ending), invalid UTF-8 replaced by
/// U+FFFD; `None` at its end or on a read error. Tokio's `Lines` ends with an error at the
/// first invalid byte, and a drain built on it then stops reading for good: llama.cpp's debug
/// log prints byte-level token pieces (half an emoji), and once its drain stopped the lines
/// after were never seen and its pipe filled.
pub async fn next_line_lossy(from: &mut (impl tokio::io::AsyncBufRead + Unpin)) -> Option<String> {
    let mut line = Vec::new();
    match from.read_until(b'\n', &mut line).await {
        Ok(0) | Err(_) => None,
        Ok(_) => {
            if line.last() == Some(&b'\n') {
                line.pop();
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
            }
            Some(String::from_utf8_lossy(&line).into_owned())
        }
    }
}

/// `vak` with a clean environment: no VAK_* or RUST_LOG inherited from whoever runs the tests.
pub fn vak(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vak"));
    cmd.args(args)
        .env_remove("VAK_TOKEN")
        .env_remove("VAK_HOME")
        .env_remove("RUST_LOG")
        .env_remove("VAK_BUS_USER")
        .env_remove("VAK_BUS_PASSWORD")
        .env_remove("VAK_BUS_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

/// A running `vak serve`, killed when dropped (a failing test never leaks a server).
pub struct Vak {
    child: Child,
    stdout: mpsc::UnboundedReceiver<String>,
    /// The last `STDERR_TAIL` bytes of its log, for a failure message.
    stderr: Arc<Mutex<Vec<u8>>>,
    /// The task draining stderr; `wait` joins it so `log()` after an exit has
    /// everything the process wrote.
    drain: Option<tokio::task::JoinHandle<()>>,
    /// The stdout lines `url` read before the `listening on` line.
    banner: Vec<String>,
    /// The `listening on` line.
    announced: String,
}

/// How much of a child's stderr `Vak::log` keeps (its end).
pub const STDERR_TAIL: usize = 64 << 10;

impl Vak {
    pub fn spawn(mut cmd: Command) -> Vak {
        let mut child = cmd.spawn().expect("vak starts");
        let out = child.stdout.take().unwrap();
        let mut err = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut out = BufReader::new(out);
            while let Some(line) = next_line_lossy(&mut out).await {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        // Drained all along, so a chatty log never fills the pipe and stalls the server.
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let tail = stderr.clone();
        let drain = tokio::spawn(async move {
            let mut chunk = [0u8; 8192];
            while let Ok(n) = err.read(&mut chunk).await {
                if n == 0 {
                    break;
                }
                let mut t = tail.lock().unwrap();
                t.extend_from_slice(&chunk[..n]);
                let over = t.len().saturating_sub(STDERR_TAIL);
                t.drain(..over);
            }
        });
        Vak {
            child,
            stdout: rx,
            stderr,
            drain: Some(drain),
            banner: Vec::new(),
            announced: String::new(),
        }
    }

    /// The end of what it logged on stderr so far.
    pub fn log(&self) -> String {
        String::from_utf8_lossy(&self.stderr.lock().unwrap()).into_owned()
    }

    pub fn pid(&self) -> u32 {
        self.child.id().expect("still running")
    }

    /// Waits for the startup line and returns the URL it announces.
    pub async fn url(&mut self) -> String {
        self.listening(DEADLINE).await
    }

    /// Waits up to `deadline` for the `listening on http(s)://…` line and returns
    /// its URL: the one place a test reads where a child listens.
    pub async fn listening(&mut self, deadline: std::time::Duration) -> String {
        let mut seen = Vec::new();
        loop {
            let line = tokio::time::timeout(deadline, self.stdout.recv())
                .await
                .unwrap_or_else(|_| {
                    panic!(
                        "no `listening on` line within {deadline:?}; stdout: {seen:?}; stderr: {}",
                        self.log()
                    )
                })
                .unwrap_or_else(|| {
                    panic!(
                        "stdout closed before `listening on`; stdout: {seen:?}; stderr: {}",
                        self.log()
                    )
                });
            let url = line
                .find("listening on ")
                .map(|at| line[at + "listening on ".len()..].trim())
                .filter(|u| u.starts_with("http://") || u.starts_with("https://"))
                .map(str::to_string);
            if let Some(url) = url {
                self.banner = seen;
                self.announced = line;
                return url;
            }
            seen.push(line);
        }
    }

    /// The next line it prints on stdout (after `listening on`: the startup lines that follow it).
    pub async fn next_line(&mut self) -> String {
        tokio::time::timeout(DEADLINE, self.stdout.recv())
            .await
            .expect("a stdout line within the deadline")
            .expect("stdout is still open")
    }

    /// What it printed on stdout before `listening on` (once `url` returned).
    pub fn banner(&self) -> &[String] {
        &self.banner
    }

    /// The `listening on` line itself (once `url` returned).
    pub fn announced(&self) -> &str {
        &self.announced
    }

    pub async fn wait(&mut self) -> ExitStatus {
        let status = tokio::time::timeout(DEADLINE, self.child.wait())
            .await
            .expect("vak exits within the deadline")
            .unwrap();
        if let Some(drain) = self.drain.take() {
            tokio::time::timeout(DEADLINE, drain)
                .await
                .expect("its stderr ends within the deadline after it exits")
                .expect("the stderr drain does not panic");
        }
        status
    }

    /// Kills (SIGKILL) and reaps it, so its home lock is gone when this returns.
    pub async fn kill(mut self) {
        let _ = self.child.start_kill();
        self.wait().await;
    }

    /// Stops it with SIGTERM and waits for the exit status.
    pub async fn terminate(mut self) -> ExitStatus {
        self.signal("TERM");
        self.wait().await
    }

    /// Sends a signal by name ("TERM", "INT") with kill(1).
    pub fn signal(&self, name: &str) {
        let ok = std::process::Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.pid().to_string())
            .status()
            .expect("kill runs")
            .success();
        assert!(ok, "SIG{name} delivered");
    }
}

impl Drop for Vak {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}
