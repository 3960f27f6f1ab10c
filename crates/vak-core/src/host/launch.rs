//! Dev servers: each session's launch configs (`launch/config.rs`), the runs the server holds for them keyed by session, bounded per session and per server, and stopped with the session or the server.
//!
//! The runs are kept in one map, locked only to find, insert or remove
//! an entry: starting, stopping and reading files happen outside it. A
//! dev server is the user's own program started on request, like the
//! browser terminal's shell: it runs outside the command sandbox (it
//! needs the network and its tooling), without the variables no command
//! inherits (`sandbox::WITHHELD_ENV` and `[sandbox] scrub_env`).

pub mod config;
pub mod run;

use crate::error::{Error, ErrorKind, Result};
use config::{Config, Source};
use run::{Ring, Run, Sink, Spec};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

/// Dev servers running at once in one session.
pub const MAX_PER_SESSION: usize = 8;
/// Dev servers running at once in one server.
pub const MAX_PER_SERVER: usize = 64;
/// Runs remembered (running or ended, for their logs and exit codes)
/// across all sessions; the oldest ended ones are forgotten first.
const MAX_REMEMBERED: usize = 256;

/// A config with what its last run is doing.
#[derive(Clone, Debug)]
pub struct Listed {
    pub config: Config,
    pub running: bool,
    pub pid: u32,
    pub started_at: String,
    pub exit_code: Option<i32>,
}

/// A run's latest lines and the ring's bounds.
#[derive(Clone, Debug)]
pub struct Logs {
    pub name: String,
    pub lines: Vec<(crate::event::OutputStream, String)>,
    pub running: bool,
    pub dropped: u64,
}

struct Entry {
    session: String,
    name: String,
    /// None while it is being started.
    run: Option<Arc<Run>>,
    /// Start order, for forgetting the oldest ended run first.
    order: u64,
}

impl Entry {
    /// Running, or being started.
    fn running(&self) -> bool {
        self.run.as_ref().is_none_or(|r| r.status.borrow().running)
    }
}

/// The dev servers of every session on this server.
#[derive(Default)]
pub struct Launches {
    runs: Mutex<Vec<Entry>>,
    next: std::sync::atomic::AtomicU64,
    sink: OnceLock<Sink>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn not_found(name: &str) -> Error {
    Error::not_found(format!("no launch config named {name:?} in this workspace"))
        .with_reason("launch_not_found")
}

fn check_name(name: &str) -> Result<()> {
    if name.is_empty() {
        return Err(Error::invalid("name is required"));
    }
    Ok(())
}

impl Launches {
    /// Where output is published: the hub sets it once.
    pub fn set_sink(&self, sink: Sink) {
        let _ = self.sink.set(sink);
    }

    fn table(&self) -> MutexGuard<'_, Vec<Entry>> {
        lock(&self.runs)
    }

    fn find(&self, session: &str, name: &str) -> Option<Arc<Run>> {
        self.table()
            .iter()
            .find(|e| e.session == session && e.name == name)
            .and_then(|e| e.run.clone())
    }

    /// The workspace's configs with their runs' state.
    pub async fn list(&self, session: &str, ws: &Path) -> Result<Vec<Listed>> {
        let configs = load(ws).await?;
        Ok(configs
            .into_iter()
            .map(|config| {
                let run = self.find(session, &config.name);
                let (status, pid, started_at) = match &run {
                    Some(r) => (r.status.borrow().clone(), r.pid, r.started_at.clone()),
                    None => (run::Status::default(), 0, String::new()),
                };
                Listed {
                    config,
                    running: status.running,
                    pid: if status.running { pid } else { 0 },
                    started_at,
                    exit_code: status.exit_code,
                }
            })
            .collect())
    }

    /// Starts config `name` of `ws` for `session`: 404 for an unknown name,
    /// 409 while it runs, 429 past the bounds.
    pub async fn start(
        &self,
        session: &str,
        ws: &Path,
        name: &str,
        withheld: Vec<String>,
    ) -> Result<(String, u32)> {
        check_name(name)?;
        let configs = load(ws).await?;
        let Some(config) = configs.into_iter().find(|c| c.name == name) else {
            return Err(not_found(name));
        };
        let ws_owned = ws.to_path_buf();
        let cwd = config.cwd.clone();
        let dir = tokio::task::spawn_blocking(move || config::resolve_cwd(&ws_owned, &cwd))
            .await
            .map_err(|e| Error::internal(e.to_string()))??;
        let sink = self
            .sink
            .get()
            .cloned()
            .unwrap_or_else(|| Arc::new(|_: &str| None));
        let spec = Spec {
            session_id: session.to_string(),
            name: name.to_string(),
            command: config.command,
            dir,
            env: config.env,
            withheld,
        };
        // Checked and reserved under the lock; started outside it.
        let order = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.reserve(session, name, order)?;
        let run = match run::start(spec, sink) {
            Ok(run) => Arc::new(run),
            Err(e) => {
                self.table().retain(|e| e.order != order);
                return Err(e);
            }
        };
        let placed = {
            let mut table = self.table();
            table
                .iter_mut()
                .find(|e| e.order == order)
                .map(|e| e.run = Some(run.clone()))
                .is_some()
        };
        if !placed {
            // The session was deleted (or the server stopped) meanwhile.
            run.stop().await;
            return Err(Error::new(
                ErrorKind::Unavailable,
                format!("{name} was stopped as it started: its session went away"),
            ));
        }
        Ok((name.to_string(), run.pid))
    }

    /// Takes a slot for a start of `name`, refused while it runs or past the bounds.
    fn reserve(&self, session: &str, name: &str, order: u64) -> Result<()> {
        let mut table = self.table();
        if table
            .iter()
            .any(|e| e.session == session && e.name == name && e.running())
        {
            return Err(
                Error::new(ErrorKind::Conflict, format!("{name} is running already"))
                    .with_reason("launch_running"),
            );
        }
        let here = table
            .iter()
            .filter(|e| e.session == session && e.running())
            .count();
        if here >= MAX_PER_SESSION {
            return Err(Error::new(
                ErrorKind::ResourceExhausted,
                format!(
                    "{MAX_PER_SESSION} dev servers run in this session already, the most one session runs"
                ),
            )
            .with_reason("too_many_launches"));
        }
        if table.iter().filter(|e| e.running()).count() >= MAX_PER_SERVER {
            return Err(Error::new(
                ErrorKind::ResourceExhausted,
                format!("{MAX_PER_SERVER} dev servers run on this server already, the most it runs"),
            )
            .with_reason("too_many_launches"));
        }
        table.retain(|e| !(e.session == session && e.name == name));
        table.push(Entry {
            session: session.to_string(),
            name: name.to_string(),
            run: None,
            order,
        });
        while table.len() > MAX_REMEMBERED {
            let oldest = table
                .iter()
                .enumerate()
                .filter(|(_, e)| !e.running())
                .min_by_key(|(_, e)| e.order)
                .map(|(i, _)| i);
            match oldest {
                Some(i) => {
                    table.remove(i);
                }
                None => break,
            }
        }
        Ok(())
    }

    /// Stops `name`'s group and waits for its leader; false when it had
    /// ended already. An unknown name is 404.
    pub async fn stop(&self, session: &str, ws: &Path, name: &str) -> Result<bool> {
        check_name(name)?;
        match self.find(session, name) {
            Some(run) => Ok(run.stop().await),
            None => {
                if load(ws).await?.iter().any(|c| c.name == name) {
                    Ok(false)
                } else {
                    Err(not_found(name))
                }
            }
        }
    }

    /// The last `tail` lines of `name`'s latest run (all when 0).
    pub async fn logs(&self, session: &str, ws: &Path, name: &str, tail: usize) -> Result<Logs> {
        check_name(name)?;
        let Some(run) = self.find(session, name) else {
            if load(ws).await?.iter().any(|c| c.name == name) {
                return Ok(Logs {
                    name: name.to_string(),
                    lines: Vec::new(),
                    running: false,
                    dropped: 0,
                });
            }
            return Err(not_found(name));
        };
        let (lines, dropped) = {
            let ring: MutexGuard<'_, Ring> = lock(&run.ring);
            (ring.tail(tail), ring.dropped)
        };
        let running = run.status.borrow().running;
        Ok(Logs {
            name: name.to_string(),
            lines,
            running,
            dropped,
        })
    }

    /// Stops every run of `session` (its deletion) and forgets them.
    pub async fn stop_session(&self, session: &str) {
        let runs: Vec<Arc<Run>> = {
            let mut table = self.table();
            let (mine, rest): (Vec<Entry>, Vec<Entry>) = table.drain(..).partition(|e| e.session == session);
            *table = rest;
            mine.into_iter().filter_map(|e| e.run).collect()
        };
        futures_util::future::join_all(runs.iter().map(|r| r.stop())).await;
    }

    /// Stops every run (the server's shutdown).
    pub async fn stop_all(&self) {
        let runs: Vec<Arc<Run>> = self.table().drain(..).filter_map(|e| e.run).collect();
        futures_util::future::join_all(runs.iter().map(|r| r.stop())).await;
    }
}

async fn load(ws: &Path) -> Result<Vec<Config>> {
    let ws = ws.to_path_buf();
    tokio::task::spawn_blocking(move || config::load(&ws))
        .await
        .map_err(|e| Error::internal(e.to_string()))?
}

/// Where a config came from, as the wire names it.
pub fn source_str(s: Source) -> &'static str {
    match s {
        Source::LaunchToml => "launch_toml",
        Source::Npm => "npm",
    }
}
