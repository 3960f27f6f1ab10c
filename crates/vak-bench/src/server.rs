//! A server under test as a child process: `vak serve` (or the raw tonic
//! baseline, or nginx + nchan) with its own temp home, found by its `listening on` line.

use crate::clients::Target;
use crate::env::{Env, Transport};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::ChildStdout;

/// `vak serve` flags a scenario sets beyond the common ones.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ServeOpts {
    /// `--durability fsync` instead of the default `process`.
    pub fsync: bool,
    /// `--first-subscriber-wait-ms 0`: runs start at once with nobody watching.
    pub no_subscriber_wait: bool,
}

impl ServeOpts {
    pub(crate) const FSYNC: ServeOpts = ServeOpts {
        fsync: true,
        no_subscriber_wait: false,
    };
}

/// A server child process with its temp home; killed when dropped.
pub(crate) struct Server {
    child: tokio::process::Child,
    pub target: Target,
    pub pid: u32,
    dir: PathBuf,
}

static RUN: AtomicUsize = AtomicUsize::new(0);

/// A server's bearer token: 64 random hex digits.
pub(crate) fn random_token() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

impl Server {
    /// `vak serve` on loopback port 0 with its own home and workspace, a
    /// random token, and stream caps raised above what the scenarios open.
    pub(crate) async fn start(env: &Env, transport: Transport, opts: ServeOpts) -> Result<Server, String> {
        Server::start_with(env, transport, opts, &[], None).await
    }

    /// `start` with more `vak serve` flags (a `--bus` replica's) and a given
    /// token (replicas sharing a bus share one).
    pub(crate) async fn start_with(
        env: &Env,
        transport: Transport,
        opts: ServeOpts,
        extra: &[String],
        token: Option<&str>,
    ) -> Result<Server, String> {
        let dir = temp_home()?;
        let token = token.map_or_else(random_token, str::to_string);
        if transport == Transport::Nchan {
            let nginx = crate::peer::Nginx::start(&dir).await?;
            return Ok(Server {
                target: Target {
                    addr: std::net::SocketAddr::from(([127, 0, 0, 1], nginx.port)),
                    token,
                    peer: true,
                },
                // The worker: it holds the connections and does the work.
                pid: nginx.worker,
                child: nginx.child,
                dir,
            });
        }
        let log = std::fs::File::create(dir.join("server.log")).map_err(|e| e.to_string())?;
        let mut child = command(env, transport, opts, extra, &dir, &token)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", env.vak.display()))?;
        let pid = child.id().unwrap_or(0);
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let addr = announced(BufReader::new(stdout).lines(), &dir).await?;
        Ok(Server {
            child,
            target: Target {
                addr,
                token,
                peer: false,
            },
            pid,
            dir,
        })
    }

    /// Bytes of every file under the server's home (its ledgers and index).
    pub(crate) fn home_bytes(&self) -> u64 {
        fn walk(p: &Path) -> u64 {
            let Ok(rd) = std::fs::read_dir(p) else { return 0 };
            rd.flatten()
                .map(|e| match e.metadata() {
                    Ok(m) if m.is_dir() => walk(&e.path()),
                    Ok(m) => m.len(),
                    Err(_) => 0,
                })
                .sum()
        }
        walk(&self.dir.join("home"))
    }

    /// SIGTERM (vak shuts down gracefully), SIGKILL after 5 s; removes the temp home.
    pub(crate) async fn stop(mut self) {
        // SAFETY: kill(2) on our own child's pid (vak, or nginx's master).
        if let Some(pid) = self.child.id() {
            unsafe {
                libc::kill(pid as i32, libc::SIGTERM);
            }
        }
        if tokio::time::timeout(Duration::from_secs(5), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A fresh temp directory with an empty `home` and `workspace`.
fn temp_home() -> Result<PathBuf, String> {
    let dir = std::env::temp_dir().join(format!(
        "vak-bench-{}-{}",
        std::process::id(),
        RUN.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("home")).map_err(|e| e.to_string())?;
    std::fs::create_dir_all(dir.join("workspace")).map_err(|e| e.to_string())?;
    Ok(dir)
}

/// The command line of `transport`'s server: the raw tonic baseline (this
/// binary again), or `vak serve` in `dir` with the flags `opts` and `extra` add.
fn command(
    env: &Env,
    transport: Transport,
    opts: ServeOpts,
    extra: &[String],
    dir: &Path,
    token: &str,
) -> tokio::process::Command {
    if transport == Transport::Tonic {
        let mut c = tokio::process::Command::new(&env.exe);
        c.args(["baseline-server", "--listen", "127.0.0.1:0", "--capacity"])
            .arg(env.capacity.to_string());
        return c;
    }
    let mut c = tokio::process::Command::new(&env.vak);
    c.args(["serve", "--listen", "127.0.0.1:0", "--home"])
        .arg(dir.join("home"))
        .arg("--workspace")
        .arg(dir.join("workspace"))
        .args(["--max-streams", "1000000", "--max-streams-per-client", "1000000"])
        .env("VAK_TOKEN", token);
    if opts.fsync {
        c.args(["--durability", "fsync"]);
    }
    if transport == Transport::SseTls {
        c.arg("--tls-self-signed");
    }
    if opts.no_subscriber_wait {
        c.args(["--first-subscriber-wait-ms", "0"]);
    }
    c.args(&env.serve_args).args(extra);
    c.envs(env.serve_env.iter().map(|(k, v)| (k, v)));
    c
}

/// The address the server's `listening on` line announces; then stdout is
/// drained on a task of its own, so the child never blocks on a full pipe.
async fn announced(mut lines: Lines<BufReader<ChildStdout>>, dir: &Path) -> Result<SocketAddr, String> {
    // With TLS a line with the certificate's fingerprint comes first.
    let mut line = String::new();
    for _ in 0..4 {
        line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .map_err(|_| "the server did not announce itself within 30 s".to_string())?
            .map_err(|e| e.to_string())?
            .ok_or_else(|| {
                let log = std::fs::read_to_string(dir.join("server.log")).unwrap_or_default();
                format!("the server exited at startup: {}", log.trim())
            })?;
        if line.contains("listening on ") {
            break;
        }
    }
    let url = line
        .rsplit_once("listening on http://")
        .or_else(|| line.rsplit_once("listening on https://"))
        .map(|(_, u)| u.trim().to_string())
        .ok_or_else(|| format!("unexpected line {line:?}"))?;
    let addr = url.parse().map_err(|e| format!("bad address {url:?}: {e}"))?;
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok(addr)
}

/// The vak binary next to this one (target/release/vak for target/release/vak-bench).
pub(crate) fn default_vak(exe: &Path) -> PathBuf {
    exe.with_file_name("vak")
}
