//! The registry of live sessions: creates sessions, lists them from disk, and keeps exactly one live state per loaded session (loading a persisted one on first use, unloading an idle one), until shutdown.
//!
//! The map of loaded sessions is locked only to find or insert a cell;
//! loading a ledger happens outside it, on a blocking thread, and concurrent
//! first accesses to one session share one load (`OnceCell`). Loading is in
//! `registry/load.rs`; delete, rename and fork in `registry/lifecycle.rs`.

mod adopt;
mod lifecycle;
mod load;

use crate::cluster::jetstream::JetStreamLog;
use crate::cluster::owners::{Claim, Owner};
use crate::error::{Error, ErrorKind, Result};
use crate::host::index::{Entry, Index};
use crate::host::runtimes::Runtimes;
use crate::host::workspaces::OpenWorkspace;
use crate::ids::validate_session_id;
use crate::log::ledger::{storage_error, Batch, Ledger, Log, Record};
use crate::session::live::{Client, Session, SessionInfo};
use crate::session::runtime::Runtime;
use crate::stopped::Stopped;
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};
use tokio::sync::{mpsc, OnceCell};
use tokio_util::sync::CancellationToken;

/// How long a session stopped by a storage failure answers with that
/// failure before the next use tries to reload it from its ledger.
const STORAGE_RETRY: Duration = Duration::from_secs(1);

/// How long a stopping server spends bringing the shared session index
/// up to date (`--bus`).
const SHARE_AT_SHUTDOWN: Duration = Duration::from_secs(5);

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

pub struct Registry {
    /// The server's own workspace's runtime (`runtimes.primary()`).
    rt: Arc<Runtime>,
    /// The runtimes of sessions in other workspaces.
    runtimes: Arc<Runtimes>,
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
    /// Cancelled once the hub has shut down.
    closing: CancellationToken,
    /// Ids of sessions whose writer stopped, for `recovery::run` (which
    /// the hub's `housekeep` starts with the receiver).
    stopped: mpsc::UnboundedSender<String>,
    /// Every session's dev servers (stopped with their session).
    launches: Arc<crate::host::launch::Launches>,
    /// What else a delete removes (the children table: a session's
    /// children, or a child's worktree), set once by the hub.
    on_delete: std::sync::OnceLock<std::sync::Weak<dyn DeleteHook>>,
}

/// Told when a session is being deleted (it refuses input already), before
/// its streams close: what it owns elsewhere goes with it.
pub(crate) trait DeleteHook: Send + Sync + 'static {
    fn deleting<'a>(&'a self, id: &'a str) -> futures_util::future::BoxFuture<'a, ()>;
}

/// Sends `session`'s id to `stopped` when its writer stops (ends quietly
/// when the session is dropped first).
//
// `stopped` is unbounded on purpose: each loaded session's watcher sends
// at most one id per stop, and `recovery::run` only spawns per id, so the
// queue drains as fast as it fills; a bound would only park watchers until
// `housekeep` starts `run` (never, in a hub that does not housekeep).
fn report_stop(session: &Arc<Session>, stopped: mpsc::UnboundedSender<String>) {
    let mut rx = session.watch_stopped();
    let id = session.id().to_string();
    tokio::spawn(async move {
        if rx.wait_for(|s| *s).await.is_ok() {
            let _ = stopped.send(id);
        }
    });
}

impl Registry {
    /// A registry of the sessions in `index`; the receiver gets the id of
    /// every session whose writer stops (for `recovery::run`).
    pub(crate) fn new(
        runtimes: Arc<Runtimes>,
        index: Arc<Index>,
        closing: CancellationToken,
    ) -> (Registry, mpsc::UnboundedReceiver<String>) {
        let (stopped, stopped_rx) = mpsc::unbounded_channel();
        let registry = Registry {
            rt: runtimes.primary().clone(),
            runtimes,
            sessions: Mutex::new(HashMap::new()),
            mirrors: Mutex::new(HashMap::new()),
            index_file: crate::file_owner::FileOwner::new("the session index", index.clone()),
            index,
            stopping: AtomicBool::new(false),
            closing,
            stopped,
            launches: Arc::default(),
            on_delete: std::sync::OnceLock::new(),
        };
        (registry, stopped_rx)
    }

    /// Resolves once the hub has shut down (every session closed).
    pub(crate) async fn closed(&self) {
        self.closing.cancelled().await
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

    /// Every session's dev servers.
    pub fn launches(&self) -> &Arc<crate::host::launch::Launches> {
        &self.launches
    }

    /// Session `id` when it is in memory now (never loads it).
    pub(crate) fn loaded_session(&self, id: &str) -> Option<Arc<Session>> {
        self.loaded().get(id).and_then(|c| c.get().cloned())
    }

    /// Every session in memory now (loads in flight are not).
    pub(crate) fn live(&self) -> Vec<Arc<Session>> {
        let mut out: Vec<Arc<Session>> = self.loaded().values().filter_map(|c| c.get().cloned()).collect();
        out.extend(lock(&self.mirrors).values().filter_map(|c| c.get().cloned()));
        out
    }

    /// Session `id`'s title: live when it is loaded (the index catches up
    /// when it unloads), else the index's; empty when neither knows it.
    pub(crate) fn title(&self, id: &str) -> String {
        let live = self.loaded().get(id).and_then(|c| c.get().cloned());
        match live {
            Some(s) => s.info().title,
            None => self.index.get(id).map(|e| e.title).unwrap_or_default(),
        }
    }

    pub async fn create(&self) -> Result<Arc<Session>> {
        self.create_in(None).await
    }

    /// A new session in `workspace` (an open one; None: the server's own),
    /// which it keeps: its tools work there, its rules and memory are that
    /// workspace's, and its ledger header names it, so a reload finds it.
    /// An untrusted workspace is refused: the agent runs programs there.
    pub async fn create_in(&self, workspace: Option<OpenWorkspace>) -> Result<Arc<Session>> {
        self.create_as(workspace, uuid::Uuid::new_v4().simple().to_string())
            .await
    }

    /// Forgets the runtime kept for `workspace` (a removed worktree).
    pub(crate) fn forget_runtime(&self, workspace: &str) {
        self.runtimes.forget(workspace);
    }

    /// Sets what else a delete removes (a second call is ignored).
    pub(crate) fn set_delete_hook(&self, hook: std::sync::Weak<dyn DeleteHook>) {
        let _ = self.on_delete.set(hook);
    }

    /// The delete hook, if set and alive.
    pub(crate) fn delete_hook(&self) -> Option<Arc<dyn DeleteHook>> {
        self.on_delete.get().and_then(|w| w.upgrade())
    }

    /// `create_in` under an id the caller chose (a fresh one: a child's, so
    /// its worktree can be named before the session exists).
    pub(crate) async fn create_as(
        &self,
        workspace: Option<OpenWorkspace>,
        id: String,
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
                let runtimes = self.runtimes.clone();
                let ws = w.path.display().to_string();
                tokio::task::spawn_blocking(move || runtimes.for_workspace(&ws))
                    .await
                    .map_err(|e| Error::internal(e.to_string()))??
            }
        };
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
        let hook_rt = rt.clone();
        let session = Session::create(rt, &id, created_at, log);
        if let Some(lost) = lease {
            watch_lease(&session, lost, jetstream);
        }
        report_stop(&session, self.stopped.clone());
        self.note_shared(&session).await;
        crate::session::hooks::session_start(&hook_rt, &id);
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

    /// Whether session `id` exists (in memory or in the index): what a
    /// task may name, asked without loading it.
    pub fn known(&self, id: &str) -> bool {
        self.loaded().contains_key(id) || self.index.get(id).is_some()
    }

    /// Explicit attach: the same as `get`, named for the API.
    pub async fn attach(&self, id: &str) -> Result<Arc<Session>> {
        self.get(id).await
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
    pub(crate) async fn save_index(&self) {
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

    /// Every session in memory with the clients attached to it, by id.
    pub fn presence(&self) -> Vec<(SessionInfo, Vec<Client>)> {
        let mut out: Vec<_> = self
            .live()
            .into_iter()
            .map(|s| (s.info(), s.watch_presence().borrow().clone()))
            .collect();
        out.sort_by(|a, b| a.0.session_id.cmp(&b.0.session_id));
        out
    }

    /// Once a lease age, every mirror whose writer answers no ping is
    /// looked up as a request would (`find`: the lease is waited out and
    /// taken), so the readers of a session whose writer died see its run
    /// settled without waiting for another request. Until shutdown.
    pub(crate) async fn adopt_orphans(self: Arc<Self>) {
        let Some(owners) = self.rt.cfg.owners.clone() else {
            return;
        };
        let adopting = Arc::new(Mutex::new(HashSet::<String>::new()));
        loop {
            tokio::select! {
                _ = tokio::time::sleep(owners.ttl()) => {}
                _ = self.closing.cancelled() => return,
            }
            if self.is_stopping() {
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
                let (registry, owners, adopting) = (self.clone(), owners.clone(), adopting.clone());
                tokio::spawn(async move {
                    let silent = match owners.claim_checked(&id).await {
                        Ok(Claim::Theirs(o)) => !owners.alive(&o).await,
                        // Free (and now ours): load it under the lease.
                        Ok(Claim::Mine(_)) => true,
                        Err(_) => false,
                    };
                    if silent {
                        match registry.find(&id).await {
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

    /// The registry's part of a graceful stop: nothing is created or loaded
    /// from now on; every loaded session refuses new input, cancels its
    /// run, settles, closes its streams and syncs its ledger; then the
    /// indexes, search and leases are brought up to date.
    pub(crate) async fn stop(&self, grace: Duration) {
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
        self.rt.portfolio().close().await;
        // After the sessions: their last runs' messages are queued by now.
        self.rt.search().close().await;
        // Every session is settled and synced: the leases go back, so
        // another replica takes these sessions without waiting them out.
        if let Some(owners) = &self.rt.cfg.owners {
            owners.release_all().await;
        }
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

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::ClientEvent;
    use crate::host::hub::Hub;
    use crate::session::live::Route;
    use crate::CoreConfig;

    /// A hub over `home` (also its workspace), for these tests and load.rs's.
    pub(super) fn hub(home: &std::path::Path, tweak: impl FnOnce(&mut CoreConfig)) -> Arc<Hub> {
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
        let s = h.sessions().create().await.unwrap();
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
                tokio::spawn(async move { h.sessions().get(&id).await.unwrap() })
            })
            .collect();
        // While the big ledger loads, other requests are not held up by it.
        let other = h.sessions().create().await.unwrap();
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
        assert_eq!(h.sessions().loaded_count(), 2);
    }

    #[tokio::test]
    async fn an_idle_session_is_unloaded_and_loads_again_on_use() {
        let home = tempfile::tempdir().unwrap();
        let h = hub(home.path(), |c| c.unload_idle_after = Duration::ZERO);
        let s = h.sessions().create().await.unwrap();
        s.publish(ClientEvent::TextDelta { text: "kept".into() });
        s.flush().await.unwrap();
        let id = s.id().to_string();
        let sub = s.subscribe(None);
        drop(s);
        assert_eq!(
            h.sessions().unload_idle().await,
            0,
            "a subscriber keeps it loaded"
        );
        drop(sub);
        assert_eq!(h.sessions().unload_idle().await, 1);
        assert_eq!(h.sessions().loaded_count(), 0);
        let again = h.sessions().get(&id).await.unwrap();
        assert_eq!(again.latest_seq(), 1);
        assert_eq!(again.transcript().messages[0].text, "kept");
    }

    #[tokio::test]
    async fn nothing_is_created_or_loaded_once_shutdown_began() {
        let home = tempfile::tempdir().unwrap();
        let id = session_with_history(home.path(), 1).await;
        let h = hub(home.path(), |_| {});
        h.shutdown(Duration::from_secs(1)).await;
        let created = h.sessions().create().await.map(|_| ()).unwrap_err();
        assert_eq!(created.kind, ErrorKind::Unavailable);
        let loaded = h.sessions().get(&id).await.map(|_| ()).unwrap_err();
        assert_eq!(loaded.kind, ErrorKind::Unavailable);
    }

    #[tokio::test]
    async fn a_created_session_is_the_one_live_state_every_lookup_finds() {
        let home = tempfile::tempdir().unwrap();
        let h = hub(home.path(), |_| {});
        let reg = h.sessions();
        let s = reg.create().await.unwrap();
        let id = s.id().to_string();
        assert!(Arc::ptr_eq(&reg.get(&id).await.unwrap(), &s));
        assert!(Arc::ptr_eq(&reg.attach(&id).await.unwrap(), &s));
        match reg.find(&id).await.unwrap() {
            Located::Local(found) => assert!(Arc::ptr_eq(&found, &s)),
            Located::Remote(o) => panic!("served by {}", o.replica),
        }
        assert_eq!(reg.loaded_count(), 1);
        assert_eq!(reg.live().len(), 1);
        let listed = reg.list().await.unwrap();
        let ids: Vec<&str> = listed.iter().map(|i| i.session_id.as_str()).collect();
        assert_eq!(ids, [id.as_str()]);
        assert!(listed[0].loaded, "a loaded session reports its live state");
    }

    #[tokio::test]
    async fn a_held_or_recently_used_session_stays_loaded() {
        let home = tempfile::tempdir().unwrap();
        let h = hub(home.path(), |c| c.unload_idle_after = Duration::ZERO);
        let s = h.sessions().create().await.unwrap();
        assert_eq!(
            h.sessions().unload_idle().await,
            0,
            "another holder keeps it loaded"
        );
        assert_eq!(h.sessions().loaded_count(), 1);
        drop(s);
        assert_eq!(h.sessions().unload_idle().await, 1);
        assert_eq!(h.sessions().loaded_count(), 0);
        assert!(!h.sessions().list().await.unwrap()[0].loaded);

        let home = tempfile::tempdir().unwrap();
        let h = hub(home.path(), |c| c.unload_idle_after = Duration::from_secs(3600));
        drop(h.sessions().create().await.unwrap());
        assert_eq!(h.sessions().unload_idle().await, 0, "used within the idle time");
        assert_eq!(h.sessions().loaded_count(), 1);
    }

    #[tokio::test]
    async fn a_title_is_the_live_sessions_while_loaded_and_the_indexs_after() {
        let home = tempfile::tempdir().unwrap();
        let h = hub(home.path(), |c| c.unload_idle_after = Duration::ZERO);
        let s = h.sessions().create().await.unwrap();
        let id = s.id().to_string();
        assert_eq!(h.sessions().title(&id), "");
        s.set_title(Some("live".into()));
        assert_eq!(h.sessions().title(&id), "live", "before the index catches up");
        drop(s);
        assert_eq!(h.sessions().unload_idle().await, 1);
        assert_eq!(
            h.sessions().title(&id),
            "live",
            "noted in the index as it unloaded"
        );
        assert_eq!(h.sessions().title("nosuch"), "");
    }
}
