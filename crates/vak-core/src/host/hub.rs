//! The hub: what `vak serve` holds, built once at startup: the registry of live sessions (`registry.rs`), the control plane (`control.rs`) and the live multiplexed streams, with the background work that keeps them (idle unloading, recovery, orphan adoption) and the graceful stop.

use crate::automation::scheduler::{
    LocalClaim, Scheduler, SchedulerConfig, SchedulerHandle, SlotClaim, SystemClock,
};
use crate::automation::store::{FileTasks, TaskPersist};
use crate::cluster::shared_tasks::{KvClaim, SharedTasks};
use crate::error::{Error, Result};
use crate::host::children::Children;
use crate::host::config::Settings;
use crate::host::control::ControlPlane;
use crate::host::index::Index;
use crate::host::registry::{DeleteHook, Registry};
use crate::host::runtimes::Runtimes;
use crate::host::tasks::{HostCheck, HostFirer};
use crate::session::live::Route;
use crate::session::runtime::Runtime;
use crate::stream::mux::Streams;
use crate::CoreConfig;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

pub struct Hub {
    /// Sessions: create, load, unload, list, delete, rename, fork.
    sessions: Arc<Registry>,
    /// The route, keys, permission mode, rules, memory, search, workspaces.
    control: Arc<ControlPlane>,
    /// Live multiplexed streams by stream id, for follow/unfollow.
    streams: Arc<Streams>,
    /// The scheduler's owner task: scheduled tasks and their fires.
    tasks: SchedulerHandle,
    /// Child sessions (workers, best-of-N candidates) under their parents.
    children: Arc<Children>,
    /// Ids of sessions whose writer stopped, until `housekeep` hands them
    /// to `recovery::run`.
    stopped_rx: Mutex<Option<mpsc::UnboundedReceiver<String>>>,
    /// Cancelled once shutdown is done; everything that runs until the
    /// hub closes holds a clone.
    closing: CancellationToken,
}

impl Hub {
    /// Prepares the home (creating `sessions/`); fails with a clear message when it is not writable.
    pub fn new(cfg: CoreConfig, route: Route) -> Result<Hub> {
        let settings = Settings::open(&cfg)?;
        Self::with_settings(cfg, route, settings)
    }

    /// A hub on the route its settings resolve to (a missing key or an
    /// unknown provider is a startup error).
    pub fn resolved(cfg: CoreConfig) -> Result<Hub> {
        let settings = Settings::open(&cfg)?;
        let route = settings.startup_route()?;
        Self::with_settings(cfg, route, settings)
    }

    fn with_settings(cfg: CoreConfig, route: Route, settings: Settings) -> Result<Hub> {
        let dir = cfg.sessions_dir();
        // Prompts, outputs and file contents live here: owner-only, also when
        // an earlier version created it readable.
        crate::home::create_private_dir(&dir)
            .and_then(|()| {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
            })
            .map_err(|e| Error::internal(format!("cannot create {}: {e}", dir.display())))?;
        let probe = dir.join(".write-probe");
        std::fs::write(&probe, b"")
            .and_then(|_| std::fs::remove_file(&probe))
            .map_err(|e| Error::internal(format!("the home {} is not writable: {e}", cfg.home.display())))?;
        // Startup, before anything is served: reading the index here blocks nobody.
        let index = Arc::new(Index::load(&dir));
        let search = crate::host::search::Search::open(
            &cfg.home,
            &crate::home::workspace_key(&cfg.workspace).0,
            cfg.nats.is_none().then(|| dir.clone()),
            index
                .list()
                .into_iter()
                .map(|e| (e.session_id, e.latest_seq))
                .collect(),
            cfg.search,
        );
        // Isolated children's worktrees: sessions may be pinned there.
        let worktrees = crate::host::children::Children::worktrees_dir(&cfg.home);
        crate::home::create_private_dir(&worktrees)
            .map_err(|e| Error::internal(format!("cannot create {}: {e}", worktrees.display())))?;
        let workspaces = Arc::new(
            crate::host::workspaces::Workspaces::new(&cfg.workspace, cfg.workspace_roots.clone())
                .with_worktrees(&worktrees),
        );
        let core = cfg.clone();
        let sandbox = crate::tools::sandbox::Sandbox::new(&cfg.sandbox, &cfg.home)?;
        // With --bus, a table put on any replica (in the bucket) wins over config.toml's.
        let defs = cfg
            .shared_config
            .as_ref()
            .and_then(|s| s.mcp())
            .unwrap_or_else(|| settings.file_mcp());
        let mcp = Arc::new(crate::mcp::Mcp::start(defs, cfg.workspace.clone()));
        let auto = settings.file_automation().clone();
        let tz = crate::zone::resolve(auto.timezone.as_deref()).map_err(Error::invalid)?;
        let script_timeout = auto.script_timeout().map_err(Error::invalid)?;
        // With --bus the replicas share one task list and claim each slot.
        let (persist, claim): (Arc<dyn TaskPersist>, Arc<dyn SlotClaim>) =
            match (&cfg.shared_config, &cfg.task_claims, &cfg.owners) {
                (Some(shared), Some(store), Some(owners)) => (
                    Arc::new(SharedTasks::new(shared.clone())),
                    Arc::new(KvClaim {
                        store: store.clone(),
                        replica: owners.replica().to_string(),
                    }),
                ),
                _ => (Arc::new(FileTasks::new(&cfg.home)), Arc::new(LocalClaim)),
            };
        let task_changes = cfg.shared_config.as_ref().map(|s| s.task_changes());
        let finops = Arc::new(crate::finops::Finops::open(
            &cfg.home,
            settings.file_finops(),
            tz.clone(),
        ));
        let portfolio = Arc::new(crate::host::portfolio::Portfolio::open(
            cfg.nats.is_none().then_some(dir.as_path()),
        ));
        let policy = Arc::new(settings.file_policy());
        let skills = Arc::new(crate::host::skills::Skills::open(&cfg.home, cfg.nats.is_none()));
        let rt = Arc::new(
            Runtime::new(cfg, route, search, sandbox, mcp, finops.clone())
                .with_portfolio(portfolio)
                .with_policy(policy)
                .with_skills(skills),
        );
        let runtimes = Arc::new(Runtimes::new(rt, workspaces.clone()));
        let closing = CancellationToken::new();
        let (sessions, stopped_rx) = Registry::new(runtimes.clone(), index, closing.clone());
        let sessions = Arc::new(sessions);
        // Children: the spawn_worker tool's and best-of-N's sessions.
        let children = Children::open(sessions.clone(), &core);
        runtimes.primary().set_spawner(Some(children.clone()));
        sessions.set_delete_hook(Arc::downgrade(&children) as std::sync::Weak<dyn DeleteHook>);
        // Budget alerts go to the sessions that spent (idle delivery).
        let registry: std::sync::Weak<Registry> = Arc::downgrade(&sessions);
        finops.set_sink(registry.clone());
        // Dev servers' output goes to their session while it is loaded.
        sessions
            .launches()
            .set_sink(Arc::new(move |id: &str| registry.upgrade()?.loaded_session(id)));
        let firer = HostFirer {
            sessions: sessions.clone(),
            workspaces: workspaces.clone(),
            // The budget: past it with stop_at_limit, fires are refused.
            gate: finops,
            script_timeout,
        };
        let tasks = Scheduler::start(SchedulerConfig {
            persist,
            clock: Arc::new(SystemClock),
            tz,
            catch_up_missed: auto.catch_up_missed,
            firer: Arc::new(firer),
            claim,
            check: Arc::new(HostCheck {
                sessions: sessions.clone(),
            }),
        })?;
        if let Some(mut changes) = task_changes {
            // Another replica changed the tasks: read them again.
            let (handle, closing) = (tasks.clone(), closing.clone());
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        changed = changes.changed() => if changed.is_err() { return },
                        _ = closing.cancelled() => return,
                    }
                    if let Err(e) = handle.reload().await {
                        tracing::warn!(
                            "the tasks changed on another replica and could not be read again: {e:?}"
                        );
                    }
                }
            });
        }
        let control = Arc::new(ControlPlane::new(
            runtimes,
            settings,
            workspaces,
            sessions.clone(),
            closing.clone(),
        ));
        Ok(Hub {
            sessions,
            control,
            streams: Arc::new(Streams::new(closing.clone())),
            tasks,
            children,
            stopped_rx: Mutex::new(Some(stopped_rx)),
            closing,
        })
    }

    /// The registry of sessions: create, load, list, delete, rename, fork.
    pub fn sessions(&self) -> &Arc<Registry> {
        &self.sessions
    }

    /// The control plane: route, keys, permission mode, rules, memory,
    /// search, workspaces.
    pub fn control(&self) -> &Arc<ControlPlane> {
        &self.control
    }

    /// The scheduler: tasks' CRUD, run-now and next fires.
    pub fn tasks(&self) -> &SchedulerHandle {
        &self.tasks
    }

    /// Child sessions: workers and best-of-N candidates, by parent.
    pub fn children(&self) -> &Arc<Children> {
        &self.children
    }

    /// The live multiplexed streams (`Mux::open`, `mux::control`).
    pub fn streams(&self) -> &Arc<Streams> {
        &self.streams
    }

    /// Resolves once the hub has shut down (every session closed).
    pub async fn closed(&self) {
        self.closing.cancelled().await
    }

    /// The background work of a serving hub, until shutdown: recovers
    /// sessions whose writer stopped, adopts orphaned mirrors (`--bus`
    /// with leases), and unloads idle sessions now and then.
    pub async fn housekeep(self: Arc<Self>) {
        let stopped = self.stopped_rx.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(stopped) = stopped {
            tokio::spawn(crate::host::recovery::run(self.sessions.clone(), stopped));
        }
        let cfg = self.control.config();
        if cfg.owners.is_some() {
            tokio::spawn(self.sessions.clone().adopt_orphans());
        }
        let every = (cfg.unload_idle_after / 2).clamp(Duration::from_millis(500), Duration::from_secs(30));
        loop {
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = self.closing.cancelled() => return,
            }
            if self.sessions.is_stopping() {
                return;
            }
            self.sessions.unload_idle().await;
        }
    }

    /// Graceful stop: every loaded session refuses new input, cancels its
    /// run, settles, closes its streams and syncs its ledger; then
    /// everything waiting for the hub to close ends.
    pub async fn shutdown(&self, grace: Duration) {
        // No fire starts once sessions begin to close.
        self.tasks.stop().await;
        // Dev servers go first: their output has nowhere to go after.
        self.sessions.launches().stop_all().await;
        self.sessions.stop(grace).await;
        self.control.mcp().shutdown().await;
        // The usage of the runs just settled reaches the cost ledger.
        self.control.finops().flush().await;
        self.closing.cancel();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::FutureExt;

    #[tokio::test]
    async fn the_hub_closes_once_shutdown_is_done_and_refuses_sessions_from_its_start() {
        let home = tempfile::tempdir().unwrap();
        let cfg = CoreConfig::new(home.path().to_path_buf(), home.path().to_path_buf());
        let h = Hub::new(cfg, Route::offline()).unwrap();
        assert!(h.closed().now_or_never().is_none());
        h.shutdown(Duration::from_secs(1)).await;
        assert!(h.closed().now_or_never().is_some());
        assert!(h.sessions().create().await.is_err());
    }
}
