//! The session hub: creates sessions, lists them from disk, and keeps exactly one live state per loaded session (loading a persisted one on first use, unloading an idle one).
//!
//! The map of loaded sessions is locked only to find or insert a cell;
//! loading a ledger happens outside it, on a blocking thread, and concurrent
//! first accesses to one session share one load (`OnceCell`).

use crate::cluster::jetstream::JetStreamLog;
use crate::cluster::owners::{Claim, Owner};
use crate::error::{Error, ErrorKind, Result};
use crate::host::config::{RoutePatch, RouteSpec, Settings};
use crate::host::index::{Entry, Index};
use crate::ids::validate_session_id;
use crate::log::ledger::{storage_error, Batch, Ledger, Log, OpenError, Record};
use crate::log::repair::{self, Remembered, Unrepairable};
use crate::reasons::CloseReason;
use crate::session::lifecycle;
use crate::session::live::{Route, Runtime, Session, SessionInfo};
use crate::stopped::Stopped;
use crate::stream::mux::Control;
use crate::CoreConfig;
use crate::PermissionMode;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};
use tokio::sync::{mpsc, OnceCell};
use tokio_util::sync::CancellationToken;

/// How long a session stopped by a storage failure answers with that
/// failure before the next use tries to reload it from its ledger.
const STORAGE_RETRY: Duration = Duration::from_secs(1);

type Cell = Arc<OnceCell<Arc<Session>>>;

/// Where a session is served: here, or by the replica holding its lease (`--bus` with several replicas).
pub enum Located {
    Local(Arc<Session>),
    Remote(Owner),
}

/// Why a session did not load here.
enum LoadError {
    Failed(Error),
    /// Another live replica holds its lease.
    Elsewhere(Owner),
}

impl From<Error> for LoadError {
    fn from(e: Error) -> Self {
        LoadError::Failed(e)
    }
}

/// What a replica that does not hold a session's lease answers for what it cannot forward.
fn served_elsewhere(id: &str, owner: &Owner) -> Error {
    Error::new(
        ErrorKind::Unavailable,
        format!(
            "session {id} is written by replica {} ({}); this replica serves its streams and reads and forwards runs, steering, approvals and cancel to it, but does not change it otherwise",
            owner.replica, owner.url
        ),
    )
    .with_reason("served_elsewhere")
}

pub struct Hub {
    rt: Arc<Runtime>,
    sessions: Mutex<HashMap<String, Cell>>,
    /// Read-only copies of sessions other replicas write (`--bus`), for
    /// their streams and reads (`mirror.rs`).
    mirrors: Mutex<HashMap<String, Cell>>,
    /// Every session on disk, for listing without reading ledgers. Loaded
    /// sessions report live state instead; an entry is refreshed when its
    /// session loads, unloads or the server stops.
    index: Arc<Index>,
    /// The one writer of index.json: every save runs on its task, in turn.
    index_file: crate::file_owner::FileOwner<Arc<Index>>,
    /// Set when shutdown begins: no session is created or loaded after it.
    stopping: AtomicBool,
    /// Live multiplexed streams by stream id, for follow/unfollow.
    streams: Mutex<HashMap<String, mpsc::Sender<Control>>>,
    closing: CancellationToken,
    /// The model route's description and revision, keys, config.toml.
    settings: Arc<Settings>,
    /// Where every permission mode change runs, one at a time, from switch
    /// (and, with `--bus`, the bucket's put) to settled runs: no lock is
    /// held across that I/O.
    mode_change: crate::file_owner::FileOwner<()>,
    /// The workspaces open in this process (`workspaces.rs`).
    workspaces: Arc<crate::host::workspaces::Workspaces>,
    /// The runtimes of sessions in workspaces other than the server's own,
    /// by canonical path (made on first use, kept for the process's life).
    runtimes: Runtimes,
    /// Ids of sessions whose writer stopped, for `recovery::run` (which
    /// `housekeep` starts with the receiver).
    stopped: mpsc::UnboundedSender<String>,
    stopped_rx: Mutex<Option<mpsc::UnboundedReceiver<String>>>,
}

/// The runtimes of other workspaces, shared with load threads.
type Runtimes = Arc<Mutex<HashMap<String, Arc<Runtime>>>>;

/// The runtime for sessions in `workspace` (a canonical path): the primary's
/// own, or one made from it, its folder re-checked now (`workspaces::recheck`:
/// a folder replaced since it was opened is refused). A cached runtime whose
/// folder is no longer the one there (the folder was opened again) is made
/// afresh. Blocking (resolves the path; a new runtime reads its rules file,
/// outside the lock).
fn runtime_for(
    runtimes: &Runtimes,
    primary: &Arc<Runtime>,
    workspaces: &crate::host::workspaces::Workspaces,
    workspace: &str,
) -> Result<Arc<Runtime>> {
    if workspace == primary.workspace() {
        return Ok(primary.clone());
    }
    let pin = workspaces.pin(std::path::Path::new(workspace))?;
    Ok(cached_runtime(runtimes, primary, pin))
}

/// The runtime for a session reloaded from its ledger in `workspace`: as
/// `runtime_for`, but a folder that fails the check still gets one (the
/// session loads, its transcript is served, and each use is refused).
fn reloaded_runtime(
    runtimes: &Runtimes,
    primary: &Arc<Runtime>,
    workspaces: &crate::host::workspaces::Workspaces,
    workspace: &str,
) -> Arc<Runtime> {
    if workspace == primary.workspace() {
        return primary.clone();
    }
    let pin = workspaces.pin_reloaded(std::path::Path::new(workspace));
    cached_runtime(runtimes, primary, pin)
}

fn cached_runtime(
    runtimes: &Runtimes,
    primary: &Arc<Runtime>,
    pin: crate::host::workspaces::Pinned,
) -> Arc<Runtime> {
    let key = pin.path.display().to_string();
    let id = pin.id;
    let same = |rt: &Arc<Runtime>| rt.pinned().is_some_and(|p| p.id == id || id.is_none());
    if let Some(rt) = lock(runtimes).get(&key).filter(|rt| same(rt)) {
        return rt.clone();
    }
    let made = Arc::new(primary.in_workspace(pin));
    let mut map = lock(runtimes);
    match map.get(&key) {
        Some(rt) if same(rt) => rt.clone(),
        _ => {
            map.insert(key, made.clone());
            made
        }
    }
}

/// What a permission mode change did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModeChange {
    pub config: ConfigInfo,
    /// False when the mode was already the one asked for (nothing happened).
    pub changed: bool,
    pub cancelled_runs: usize,
    pub denied_approvals: usize,
}

/// How long a stopping server spends bringing the shared session index
/// up to date (`--bus`).
const SHARE_AT_SHUTDOWN: Duration = Duration::from_secs(5);

/// How long a mode change waits for the runs it cancelled to settle.
const MODE_CHANGE_GRACE: Duration = Duration::from_secs(10);

/// The effective configuration: what GetConfig answers and config frames carry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigInfo {
    pub permission_mode: String,
    pub ring: u64,
    pub route: RouteSpec,
    /// Changes on every route change (and with every server start).
    pub revision: String,
    pub max_turns: u32,
}

/// With `--bus`: takes up every route and key change another replica
/// makes, until the hub closes.
async fn adopt_shared_config(
    shared: Arc<crate::cluster::shared_config::SharedConfig>,
    settings: std::sync::Weak<Settings>,
    rt: std::sync::Weak<Runtime>,
    closing: CancellationToken,
) {
    let mut changes = shared.changes();
    loop {
        {
            let (Some(s), Some(rt)) = (settings.upgrade(), rt.upgrade()) else {
                return;
            };
            s.adopt(move |route| rt.set_route(route)).await;
        }
        tokio::select! {
            changed = changes.changed() => if changed.is_err() { return },
            _ = closing.cancelled() => return,
        }
    }
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
        let workspaces = Arc::new(crate::host::workspaces::Workspaces::new(
            &cfg.workspace,
            cfg.workspace_roots.clone(),
        ));
        let shared = cfg.shared_config.clone();
        let settings = Arc::new(settings);
        let sandbox = crate::tools::sandbox::Sandbox::new(&cfg.sandbox, &cfg.home)?;
        let rt = Arc::new(Runtime::new(cfg, route, search, sandbox));
        let closing = CancellationToken::new();
        if let Some(shared) = shared {
            // The bucket's mode wins over --permission-mode (a bypass this
            // replica does not allow aside: `follow_shared_mode` warns).
            if let Some(m) = shared.mode() {
                if m.mode.check(rt.bypass_allowed()).is_ok() {
                    rt.set_mode(m.mode);
                }
            }
            tokio::spawn(adopt_shared_config(
                shared,
                Arc::downgrade(&settings),
                Arc::downgrade(&rt),
                closing.clone(),
            ));
        }
        let (stopped, stopped_rx) = mpsc::unbounded_channel();
        Ok(Hub {
            stopped,
            stopped_rx: Mutex::new(Some(stopped_rx)),
            workspaces,
            runtimes: Arc::new(Mutex::new(HashMap::new())),
            rt,
            sessions: Mutex::new(HashMap::new()),
            mirrors: Mutex::new(HashMap::new()),
            index_file: crate::file_owner::FileOwner::new("the session index", index.clone()),
            index,
            stopping: AtomicBool::new(false),
            streams: Mutex::new(HashMap::new()),
            closing,
            settings,
            mode_change: crate::file_owner::FileOwner::new("the permission mode", ()),
        })
    }

    /// The workspaces open in this process.
    pub fn workspaces(&self) -> &Arc<crate::host::workspaces::Workspaces> {
        &self.workspaces
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Changes the model route (resolved, persisted, then applied to legs
    /// that start from now on); the new effective configuration.
    pub async fn update_route(&self, patch: RoutePatch) -> Result<ConfigInfo> {
        let rt = self.rt.clone();
        self.settings
            .update(patch, move |route| rt.set_route(route))
            .await?;
        Ok(self.config_info())
    }

    /// Stores a provider key; its fingerprint. A route of that provider
    /// picks it up for its next legs.
    pub async fn set_key(&self, kind: crate::provider::ProviderKind, key: &str) -> Result<String> {
        let rt = self.rt.clone();
        self.settings
            .set_key(kind, key, move |route| rt.set_route(route))
            .await
    }

    /// Deletes a stored key: (deleted, the environment still exports one).
    pub async fn delete_key(&self, kind: crate::provider::ProviderKind) -> Result<(bool, bool)> {
        let rt = self.rt.clone();
        self.settings
            .delete_key(kind, move |route| rt.set_route(route))
            .await
    }

    /// Switches the permission mode. A change denies every pending approval
    /// and cancels every run of every loaded session, and returns once those
    /// runs have settled and what they published is visible (all together
    /// bounded by `MODE_CHANGE_GRACE`); the same mode changes nothing. `bypass` needs a
    /// server that allows it.
    pub async fn set_mode(self: &Arc<Self>, mode: PermissionMode) -> Result<ModeChange> {
        mode.check(self.rt.bypass_allowed())?;
        let me = self.clone();
        self.mode_change
            .change(move |_| Box::pin(async move { me.set_mode_now(mode).await }))
            .await?
    }

    /// `set_mode` on the mode's owner task.
    async fn set_mode_now(&self, mode: PermissionMode) -> Result<ModeChange> {
        // With --bus every replica takes it up (`follow_shared_mode`).
        if let Some(shared) = &self.rt.cfg.shared_config {
            shared
                .put_mode(crate::cluster::shared_config::SharedMode {
                    mode,
                    interrupt: true,
                })
                .await?;
        }
        Ok(self.change_mode(mode).await)
    }

    /// With `--bus`: takes up every permission mode change made on another
    /// replica, as `set_mode` does here (a `POST /config/mode` denies this
    /// replica's pending approvals and cancels its runs too; an approved
    /// plan only switches), until the hub closes. A `bypass` this replica
    /// does not allow (no `--allow-bypass`) is not taken up, with a warning.
    pub async fn follow_shared_mode(self: Arc<Self>) {
        let Some(shared) = self.rt.cfg.shared_config.clone() else {
            return;
        };
        let mut changes = shared.mode_changes();
        loop {
            if let Some(m) = shared.mode() {
                if m.mode != self.rt.mode() {
                    if m.mode.check(self.rt.bypass_allowed()).is_err() {
                        tracing::warn!(
                            "another replica chose the bypass mode, which this replica does not allow (no --allow-bypass): staying in {}",
                            self.rt.mode().as_str()
                        );
                    } else if m.interrupt {
                        let me = self.clone();
                        let turn = self.mode_change.change(move |_| {
                            Box::pin(async move {
                                me.change_mode(m.mode).await;
                            })
                        });
                        if let Err(e) = turn.await {
                            tracing::warn!(
                                "a permission mode change on another replica is not taken up: {e}"
                            );
                        }
                    } else {
                        self.rt.set_mode(m.mode);
                    }
                }
            }
            tokio::select! {
                changed = changes.changed() => if changed.is_err() { return },
                _ = self.closing.cancelled() => return,
            }
        }
    }

    /// Switches the mode here, denying pending approvals and cancelling
    /// runs when it changed; runs on the `mode_change` owner's task.
    async fn change_mode(&self, mode: PermissionMode) -> ModeChange {
        let changed = self.rt.set_mode(mode);
        let (mut cancelled_runs, mut denied_approvals) = (0, 0);
        if changed {
            tracing::info!(mode = mode.as_str(), "permission mode changed");
            let reason = format!("the permission mode changed to {}", mode.as_str());
            let sessions = self.live();
            for s in &sessions {
                let (cancelled, denied) = s.interrupt(&reason);
                cancelled_runs += cancelled;
                denied_approvals += denied;
            }
            // One deadline for all of them: the answer waits at most the grace.
            let deadline = tokio::time::Instant::now() + MODE_CHANGE_GRACE;
            for s in &sessions {
                let settled = async {
                    s.settled().await;
                    // Visible (durable, on every stream) before the answer.
                    let _ = s.flush().await;
                };
                let _ = tokio::time::timeout_at(deadline, settled).await;
            }
        }
        ModeChange {
            config: self.config_info(),
            changed,
            cancelled_runs,
            denied_approvals,
        }
    }

    /// The workspace's always-allow rules.
    pub fn rules(&self) -> &crate::host::rules::Rules {
        self.rt.rules()
    }

    /// The runtime of the open workspace at `workspace` (an absolute path,
    /// as `GET /workspaces` lists it; None: the server's own), for its
    /// always-allow rules: made on first use like a session's, its folder
    /// re-checked. An empty path is InvalidArgument; a path no open
    /// workspace has is NotFound (`workspace_not_open`).
    pub async fn workspace_runtime(&self, workspace: Option<&str>) -> Result<Arc<Runtime>> {
        let Some(asked) = workspace else {
            return Ok(self.rt.clone());
        };
        if asked.is_empty() {
            return Err(Error::invalid(
                "workspace is empty: give the absolute path of an open workspace (GET /workspaces), \
                 or leave it out for the server's own",
            ));
        }
        let (workspaces, runtimes, primary) =
            (self.workspaces.clone(), self.runtimes.clone(), self.rt.clone());
        let asked = asked.to_string();
        tokio::task::spawn_blocking(move || {
            let Some(w) = workspaces.find(&asked)? else {
                return Err(Error::not_found(format!(
                    "no open workspace {asked}: GET /workspaces lists the open ones (POST /workspaces/open opens one)"
                ))
                .with_reason("workspace_not_open"));
            };
            if w.primary {
                return Ok(primary);
            }
            runtime_for(&runtimes, &primary, &workspaces, &w.path.display().to_string())
        })
        .await
        .map_err(|e| Error::internal(e.to_string()))?
    }

    /// The best `limit` transcript hits for `q`, in this workspace's
    /// sessions or in every workspace's (`all`), each with its session's title.
    pub async fn search(
        &self,
        q: &str,
        limit: usize,
        all: bool,
    ) -> Result<Vec<(crate::host::search::Hit, String)>> {
        let workspace = (!all).then(|| self.rt.workspace().to_string());
        let hits = self.rt.search().query(q, limit, workspace).await?;
        Ok(hits
            .into_iter()
            .map(|h| {
                // A loaded session's title is live (the index catches up when it unloads).
                let live = self.loaded().get(&h.session_id).and_then(|c| c.get().cloned());
                let title = match live {
                    Some(s) => s.info().title,
                    None => self.index.get(&h.session_id).map(|e| e.title).unwrap_or_default(),
                };
                (h, title)
            })
            .collect())
    }

    /// The workspace's canonical path (what search hits name).
    pub fn workspace(&self) -> &str {
        self.rt.workspace()
    }

    /// The workspace's and the user's memory notes.
    pub fn memory(&self) -> &crate::host::memory::Memory {
        self.rt.memory()
    }

    /// Notified on every permission mode change (config frames).
    pub fn watch_mode(&self) -> tokio::sync::watch::Receiver<PermissionMode> {
        self.rt.watch_mode()
    }

    /// The sandbox in force for the agent's commands.
    pub fn sandbox(&self) -> crate::tools::sandbox::SandboxFacts {
        self.rt.sandbox().facts()
    }

    pub fn config(&self) -> &CoreConfig {
        &self.rt.cfg
    }

    pub fn config_info(&self) -> ConfigInfo {
        let (route, revision) = self.settings.current();
        ConfigInfo {
            permission_mode: self.rt.mode().as_str().to_string(),
            ring: self.rt.cfg.bus.ring as u64,
            route,
            revision,
            max_turns: self.rt.cfg.max_turns,
        }
    }

    /// Resolves once the hub has shut down (every session closed).
    pub async fn closed(&self) {
        self.closing.cancelled().await
    }

    pub fn register_stream(&self, stream_id: &str, control: mpsc::Sender<Control>) {
        lock(&self.streams).insert(stream_id.to_string(), control);
    }

    pub fn unregister_stream(&self, stream_id: &str) {
        lock(&self.streams).remove(stream_id);
    }

    pub fn stream_control(&self, stream_id: &str) -> Option<mpsc::Sender<Control>> {
        lock(&self.streams).get(stream_id).cloned()
    }

    fn ledger_path(&self, id: &str) -> PathBuf {
        self.rt.cfg.sessions_dir().join(format!("{id}.jsonl"))
    }

    fn loaded(&self) -> MutexGuard<'_, HashMap<String, Cell>> {
        lock(&self.sessions)
    }

    fn refuse_when_stopping(&self) -> Result<()> {
        if self.stopping.load(Ordering::Acquire) {
            return Err(Error::new(ErrorKind::Unavailable, "the server is shutting down"));
        }
        Ok(())
    }

    /// Every session in memory now (loads in flight are not).
    fn live(&self) -> Vec<Arc<Session>> {
        let mut out: Vec<Arc<Session>> = self.loaded().values().filter_map(|c| c.get().cloned()).collect();
        out.extend(lock(&self.mirrors).values().filter_map(|c| c.get().cloned()));
        out
    }

    pub async fn create(&self) -> Result<Arc<Session>> {
        self.create_in(None).await
    }

    /// A new session in `workspace` (an open one; None: the server's own),
    /// which it keeps: its tools work there, its rules and memory are that
    /// workspace's, and its ledger header names it, so a reload finds it.
    /// An untrusted workspace is refused: the agent runs programs there.
    pub async fn create_in(
        &self,
        workspace: Option<crate::host::workspaces::OpenWorkspace>,
    ) -> Result<Arc<Session>> {
        self.refuse_when_stopping()?;
        let rt = match workspace.filter(|w| !w.primary) {
            None => self.rt.clone(),
            Some(w) if !w.trusted => return Err(Error::forbidden(
                "the workspace is not trusted: no session runs in it (open it again with \"trust\": true)",
            )
            .with_reason("untrusted_workspace")),
            Some(_) if self.rt.cfg.nats.is_some() => {
                return Err(Error::invalid(
                    "with --bus, sessions run in the server's own workspace",
                ))
            }
            Some(w) => {
                let (runtimes, primary) = (self.runtimes.clone(), self.rt.clone());
                let workspaces = self.workspaces.clone();
                let ws = w.path.display().to_string();
                tokio::task::spawn_blocking(move || runtime_for(&runtimes, &primary, &workspaces, &ws))
                    .await
                    .map_err(|e| Error::internal(e.to_string()))??
            }
        };
        let id = uuid::Uuid::new_v4().simple().to_string();
        let created_at = humantime::format_rfc3339_seconds(SystemTime::now()).to_string();
        let path = self.ledger_path(&id);
        let durability = self.rt.cfg.durability;
        let header = Record::Header {
            session_id: id.clone(),
            created_at: created_at.clone(),
            workspace: rt.workspace().to_string(),
        };
        let log: (Arc<dyn Log>, _, _) = match &self.rt.cfg.nats {
            Some(client) => {
                let lease = match &self.rt.cfg.owners {
                    Some(owners) => match owners.claim(&id).await? {
                        Claim::Mine(lost) => Some(lost),
                        Claim::Theirs(o) => {
                            return Err(Error::internal(format!(
                                "a fresh session id {id} is leased to {}",
                                o.replica
                            )))
                        }
                    },
                    None => None,
                };
                let created = async {
                    let log = Arc::new(JetStreamLog::open(client.clone(), &id).await?);
                    if let Some(owners) = &self.rt.cfg.owners {
                        log.write_as(owners.replica());
                    }
                    let l = log.clone();
                    tokio::task::spawn_blocking(move || {
                        let mut batch = Batch::default();
                        batch.push(&header);
                        l.append(&batch)
                    })
                    .await
                    .map_err(|e| Error::internal(e.to_string()))?
                    .map_err(|e| storage_error(&e))?;
                    Ok::<_, Error>(log)
                }
                .await;
                match created {
                    Ok(log) => (log.clone(), lease, Some(log)),
                    Err(e) => {
                        // No session came of it: its lease goes back at once.
                        if let Some(owners) = &self.rt.cfg.owners {
                            owners.release(&id).await;
                        }
                        return Err(e);
                    }
                }
            }
            None => (
                Arc::new(
                    tokio::task::spawn_blocking(move || Ledger::create_with(&path, &header, durability))
                        .await
                        .map_err(|e| Error::internal(e.to_string()))??,
                ) as Arc<dyn Log>,
                None,
                None,
            ),
        };
        let (log, lease, jetstream) = log;
        let session = Session::create(rt, &id, created_at, log);
        if let Some(lost) = lease {
            watch_lease(&session, lost, jetstream);
        }
        crate::host::recovery::watch(&session, self.stopped.clone());
        self.note_shared(&session).await;
        self.loaded()
            .insert(id, Arc::new(OnceCell::new_with(Some(session.clone()))));
        Ok(session)
    }

    /// The live session `id`, loading it from its ledger when it is not in
    /// memory yet (or was stopped by a storage failure a while ago).
    /// A session another replica writes is its read-only mirror here: its
    /// streams and reads are served, its writes refused naming the writer.
    pub async fn get(&self, id: &str) -> Result<Arc<Session>> {
        match self.find(id).await? {
            Located::Local(s) => Ok(s),
            Located::Remote(owner) => self.mirror(id, &owner).await,
        }
    }

    /// The mirror of `id` (opening it on first use); one whose live path
    /// ended is opened afresh.
    async fn mirror(&self, id: &str, owner: &Owner) -> Result<Arc<Session>> {
        let Some(client) = &self.rt.cfg.nats else {
            return Err(served_elsewhere(id, owner));
        };
        for _ in 0..2 {
            self.refuse_when_stopping()?;
            let cell = lock(&self.mirrors).entry(id.to_string()).or_default().clone();
            let opened = cell
                .get_or_try_init(|| {
                    let why = served_elsewhere(id, owner).message;
                    crate::cluster::mirror::open(self.rt.clone(), client.clone(), id, why)
                })
                .await
                .cloned();
            let forget = || {
                let mut map = lock(&self.mirrors);
                if map.get(id).is_some_and(|c| Arc::ptr_eq(c, &cell)) {
                    map.remove(id);
                }
            };
            match opened {
                Ok(s) if s.storage_failure().is_some() => forget(),
                Ok(s) => {
                    s.touch();
                    return Ok(s);
                }
                Err(e) => {
                    forget();
                    return Err(e);
                }
            }
        }
        Err(served_elsewhere(id, owner))
    }

    /// The live session `id` if this replica serves it (loading it, and
    /// taking its lease with `--bus`), else the replica that holds its lease.
    pub async fn find(&self, id: &str) -> Result<Located> {
        validate_session_id(id)?;
        loop {
            self.refuse_when_stopping()?;
            let cell = self.loaded().entry(id.to_string()).or_default().clone();
            let loaded = cell.get_or_try_init(|| self.load(id)).await.cloned();
            match loaded {
                Ok(session) => {
                    // Moved to another replica: looked up afresh at once.
                    // Any other failure answers for a while before a reload.
                    if session
                        .storage_failure()
                        .is_some_and(|(r, at)| r.moved() || at.elapsed() >= STORAGE_RETRY)
                    {
                        // Its writer has stopped: a fresh load continues from
                        // the last durable seq.
                        self.forget(id, &cell);
                        continue;
                    }
                    session.touch();
                    return Ok(Located::Local(session));
                }
                Err(LoadError::Elsewhere(owner)) => {
                    self.forget(id, &cell);
                    return Ok(Located::Remote(owner));
                }
                Err(LoadError::Failed(e)) => {
                    self.forget(id, &cell);
                    if e.kind == ErrorKind::NotFound {
                        self.index.remove(id);
                    }
                    return Err(e);
                }
            }
        }
    }

    /// Keeps the index entry of `session` in step with its live state.
    fn note(&self, session: &Session) {
        let info = session.info();
        self.index.upsert(Entry {
            session_id: info.session_id,
            created_at: info.created_at,
            title: info.title,
            latest_seq: info.latest_seq,
            usage: info.usage,
            workspace: info.workspace,
        });
    }

    /// `note`, and with `--bus` the shared index too (`shared_index.rs`),
    /// waited for: a listing made after this, on any replica, shows it.
    /// Only the session's holder calls this.
    async fn note_shared(&self, session: &Session) {
        self.note(session);
        let Some(shared) = &self.rt.cfg.shared_index else {
            return;
        };
        // The merged entry: a title once set is kept.
        if let Some(e) = self.index.get(session.id()) {
            if let Err(err) = shared.put(&e).await {
                tracing::warn!(session = session.id(), "{}", err.message);
            }
        }
    }

    /// Writes the index if it changed, off the runtime, from the index
    /// file's owner task (saves land in the order they were asked for).
    async fn save_index(&self) {
        let saved = self
            .index_file
            .change(|index| {
                let index = index.clone();
                Box::pin(async move { tokio::task::spawn_blocking(move || index.save()).await })
            })
            .await;
        match saved {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => tracing::warn!("cannot save the session index: {e}"),
            Ok(Err(e)) => tracing::warn!("cannot save the session index: {e}"),
            Err(e) => tracing::warn!("cannot save the session index: {e}"),
        }
    }

    /// Drops `cell` from the map if it is still the one for `id`.
    fn forget(&self, id: &str, cell: &Cell) {
        let mut map = self.loaded();
        if map.get(id).is_some_and(|c| Arc::ptr_eq(c, cell)) {
            map.remove(id);
        }
    }

    async fn load(&self, id: &str) -> std::result::Result<Arc<Session>, LoadError> {
        if let Some(client) = &self.rt.cfg.nats {
            // Written here only under the lease: a session whose holder is
            // alive is served there (a dead holder's lease is waited out).
            let lease = match &self.rt.cfg.owners {
                Some(owners) => match owners.claim_or_wait(id).await? {
                    Claim::Mine(lost) => Some((owners, lost)),
                    Claim::Theirs(owner) => return Err(LoadError::Elsewhere(owner)),
                },
                None => None,
            };
            let loaded = async {
                let log = Arc::new(JetStreamLog::open(client.clone(), id).await?);
                if let Some(owners) = &self.rt.cfg.owners {
                    // The first append under the lease: a stale holder's
                    // append that lands later is fenced, never this one.
                    log.write_as(owners.replica());
                    let mut note = Batch::default();
                    note.push(&Record::Lease {
                        replica: owners.replica().to_string(),
                        revision: owners.revision(id).unwrap_or(0),
                    });
                    let l = log.clone();
                    tokio::task::spawn_blocking(move || l.take_over(&note))
                        .await
                        .map_err(|e| Error::internal(e.to_string()))?
                        .map_err(|e| storage_error(&e))?;
                }
                let mut records = log.records().await?;
                if records.is_empty() {
                    return Err(Error::not_found(format!("no session {id}")));
                }
                crate::cluster::shared_index::restore_header(
                    self.rt.cfg.shared_index.as_deref(),
                    id,
                    &mut records,
                )
                .await;
                let rt = self.rt.clone();
                let l: Arc<dyn Log> = log.clone();
                let session = tokio::task::spawn_blocking(move || Session::restore_records(rt, l, records))
                    .await
                    .map_err(|e| Error::internal(e.to_string()))??;
                Ok::<_, Error>((session, log))
            }
            .await;
            let loaded = match (loaded, lease) {
                (Ok((s, log)), Some((_, lost))) => {
                    watch_lease(&s, lost, Some(log));
                    s
                }
                (Ok((s, _)), None) => s,
                (Err(e), lease) => {
                    if let Some((owners, _)) = lease {
                        owners.release(id).await;
                    }
                    return Err(e.into());
                }
            };
            tracing::info!(session = %id, latest_seq = loaded.latest_seq(), "session loaded from JetStream");
            crate::host::recovery::watch(&loaded, self.stopped.clone());
            self.note_shared(&loaded).await;
            return Ok(loaded);
        }
        let path = self.ledger_path(id);
        let rt = self.rt.clone();
        let runtimes = self.runtimes.clone();
        let workspaces = self.workspaces.clone();
        let sid = id.to_string();
        let dir = self.rt.cfg.sessions_dir();
        let known = self.index.get(id);
        let loaded = tokio::task::spawn_blocking(move || {
            let remembered = known.as_ref().map(|e| Remembered {
                created_at: e.created_at.clone(),
                workspace: e.workspace.clone(),
            });
            match repair::check_header(&path, &sid, remembered.as_ref()) {
                Ok(_) => {}
                Err(Unrepairable::Io(_)) if !path.exists() => {
                    return Err(Error::not_found(format!("no session {sid}")));
                }
                Err(Unrepairable::Io(e)) => return Err(e),
                Err(Unrepairable::Damaged(why)) => return Err(set_aside(&path, &sid, &why)),
            }
            let recorded = known.map_or(0, |e| e.latest_seq);
            let primary = rt.clone();
            let pick = move |ws: &str| reloaded_runtime(&runtimes, &primary, &workspaces, ws);
            let session = match Session::restore_in(rt, &path, recorded, pick) {
                Ok(session) => session,
                Err(OpenError::Io(_)) if !path.exists() => {
                    return Err(Error::not_found(format!("no session {sid}")));
                }
                Err(OpenError::Io(e)) => return Err(e),
                Err(OpenError::Corrupt(why)) => return Err(set_aside(&path, &sid, &why)),
            };
            session.set_title(lifecycle::read_title(&dir, &sid));
            tracing::info!(
                session = %sid,
                latest_seq = session.latest_seq(),
                "session loaded from its ledger"
            );
            Ok(session)
        })
        .await
        .map_err(|e| Error::internal(e.to_string()))??;
        crate::host::recovery::watch(&loaded, self.stopped.clone());
        self.note(&loaded);
        Ok(loaded)
    }

    /// Explicit attach: the same as `get`, named for the API.
    pub async fn attach(&self, id: &str) -> Result<Arc<Session>> {
        self.get(id).await
    }

    /// Deletes session `id`: refused (conflict) while a run is live; its
    /// streams end with session_closed {reason: "deleted"}, its ledger moves
    /// to the home's trash, it leaves the listing, and the id is not found
    /// from then on.
    pub async fn delete(&self, id: &str) -> Result<()> {
        if let Some(client) = self.rt.cfg.nats.clone() {
            return self.delete_shared(id, &client).await;
        }
        let s = self.get(id).await?;
        s.begin_delete()?;
        s.close_streams(CloseReason::Deleted).await;
        let (home, dir, sid) = (
            self.rt.cfg.home.clone(),
            self.rt.cfg.sessions_dir(),
            id.to_string(),
        );
        let moved = tokio::task::spawn_blocking(move || lifecycle::move_to_trash(&home, &dir, &sid))
            .await
            .map_err(|e| Error::internal(e.to_string()))?;
        // Dropped from the map only after the move: until then a concurrent
        // use finds the deleted session (which refuses input), never a
        // reload of the ledger. Also after a failed move, so the next use
        // loads the session again as it is on disk.
        {
            let mut map = self.loaded();
            if map
                .get(id)
                .is_some_and(|c| c.get().is_some_and(|live| Arc::ptr_eq(live, &s)))
            {
                map.remove(id);
            }
        }
        let to = moved?;
        self.index.remove(id);
        self.rt.search().delete(id);
        self.save_index().await;
        tracing::info!(session = id, trash = %to.display(), "session deleted");
        Ok(())
    }

    /// `delete` with `--bus`, on the replica holding the session (a delete
    /// sent elsewhere is forwarded here): its subject is purged from the
    /// stream (there is no trash), its summary leaves the shared index, and
    /// then its lease is given back, so until the purge is done nobody else
    /// loads it, and after it a load finds no session (404). Other
    /// replicas' mirrors find the subject empty and close their streams
    /// with `deleted` too (`mirror.rs`).
    async fn delete_shared(&self, id: &str, client: &async_nats::Client) -> Result<()> {
        let s = match self.find(id).await? {
            Located::Local(s) => s,
            Located::Remote(owner) => return Err(served_elsewhere(id, &owner)),
        };
        s.begin_delete()?;
        s.close_streams(CloseReason::Deleted).await;
        let purged = crate::cluster::jetstream::purge_session(client, id).await;
        if purged.is_ok() {
            if let Some(shared) = &self.rt.cfg.shared_index {
                if let Err(e) = shared.remove(id).await {
                    tracing::warn!(session = id, "{}", e.message);
                }
            }
        }
        // Dropped from the map (as after a failed move to the trash, the
        // next use loads what the stream still holds).
        let cell = self.loaded().get(id).cloned();
        if let Some(cell) = cell {
            self.forget(id, &cell);
        }
        if let Some(owners) = &self.rt.cfg.owners {
            owners.release(id).await;
        }
        purged?;
        self.index.remove(id);
        self.rt.search().delete(id);
        self.save_index().await;
        tracing::info!(
            session = id,
            "session deleted: its subject purged from the stream"
        );
        Ok(())
    }

    /// Gives session `id` a title of the client's choosing (kept in
    /// `sessions/<id>.title`, so it survives restarts and index rebuilds).
    pub async fn rename(&self, id: &str, title: &str) -> Result<SessionInfo> {
        let title = lifecycle::validate_title(title)?;
        // Only the holder renames (a forwarded rename reaches it): a title
        // kept by a replica that does not write the session would diverge.
        let s = match self.find(id).await? {
            Located::Local(s) => s,
            Located::Remote(owner) => return Err(served_elsewhere(id, &owner)),
        };
        let (dir, sid, t) = (self.rt.cfg.sessions_dir(), id.to_string(), title.clone());
        tokio::task::spawn_blocking(move || lifecycle::write_title(&dir, &sid, &t))
            .await
            .map_err(|e| Error::internal(e.to_string()))??;
        s.set_title(Some(title));
        self.note_shared(&s).await;
        self.save_index().await;
        Ok(s.info())
    }

    /// A new session whose history is `id`'s up to `at_seq` (absent: its
    /// latest, refused while a run is live): the same events under the same
    /// seqs, then its own from at_seq + 1. Returns it and the seq it was cut at.
    pub async fn fork(&self, id: &str, at_seq: Option<u64>) -> Result<(Arc<Session>, u64)> {
        self.refuse_when_stopping()?;
        if let Some(client) = self.rt.cfg.nats.clone() {
            return self.fork_shared(id, at_seq, &client).await;
        }
        let parent = self.get(id).await?;
        let at = fork_point(&parent, id, at_seq)?;
        // Everything up to `at` is in the ledger file before it is copied.
        parent.flush().await?;
        let child = uuid::Uuid::new_v4().simple().to_string();
        let created_at = humantime::format_rfc3339_seconds(SystemTime::now()).to_string();
        let (from, to, cid) = (self.ledger_path(id), self.ledger_path(&child), child.clone());
        // The fork keeps its parent's workspace.
        let ws = parent.workspace().to_string();
        tokio::task::spawn_blocking(move || lifecycle::fork_ledger(&from, &to, &cid, &created_at, &ws, at))
            .await
            .map_err(|e| Error::internal(e.to_string()))??;
        let forked = self.get(&child).await?;
        // The parent's messages the fork copied are its hits too.
        self.rt.search().catch_up(&child);
        self.save_index().await;
        tracing::info!(session = %child, parent = id, at_seq = at, "session forked");
        Ok((forked, at))
    }

    /// `fork` with `--bus`, on any replica (a fork only reads its parent):
    /// the parent's records up to `at` as the stream holds them (what a
    /// file fork copies: events and the notes after them, not admissions or
    /// snapshots) are appended under a new header to a new subject, which
    /// this replica then loads, taking its lease.
    async fn fork_shared(
        &self,
        id: &str,
        at_seq: Option<u64>,
        client: &async_nats::Client,
    ) -> Result<(Arc<Session>, u64)> {
        let parent = match self.find(id).await? {
            Located::Local(s) => {
                // Everything up to `at` is in the stream before it is read.
                s.flush().await?;
                s
            }
            // A mirror shows only what the stream stored.
            Located::Remote(owner) => self.mirror(id, &owner).await?,
        };
        let at = fork_point(&parent, id, at_seq)?;
        let records = JetStreamLog::open(client.clone(), id).await?.records().await?;
        let child = uuid::Uuid::new_v4().simple().to_string();
        let mut batch = Batch::default();
        batch.push(&Record::Header {
            session_id: child.clone(),
            created_at: humantime::format_rfc3339_seconds(SystemTime::now()).to_string(),
            workspace: parent.workspace().to_string(),
        });
        for r in &records {
            match r {
                Record::Event { seq, .. } if *seq > at => break,
                Record::Event { .. }
                | Record::Usage(_)
                | Record::Signature { .. }
                | Record::Compaction(_)
                | Record::Undo(_)
                | Record::Lost { .. } => batch.push(r),
                Record::Header { .. }
                | Record::Admitted { .. }
                | Record::Snapshot(_)
                | Record::Lease { .. } => {}
            }
        }
        // Nobody knows the new id yet: no lease is needed to write it, and
        // the first use below takes it.
        let log = Arc::new(JetStreamLog::open(client.clone(), &child).await?);
        tokio::task::spawn_blocking(move || log.append(&batch))
            .await
            .map_err(|e| Error::internal(e.to_string()))?
            .map_err(|e| storage_error(&e))?;
        let forked = self.get(&child).await?;
        self.save_index().await;
        tracing::info!(session = %child, parent = id, at_seq = at, "session forked into a new subject");
        Ok((forked, at))
    }

    /// Unloads sessions nobody has used for `unload_idle_after`: no run,
    /// no subscriber, no other holder. Their ledgers keep everything; the
    /// next use loads them again.
    pub async fn unload_idle(&self) -> usize {
        let idle = self.rt.cfg.unload_idle_after;
        // A mirror holds no lease and writes nothing: dropping it is enough
        // (its follower ends with it).
        lock(&self.mirrors).retain(|_, c| {
            !c.get()
                .is_some_and(|s| Arc::strong_count(s) == 1 && s.is_idle(idle))
        });
        let candidates: Vec<(String, Cell)> = self
            .loaded()
            .iter()
            .filter(|(_, c)| c.get().is_some_and(|s| s.is_idle(idle)))
            .map(|(id, c)| (id.clone(), c.clone()))
            .collect();
        let mut unloaded = 0;
        for (id, cell) in candidates {
            let Some(session) = cell.get().cloned() else {
                continue;
            };
            // Everything it published is on disk before it goes.
            if session.flush().await.is_err() {
                continue;
            }
            let removed = {
                let mut map = self.loaded();
                // Only the cell and `session` hold it: nobody can publish into it.
                let unused = Arc::strong_count(&session) == 2 && session.is_idle(idle);
                unused && map.get(&id).is_some_and(|c| Arc::ptr_eq(c, &cell)) && map.remove(&id).is_some()
            };
            if removed {
                self.note_shared(&session).await;
                unloaded += 1;
                // Everything it wrote is durable: another replica may take it.
                if let Some(owners) = &self.rt.cfg.owners {
                    owners.release(&id).await;
                }
            }
        }
        if unloaded > 0 {
            tracing::debug!(unloaded, "idle sessions unloaded");
            self.save_index().await;
        }
        unloaded
    }

    /// Unloads idle sessions now and then, until shutdown.
    pub async fn housekeep(self: Arc<Self>) {
        if let Some(stopped) = lock(&self.stopped_rx).take() {
            tokio::spawn(crate::host::recovery::run(self.clone(), stopped));
        }
        if self.rt.cfg.owners.is_some() {
            tokio::spawn(self.clone().adopt_orphans());
        }
        let every =
            (self.rt.cfg.unload_idle_after / 2).clamp(Duration::from_millis(500), Duration::from_secs(30));
        loop {
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = self.closing.cancelled() => return,
            }
            if self.stopping.load(Ordering::Acquire) {
                return;
            }
            self.unload_idle().await;
        }
    }

    /// Every session in memory with the clients attached to it, by id.
    pub fn presence(&self) -> Vec<(SessionInfo, Vec<crate::session::live::Client>)> {
        let mut out: Vec<_> = self
            .live()
            .into_iter()
            .map(|s| (s.info(), s.watch_presence().borrow().clone()))
            .collect();
        out.sort_by(|a, b| a.0.session_id.cmp(&b.0.session_id));
        out
    }

    /// The stream ids of the live multiplexed streams, sorted.
    pub fn stream_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = lock(&self.streams).keys().cloned().collect();
        ids.sort();
        ids
    }

    /// Once a lease age, every mirror whose writer answers no ping is
    /// looked up as a request would (`find`: the lease is waited out and
    /// taken), so the readers of a session whose writer died see its run
    /// settled without waiting for another request. Until shutdown.
    async fn adopt_orphans(self: Arc<Self>) {
        let Some(owners) = self.rt.cfg.owners.clone() else {
            return;
        };
        let adopting = Arc::new(Mutex::new(std::collections::HashSet::<String>::new()));
        loop {
            tokio::select! {
                _ = tokio::time::sleep(owners.ttl()) => {}
                _ = self.closing.cancelled() => return,
            }
            if self.stopping.load(Ordering::Acquire) {
                return;
            }
            let followed: Vec<String> = lock(&self.mirrors)
                .iter()
                .filter(|(_, c)| c.get().is_some())
                .map(|(id, _)| id.clone())
                .collect();
            for id in followed {
                if self.loaded().get(&id).is_some_and(|c| c.get().is_some())
                    || !lock(&adopting).insert(id.clone())
                {
                    continue;
                }
                let (hub, owners, adopting) = (self.clone(), owners.clone(), adopting.clone());
                tokio::spawn(async move {
                    let silent = match owners.claim_checked(&id).await {
                        Ok(Claim::Theirs(o)) => !owners.alive(&o).await,
                        // Free (and now ours): load it under the lease.
                        Ok(Claim::Mine(_)) => true,
                        Err(_) => false,
                    };
                    if silent {
                        match hub.find(&id).await {
                            Ok(Located::Local(_)) => {
                                tracing::info!(session = %id, "took over a session whose writer stopped answering")
                            }
                            Ok(Located::Remote(o)) => {
                                tracing::debug!(session = %id, writer = %o.replica, "another replica took it over")
                            }
                            Err(e) => tracing::debug!(session = %id, "taking over later: {}", e.message),
                        }
                    }
                    lock(&adopting).remove(&id);
                });
            }
        }
    }

    /// Whether session `id` is loaded here with its writer stopped.
    pub(crate) fn stopped_here(&self, id: &str) -> bool {
        let session = self.loaded().get(id).and_then(|c| c.get().cloned());
        session.is_some_and(|s| s.storage_failure().is_some())
    }

    /// Whether shutdown has begun.
    pub(crate) fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    /// How many sessions are in memory.
    pub fn loaded_count(&self) -> usize {
        self.loaded().len()
    }

    /// Sessions stopped by a storage failure right now, with its reason.
    pub fn storage_failures(&self) -> Vec<(String, Stopped)> {
        self.live()
            .into_iter()
            .filter_map(|s| s.storage_failure().map(|(r, _)| (s.id().to_string(), r)))
            .collect()
    }

    /// Every persisted session, newest first; loaded ones report live state.
    pub async fn list(&self) -> Result<Vec<SessionInfo>> {
        let mut entries = self.index.list();
        if let Some(shared) = &self.rt.cfg.shared_index {
            entries = merge_shared(entries, shared.list().await?);
        }
        let mut out: Vec<SessionInfo> = entries
            .into_iter()
            .map(|e| {
                let live = self.loaded().get(&e.session_id).and_then(|c| c.get().cloned());
                let mirrored = lock(&self.mirrors)
                    .get(&e.session_id)
                    .and_then(|c| c.get().cloned());
                match (live, mirrored) {
                    (Some(s), _) => s.info(),
                    // Written elsewhere, followed here: its seq is live, its
                    // title the holder's (a rename is not in the log).
                    (None, Some(m)) => {
                        let info = m.info();
                        SessionInfo {
                            latest_seq: info.latest_seq.max(e.latest_seq),
                            title: if e.title.is_empty() {
                                info.title.clone()
                            } else {
                                e.title
                            },
                            loaded: false,
                            ..info
                        }
                    }
                    (None, None) => SessionInfo {
                        session_id: e.session_id,
                        created_at: e.created_at,
                        title: e.title,
                        latest_seq: e.latest_seq,
                        loaded: false,
                        busy: false,
                        usage: e.usage,
                        workspace: e.workspace,
                    },
                }
            })
            .collect();
        out.sort_by(|a, b| {
            b.created_at
                .cmp(&a.created_at)
                .then(a.session_id.cmp(&b.session_id))
        });
        Ok(out)
    }

    /// Graceful stop: every loaded session refuses new input, cancels its
    /// run, settles, closes its streams and syncs its ledger.
    pub async fn shutdown(&self, grace: Duration) {
        self.stopping.store(true, Ordering::Release);
        let sessions = self.live();
        let mut tasks = Vec::new();
        for s in sessions {
            tasks.push(tokio::spawn(async move { s.shutdown(grace).await }));
        }
        for t in tasks {
            let _ = t.await;
        }
        let live = self.live();
        // At once, and bounded: NATS may be what is going away.
        let shared = futures_util::future::join_all(live.iter().map(|s| self.note_shared(s)));
        if tokio::time::timeout(SHARE_AT_SHUTDOWN, shared).await.is_err() {
            tracing::warn!("the shared session index was not brought up to date before the stop");
        }
        self.save_index().await;
        // After the sessions: their last runs' messages are queued by now.
        self.rt.search().close().await;
        // Every session is settled and synced: the leases go back, so
        // another replica takes these sessions without waiting them out.
        if let Some(owners) = &self.rt.cfg.owners {
            owners.release_all().await;
        }
        self.closing.cancel();
    }
}

/// The local index entries and the shared index's (`--bus`), one per
/// session: the shared summary is the holder's, so its title wins; the
/// seq never moves back.
fn merge_shared(mine: Vec<Entry>, shared: Vec<Entry>) -> Vec<Entry> {
    let mut by_id: HashMap<String, Entry> = mine.into_iter().map(|e| (e.session_id.clone(), e)).collect();
    for e in shared {
        match by_id.get_mut(&e.session_id) {
            Some(m) => {
                m.latest_seq = m.latest_seq.max(e.latest_seq);
                if !e.title.is_empty() {
                    m.title = e.title;
                }
            }
            None => {
                by_id.insert(e.session_id.clone(), e);
            }
        }
    }
    by_id.into_values().collect()
}

/// Stops `session` writing once its lease is lost (the watch turns
/// `Some(reason)`); ends quietly when the lease is released or the session goes.
/// Where a fork of `parent` is cut: `at_seq` (at most its latest seq), or
/// its latest, refused while a run is live.
fn fork_point(parent: &Session, id: &str, at_seq: Option<u64>) -> Result<u64> {
    let latest = parent.latest_seq();
    match at_seq {
        Some(at) if at > latest => Err(Error::invalid(format!(
            "at_seq {at} is past the session's latest seq {latest}"
        ))),
        Some(at) => Ok(at),
        None if parent.is_busy() => Err(Error::conflict(format!(
            "session {id} has a live run; give at_seq or wait for run_finished"
        ))),
        None => Ok(latest),
    }
}

/// `log` (the session's, with `--bus`) gives up an append it is retrying
/// at once: nothing more of this replica's lands after the lease is lost.
fn watch_lease(
    session: &Arc<Session>,
    mut lost: tokio::sync::watch::Receiver<Option<Stopped>>,
    log: Option<Arc<JetStreamLog>>,
) {
    let weak = Arc::downgrade(session);
    tokio::spawn(async move {
        let Ok(reason) = lost.wait_for(|r| r.is_some()).await.map(|r| r.clone()) else {
            return;
        };
        // The lost lease's reason first: it is what the streams end with.
        if let (Some(s), Some(reason)) = (weak.upgrade(), reason) {
            s.stop_writing(&reason);
        }
        if let Some(log) = log {
            log.stop();
        }
    });
}

/// Moves an unusable ledger out of the way (`sessions/corrupt/`), so the id
/// answers 404 from now on instead of failing on every request.
fn set_aside(path: &std::path::Path, id: &str, why: &str) -> Error {
    let dir = path.with_file_name("corrupt");
    let stamp = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let to = dir.join(format!("{id}.{stamp}.jsonl"));
    let moved = crate::home::create_private_dir(&dir).and_then(|()| std::fs::rename(path, &to));
    match moved {
        Ok(()) => {
            tracing::error!(session = id, moved_to = %to.display(), "{why}: the ledger was set aside");
            Error::not_found(format!(
                "no session {id}: its ledger was unusable ({why}) and was set aside"
            ))
        }
        Err(e) => {
            tracing::error!(session = id, "{why}; setting it aside failed: {e}");
            Error::new(
                ErrorKind::Unavailable,
                format!("session {id}: unusable ledger ({why})"),
            )
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::ClientEvent;

    fn hub(home: &std::path::Path, tweak: impl FnOnce(&mut CoreConfig)) -> Arc<Hub> {
        let mut cfg = CoreConfig::new(home.to_path_buf(), home.to_path_buf());
        tweak(&mut cfg);
        Arc::new(Hub::new(cfg, Route::offline()).unwrap())
    }

    #[test]
    fn the_shared_index_adds_other_replicas_sessions_and_the_holders_title_wins() {
        let e = |id: &str, title: &str, seq: u64| Entry {
            session_id: id.into(),
            created_at: "2026-12-02T00:00:00Z".into(),
            title: title.into(),
            latest_seq: seq,
            usage: Default::default(),
            workspace: String::new(),
        };
        let mine = vec![e("a", "old", 9), e("b", "kept", 3)];
        let shared = vec![e("a", "renamed", 4), e("b", "", 5), e("c", "theirs", 1)];
        let mut merged = merge_shared(mine, shared);
        merged.sort_by(|x, y| x.session_id.cmp(&y.session_id));
        assert_eq!(
            merged,
            vec![e("a", "renamed", 9), e("b", "kept", 5), e("c", "theirs", 1)]
        );
    }

    async fn session_with_history(home: &std::path::Path, events: usize) -> String {
        let h = hub(home, |_| {});
        let s = h.create().await.unwrap();
        for i in 0..events {
            s.publish(ClientEvent::TextDelta {
                text: format!("{i} "),
            });
        }
        s.flush().await.unwrap();
        h.shutdown(Duration::from_secs(5)).await;
        s.id().to_string()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_first_loads_share_one_load_and_one_live_session() {
        let home = tempfile::tempdir().unwrap();
        let id = session_with_history(home.path(), 20_000).await;
        let h = hub(home.path(), |_| {});
        let gets: Vec<_> = (0..32)
            .map(|_| {
                let (h, id) = (h.clone(), id.clone());
                tokio::spawn(async move { h.get(&id).await.unwrap() })
            })
            .collect();
        // While the big ledger loads, other requests are not held up by it.
        let other = h.create().await.unwrap();
        assert_eq!(other.latest_seq(), 0);
        let mut sessions = Vec::new();
        for g in gets {
            sessions.push(g.await.unwrap());
        }
        assert!(
            sessions.iter().all(|s| Arc::ptr_eq(s, &sessions[0])),
            "one live state"
        );
        assert_eq!(sessions[0].latest_seq(), 20_000);
        assert_eq!(h.loaded_count(), 2);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_reload_reads_from_the_last_snapshot_and_equals_the_live_session() {
        let home = tempfile::tempdir().unwrap();
        let small = |c: &mut CoreConfig| c.snapshot_min_bytes = 64 * 1024;
        let h = hub(home.path(), small);
        let s = h.create().await.unwrap();
        for round in 0..20 {
            let admitted = s
                .admit(format!("round {round}\n/burst 1000"), None)
                .await
                .unwrap();
            assert_ne!(admitted.state, crate::session::live::AdmissionState::Duplicate);
            // Let the round finish before the next, so each is its own run.
            let mut busy = s.subscribe(Some(admitted.after_seq));
            loop {
                match busy.recv().await {
                    Some(crate::stream::delivery::Delivery::Frame(f))
                        if matches!(f.event, ClientEvent::RunFinished { .. }) =>
                    {
                        break
                    }
                    Some(_) => {}
                    None => panic!("the stream ended"),
                }
            }
        }
        s.flush().await.unwrap();
        let (transcript, timeline, latest) = (s.transcript(), s.timeline(), s.latest_seq());
        let id = s.id().to_string();
        drop(s);
        h.shutdown(Duration::from_secs(5)).await;

        let path = home.path().join("sessions").join(format!("{id}.jsonl"));
        let lines = std::fs::read_to_string(&path).unwrap().lines().count();
        let snapshots = std::fs::read_to_string(&path)
            .unwrap()
            .lines()
            .filter(|l| l.starts_with("{\"snapshot\":"))
            .count();
        assert!(snapshots >= 2, "{snapshots} snapshots in {lines} lines");
        let mut visited = 0;
        Ledger::open(&path, crate::Durability::Process, |_| visited += 1).unwrap();
        // A load starts at the last snapshot, and the policy keeps what
        // follows it under four times that snapshot's size (plus the batch
        // that made the next one due, at most a round here).
        let text = std::fs::read_to_string(&path).unwrap();
        let all: Vec<&str> = text.lines().collect();
        let last = all.iter().rposition(|l| l.starts_with("{\"snapshot\":")).unwrap();
        assert_eq!(
            visited,
            1 + lines - last,
            "a load parses the header, the last snapshot and what follows it"
        );
        let after: usize = all[last + 1..].iter().map(|l| l.len() + 1).sum();
        assert!(
            after < 4 * all[last].len() + 64 * 1024,
            "{after} bytes after a snapshot of {}",
            all[last].len()
        );

        let h = hub(home.path(), small);
        let again = h.get(&id).await.unwrap();
        assert_eq!(again.latest_seq(), latest);
        assert_eq!(again.transcript(), transcript);
        assert_eq!(again.timeline(), timeline);
        // Request ids from before the snapshot are still remembered.
        let first = &transcript.messages[0];
        assert_eq!(first.role, crate::log::transcript::Role::User);
        let dup = again
            .admit("again".into(), Some(first_request_id(&again)))
            .await
            .unwrap();
        assert_eq!(dup.state, crate::session::live::AdmissionState::Duplicate);
        // And the session goes on from there.
        let next = again.admit("after".into(), None).await.unwrap();
        assert_eq!(next.after_seq, latest);
    }

    /// The request id of the session's first run, from its timeline.
    fn first_request_id(s: &Session) -> String {
        s.timeline()
            .items
            .iter()
            .find(|i| !i.request_id.is_empty())
            .map(|i| i.request_id.clone())
            .expect("a user input item carries its request id")
    }

    #[tokio::test]
    async fn an_idle_session_is_unloaded_and_loads_again_on_use() {
        let home = tempfile::tempdir().unwrap();
        let h = hub(home.path(), |c| c.unload_idle_after = Duration::ZERO);
        let s = h.create().await.unwrap();
        s.publish(ClientEvent::TextDelta { text: "kept".into() });
        s.flush().await.unwrap();
        let id = s.id().to_string();
        let sub = s.subscribe(None);
        drop(s);
        assert_eq!(h.unload_idle().await, 0, "a subscriber keeps it loaded");
        drop(sub);
        assert_eq!(h.unload_idle().await, 1);
        assert_eq!(h.loaded_count(), 0);
        let again = h.get(&id).await.unwrap();
        assert_eq!(again.latest_seq(), 1);
        assert_eq!(again.transcript().messages[0].text, "kept");
    }

    #[tokio::test]
    async fn nothing_is_created_or_loaded_once_shutdown_began() {
        let home = tempfile::tempdir().unwrap();
        let id = session_with_history(home.path(), 1).await;
        let h = hub(home.path(), |_| {});
        h.shutdown(Duration::from_secs(1)).await;
        let created = h.create().await.map(|_| ()).unwrap_err();
        assert_eq!(created.kind, ErrorKind::Unavailable);
        let loaded = h.get(&id).await.map(|_| ()).unwrap_err();
        assert_eq!(loaded.kind, ErrorKind::Unavailable);
    }

    #[tokio::test]
    async fn an_unusable_ledger_is_set_aside_and_answers_not_found() {
        let home = tempfile::tempdir().unwrap();
        let h = hub(home.path(), |_| {});
        let dir = h.config().sessions_dir();
        std::fs::write(dir.join("empty.jsonl"), b"").unwrap();
        std::fs::write(dir.join("garbled.jsonl"), b"{not json\n").unwrap();
        for id in ["empty", "garbled"] {
            let e = h.get(id).await.map(|_| ()).unwrap_err();
            assert_eq!(e.kind, ErrorKind::NotFound, "{e}");
            assert!(e.message.contains("set aside"), "{e}");
            assert!(!dir.join(format!("{id}.jsonl")).exists());
            let e = h.get(id).await.map(|_| ()).unwrap_err();
            assert_eq!(e.kind, ErrorKind::NotFound);
        }
        let aside = std::fs::read_dir(dir.join("corrupt")).unwrap().count();
        assert_eq!(aside, 2, "kept for a person to look at");
    }

    #[tokio::test]
    async fn thinking_signatures_and_usage_survive_a_reload_beside_the_events_they_follow() {
        use crate::event::AgentEvent;
        use crate::provider::{ChatMessage, Thinking, TokenUsage};
        let home = tempfile::tempdir().unwrap();
        let h = hub(home.path(), |_| {});
        let s = h.create().await.unwrap();
        let id = s.id().to_string();
        let usage = TokenUsage {
            input_tokens: 5,
            output_tokens: 3,
            cache_read_tokens: 2,
            cache_write_tokens: 1,
        };
        // One batch as the writer may see it: two signed blocks and their usage.
        for (thinking, sig) in [("a", "sig-a"), ("b", "sig-b")] {
            s.publish(ClientEvent::ThinkingDelta {
                text: thinking.into(),
            });
            s.emit(AgentEvent::ThinkingSignature(sig.into()));
            s.publish(ClientEvent::TextDelta { text: "t".into() });
            s.emit(AgentEvent::Usage(usage));
        }
        s.flush().await.unwrap();
        let live = s.transcript();
        h.shutdown(Duration::from_secs(5)).await;
        drop(s);

        let h = hub(home.path(), |_| {});
        let reloaded = h.get(&id).await.unwrap().transcript();
        assert_eq!(reloaded, live);
        let signed: Vec<Thinking> = reloaded
            .chat()
            .into_iter()
            .flat_map(|m| match m {
                ChatMessage::Assistant { thinking, .. } => thinking,
                _ => vec![],
            })
            .collect();
        let sigs: Vec<_> = signed
            .iter()
            .map(|t| (t.text.as_str(), t.signature.as_str()))
            .collect();
        assert_eq!(sigs, [("a", "sig-a"), ("b", "sig-b")]);
        assert_eq!(reloaded.usage.cache_read_tokens, 4);
    }
}
