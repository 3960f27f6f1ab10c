//! The children table: child sessions (workers and best-of-N candidates) under their parent, each a real session, isolated in its own git worktree and branch when asked; their state follows their runs, kept in `<home>/children.json`, and what changes is told on the parent's stream.
//!
//! A child is created under an id chosen here, so its worktree
//! (`<home>/worktrees/<parent>/<child>`, branch `vak/<parent>/<child>`) exists
//! before its session does and the session's workspace is the worktree. Its
//! state follows its runs: a waiter per chain waits for the chain's
//! run_finished (`session/wait.rs`); each waiter carries a generation, so a
//! stale one never overwrites a newer run's state. When an isolated child's
//! run settles its work is committed on its branch and measured against the
//! commit it started from. The table is bounded (per parent and in all) and
//! rewritten whole by one owner task (`file_owner.rs`) after each change; a
//! restart keeps it, and a child that was running then is `failed` ("the
//! server stopped"). Keep, discard and deletion take a child out of the
//! table for their git work (`busy`), so two of them never race on one
//! worktree.

use crate::background::{BackgroundResult, BackgroundSink, BackgroundSource};
use crate::error::{Error, ErrorKind, Result};
use crate::event::{ClientEvent, RunOutcome};
use crate::host::registry::{DeleteHook, Registry};
use crate::host::workspaces::OpenWorkspace;
use crate::host::worktree::{Merged, Repo};
use crate::session::live::Session;
use crate::worker::{DiscardWhy, Settled, Spawn, Spawner, WorkerInfo, WorkerKind, WorkerPhase, WorkerState};
use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Children one session may have at once.
pub const MAX_PER_PARENT: usize = 64;
/// Children on this server at once.
pub const MAX_TOTAL: usize = 1024;
/// A summary's most characters.
const SUMMARY_CHARS: usize = 600;
/// The table's file in the home.
const FILE: &str = "children.json";
/// The longest one chain of a child is waited for.
const RUN_LIMIT: Duration = Duration::from_secs(24 * 3600);
/// How long a stop waits for the child's run to settle.
const STOP_WAIT: Duration = Duration::from_secs(15);
/// The `reason` of a child that is not the session's.
pub const WORKER_NOT_FOUND: &str = "worker_not_found";
/// The `reason` past MAX_PER_PARENT or MAX_TOTAL.
pub const TOO_MANY_WORKERS: &str = "too_many_workers";
/// The `reason` of a keep of a candidate whose run is live.
pub const CANDIDATE_RUNNING: &str = "candidate_running";
/// The `reason` of a keep or discard of a child another one is working on.
pub const WORKER_BUSY: &str = "worker_busy";

/// One child as the table keeps it.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Entry {
    info: WorkerInfo,
    /// The commit its worktree started from (isolated only).
    #[serde(default)]
    base: String,
    /// The parent's workspace: the repository its branch is in.
    workspace: PathBuf,
    /// The child session's own workspace, as its runtime is kept.
    #[serde(default)]
    folder: String,
    /// Its run's generation: bumped at each chain it starts.
    #[serde(skip)]
    gen: u64,
    /// Spawned without a waiter (`spawn_worker` with wait=false): each
    /// settled run's final answer goes to the parent as a background result.
    #[serde(default)]
    deliver: bool,
}

#[derive(Default)]
struct Table {
    entries: Vec<Entry>,
    /// Children being spawned (counted against the bounds).
    pending: usize,
    /// Children a keep, discard or delete is working on.
    busy: HashSet<String>,
}

/// What a keep did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kept {
    pub candidate: String,
    pub branch: String,
    pub merged: Merged,
    pub discarded: Vec<String>,
}

/// A discarded candidate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Discarded {
    pub candidate: String,
    pub branch: String,
    pub why: DiscardWhy,
}

/// The registry, held weakly: the runtimes it holds hold the children
/// table (as their `Spawner`), so a strong handle here would be a cycle.
struct Reg(Weak<Registry>);

impl Reg {
    fn up(&self) -> Result<Arc<Registry>> {
        self.0
            .upgrade()
            .ok_or_else(|| Error::new(ErrorKind::Unavailable, "the server is shutting down"))
    }

    async fn get(&self, id: &str) -> Result<Arc<Session>> {
        self.up()?.get(id).await
    }

    fn known(&self, id: &str) -> bool {
        self.0.upgrade().is_some_and(|r| r.known(id))
    }

    async fn create_as(&self, ws: Option<OpenWorkspace>, id: String) -> Result<Arc<Session>> {
        self.up()?.create_as(ws, id).await
    }

    async fn delete(&self, id: &str) -> Result<()> {
        self.up()?.delete(id).await
    }

    fn is_stopping(&self) -> bool {
        self.0.upgrade().is_none_or(|r| r.is_stopping())
    }

    fn forget_runtime(&self, workspace: &str) {
        if let Some(r) = self.0.upgrade() {
            r.forget_runtime(workspace);
        }
    }
}

pub struct Children {
    me: Weak<Children>,
    sessions: Reg,
    home: PathBuf,
    git: PathBuf,
    /// `--bus`: sessions run in the server's own workspace; no isolation.
    bus: bool,
    max_bestofn: u32,
    table: Mutex<Table>,
    /// Bumped at every change, for waiters.
    changed: watch::Sender<u64>,
    file: crate::file_owner::FileOwner<PathBuf>,
}

/// Releases the spawn slot it holds unless it was used.
struct Reserved<'a>(&'a Children, usize);

impl Drop for Reserved<'_> {
    fn drop(&mut self) {
        let mut t = self.0.table();
        t.pending = t.pending.saturating_sub(self.1);
    }
}

/// Takes a child off limits to other keeps, discards and deletes until dropped.
struct Busy<'a>(&'a Children, Vec<String>);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        let mut t = self.0.table();
        for id in &self.1 {
            t.busy.remove(id);
        }
    }
}

/// The first paragraph of `text`, at most SUMMARY_CHARS characters.
fn summarize(text: &str) -> String {
    let para = text.trim().split("\n\n").next().unwrap_or_default().trim();
    if para.chars().count() <= SUMMARY_CHARS {
        return para.to_string();
    }
    let mut s: String = para.chars().take(SUMMARY_CHARS - 1).collect();
    s.push('…');
    s
}

fn now() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
}

fn not_found(child: &str, parent: &str) -> Error {
    Error::not_found(format!("session {parent} has no child {child}")).with_reason(WORKER_NOT_FOUND)
}

impl Children {
    /// The table in `home` (read now: blocking, for startup); children that
    /// were running when the server stopped are failed.
    pub(crate) fn open(sessions: Arc<Registry>, cfg: &crate::CoreConfig) -> Arc<Children> {
        let path = cfg.home.join(FILE);
        let mut entries: Vec<Entry> = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|e| {
                tracing::warn!(
                    "{} cannot be read ({e}); starting with no children",
                    path.display()
                );
                Vec::new()
            }),
            Err(_) => Vec::new(),
        };
        for e in &mut entries {
            if !e.info.state.is_settled() {
                e.info.state = WorkerState::Failed;
                e.info.summary = "the server stopped".into();
            }
        }
        entries.truncate(MAX_TOTAL);
        Arc::new_cyclic(|me| Children {
            me: me.clone(),
            sessions: Reg(Arc::downgrade(&sessions)),
            home: cfg.home.clone(),
            git: cfg.git.clone(),
            bus: cfg.nats.is_some(),
            max_bestofn: cfg.max_bestofn,
            table: Mutex::new(Table {
                entries,
                ..Table::default()
            }),
            changed: watch::channel(0).0,
            file: crate::file_owner::FileOwner::new("the children table", path),
        })
    }

    /// Where worktrees live: `<home>/worktrees`.
    pub(crate) fn worktrees_dir(home: &Path) -> PathBuf {
        home.join("worktrees")
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn entry(&self, id: &str) -> Option<Entry> {
        self.table().entries.iter().find(|e| e.info.id == id).cloned()
    }

    /// Child `child` of `parent`, or 404 `worker_not_found`.
    fn child_of(&self, parent: &str, child: &str) -> Result<Entry> {
        self.entry(child)
            .filter(|e| e.info.parent_id == parent)
            .ok_or_else(|| not_found(child, parent))
    }

    /// Writes the table (its state when the write runs) through the owner.
    async fn save(&self) {
        let Some(me) = self.me.upgrade() else { return };
        let saved = self
            .file
            .change(move |path| {
                let path = path.clone();
                Box::pin(async move {
                    let entries = me.table().entries.clone();
                    let bytes = serde_json::to_vec_pretty(&entries).unwrap_or_default();
                    tokio::task::spawn_blocking(move || {
                        let dir = path.parent().unwrap_or(Path::new("."));
                        crate::home::write_private_file(dir, FILE, &bytes)
                    })
                    .await
                })
            })
            .await;
        match saved {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => tracing::warn!("cannot save the children table: {}", e.message),
            Ok(Err(e)) => tracing::warn!("cannot save the children table: {e}"),
            Err(e) => tracing::warn!("cannot save the children table: {e}"),
        }
    }

    /// Tells the parent (if it still exists) and waiters about `info`.
    async fn tell(&self, phase: WorkerPhase, info: &WorkerInfo) {
        self.changed.send_modify(|v| *v += 1);
        let Ok(parent) = self.sessions.get(&info.parent_id).await else {
            return;
        };
        parent.publish(match info.kind {
            WorkerKind::Worker => ClientEvent::Worker {
                phase,
                worker: Box::new(info.clone()),
            },
            WorkerKind::Candidate => ClientEvent::Workbench {
                bestofn_id: info.bestofn_id.clone(),
                candidate: Box::new(info.clone()),
            },
        });
    }

    /// `parent`'s children, oldest first (404 for an unknown session).
    pub async fn list(&self, parent: &str) -> Result<Vec<WorkerInfo>> {
        if !self.sessions.known(parent) {
            self.sessions.get(parent).await?;
        }
        Ok(self
            .table()
            .entries
            .iter()
            .filter(|e| e.info.parent_id == parent)
            .map(|e| e.info.clone())
            .collect())
    }

    /// Reserves `n` children for `parent` within the bounds.
    fn reserve(&self, parent: &str, n: usize) -> Result<Reserved<'_>> {
        let mut t = self.table();
        let mine = t.entries.iter().filter(|e| e.info.parent_id == parent).count();
        let total = t.entries.len() + t.pending;
        if mine + t.pending + n > MAX_PER_PARENT || total + n > MAX_TOTAL {
            return Err(Error::new(
                ErrorKind::ResourceExhausted,
                format!(
                    "too_many_workers: a session has at most {MAX_PER_PARENT} children and the server {MAX_TOTAL}; discard candidates or delete settled children (DELETE /sessions/<child id>) first"
                ),
            )
            .with_reason(TOO_MANY_WORKERS));
        }
        t.pending += n;
        Ok(Reserved(self, n))
    }

    /// Spawns one child (see `Spawner::spawn`).
    async fn spawn_one(&self, req: Spawn, mut slot: Reserved<'_>) -> Result<WorkerInfo> {
        let parent = self.sessions.get(&req.parent).await?;
        let id = uuid::Uuid::new_v4().simple().to_string();
        let workspace = parent.workspace_dir().to_path_buf();
        let (mut info, base, folder) = (
            WorkerInfo {
                id: id.clone(),
                parent_id: req.parent.clone(),
                kind: req.kind,
                prompt: req.prompt.clone(),
                state: WorkerState::Running,
                branch: String::new(),
                worktree: String::new(),
                started_at: now(),
                summary: String::new(),
                diff_stat: None,
                bestofn_id: req.bestofn_id.clone(),
            },
            String::new(),
            workspace.clone(),
        );
        let (base, folder) = if req.isolated {
            if self.bus {
                return Err(Error::invalid(
                    "with --bus, sessions run in the server's own workspace: no isolated children",
                ));
            }
            let repo = Repo::open(&workspace, &self.git).await?;
            let prefix = repo.prefix().await?;
            let dir = Self::worktrees_dir(&self.home).join(&req.parent).join(&id);
            let branch = format!("vak/{}/{id}", req.parent);
            let base = repo.add(&branch, &dir).await?;
            info.branch = branch;
            info.worktree = dir.display().to_string();
            let folder = if prefix.is_empty() { dir } else { dir.join(prefix) };
            // A runtime is pinned to a canonical path (the home may lie
            // behind a symlink).
            let folder = tokio::task::spawn_blocking(move || folder.canonicalize().unwrap_or(folder))
                .await
                .map_err(|e| Error::internal(e.to_string()))?;
            (base, folder)
        } else {
            (base, folder)
        };
        let ws = OpenWorkspace {
            path: folder,
            trusted: true,
            primary: false,
            id: None,
        };
        let child = match self.sessions.create_as(Some(ws), id.clone()).await {
            Ok(c) => c,
            Err(e) => {
                if req.isolated {
                    self.remove_worktree(&workspace, &info).await;
                }
                return Err(e);
            }
        };
        {
            let mut t = self.table();
            t.entries.push(Entry {
                info: info.clone(),
                base,
                workspace,
                folder: child.workspace().to_string(),
                gen: 0,
                deliver: !req.wait,
            });
            t.pending = t.pending.saturating_sub(slot.1);
        }
        // Its count moved from `pending` to the table.
        slot.1 = 0;
        self.save().await;
        self.tell(WorkerPhase::Spawned, &info).await;
        self.start(&child, req.prompt, true).await;
        Ok(self.entry(&id).map(|e| e.info).unwrap_or(info))
    }

    /// Admits `text` on the child and, when it started a chain (or joined
    /// one nobody waits for), waits for it in the background.
    async fn start(&self, child: &Arc<Session>, text: String, fresh: bool) -> Option<Error> {
        let id = child.id().to_string();
        match child.admit(text, None).await {
            Ok(a) => {
                use crate::session::admission::AdmissionState;
                let settled = self.entry(&id).is_some_and(|e| e.info.state.is_settled());
                let new_chain = a.state == AdmissionState::Started || settled || fresh;
                if !new_chain {
                    return None;
                }
                let (gen, info) = {
                    let mut t = self.table();
                    let e = t.entries.iter_mut().find(|e| e.info.id == id)?;
                    e.gen += 1;
                    let was = e.info.state;
                    e.info.state = WorkerState::Running;
                    e.info.summary.clear();
                    (e.gen, (was != WorkerState::Running).then(|| e.info.clone()))
                };
                if let Some(info) = info {
                    self.save().await;
                    self.tell(WorkerPhase::State, &info).await;
                }
                if let Some(me) = self.me.upgrade() {
                    let child = child.clone();
                    tokio::spawn(async move { me.follow(child, a.after_seq, gen).await });
                }
                None
            }
            // A first run that cannot start fails the child; a refused
            // steer (a full queue) leaves it as it is.
            Err(e) => {
                if fresh {
                    self.settle(&id, None, WorkerState::Failed, e.message.clone())
                        .await;
                }
                Some(e)
            }
        }
    }

    /// Waits for the chain after `after_seq` to settle and records how.
    async fn follow(self: Arc<Self>, child: Arc<Session>, after_seq: u64, gen: u64) {
        let settled = crate::session::wait::settled(&child, after_seq, RUN_LIMIT).await;
        if self.sessions.is_stopping() {
            // Left running: the next start says the server stopped.
            return;
        }
        let (state, summary, whole) = match settled {
            Some(s) => match s.outcome {
                RunOutcome::Completed | RunOutcome::MaxTurns => {
                    (WorkerState::Finished, summarize(&s.answer), s.answer)
                }
                RunOutcome::Cancelled => (WorkerState::Cancelled, summarize(&s.message), s.message),
                RunOutcome::Failed => (WorkerState::Failed, summarize(&s.message), s.message),
            },
            None => {
                let why = "the child's run did not settle (its session closed)".to_string();
                (WorkerState::Failed, why.clone(), why)
            }
        };
        if let Some(info) = self.settle(child.id(), Some(gen), state, summary).await {
            self.deliver(&info, whole).await;
        }
    }

    /// A child spawned without a waiter hands each settled run's answer to
    /// its parent as a background result (delivered when the parent is idle).
    async fn deliver(&self, info: &WorkerInfo, whole: String) {
        if !self.entry(&info.id).is_some_and(|e| e.deliver) {
            return;
        }
        let text = match info.state {
            WorkerState::Finished => whole,
            WorkerState::Cancelled => format!("the worker {} was cancelled: {whole}", info.id),
            _ => format!("the worker {} failed: {whole}", info.id),
        };
        let text = crate::provider::http::truncate(&text, crate::tools::MAX_OUTPUT);
        let result = BackgroundResult::new(BackgroundSource::Worker, info.id.clone(), text, None);
        let Ok(reg) = self.sessions.up() else { return };
        if let Err(e) = reg.deliver(&info.parent_id, result).await {
            tracing::warn!(worker = %info.id, parent = %info.parent_id, "cannot deliver the worker's answer: {}", e.message);
        }
    }

    /// Records a settled run (when `gen` is still the child's), committing
    /// and measuring an isolated child's work first.
    /// Answers the settled info, or None when the run was stale or the child gone.
    async fn settle(
        &self,
        id: &str,
        gen: Option<u64>,
        state: WorkerState,
        summary: String,
    ) -> Option<WorkerInfo> {
        let e = self.entry(id)?;
        if gen.is_some_and(|g| g != e.gen) {
            return None;
        }
        let mut stat = None;
        let going = self.table().busy.contains(id);
        if !going && !e.info.worktree.is_empty() && Path::new(&e.info.worktree).exists() {
            let measured = async {
                let repo = Repo::open(&e.workspace, &self.git).await?;
                let what = format!("vak: {} {}", e.info.kind.as_str(), e.info.id);
                repo.commit_all(Path::new(&e.info.worktree), &what).await?;
                repo.diff_stat(&e.base, &e.info.branch).await
            };
            match measured.await {
                Ok(s) => stat = Some(s),
                Err(err) => tracing::warn!(
                    child = id,
                    "cannot commit or measure the child's work: {}",
                    err.message
                ),
            }
        }
        let info = {
            let mut t = self.table();
            let e = t.entries.iter_mut().find(|x| x.info.id == id)?;
            if gen.is_some_and(|g| g != e.gen) {
                return None;
            }
            e.info.state = state;
            e.info.summary = summary;
            if stat.is_some() {
                e.info.diff_stat = stat;
            }
            e.info.clone()
        };
        self.save().await;
        self.tell(WorkerPhase::Finished, &info).await;
        Some(info)
    }

    /// The final answer of child `id`'s last run, from its transcript.
    async fn last_answer(&self, id: &str) -> String {
        let Ok(s) = self.sessions.get(id).await else {
            return String::new();
        };
        s.transcript()
            .messages
            .iter()
            .rev()
            .take_while(|m| m.role != crate::log::transcript::Role::User)
            .find(|m| m.role == crate::log::transcript::Role::Assistant)
            .map(|m| m.text.clone())
            .unwrap_or_default()
    }

    /// Waits (at most `limit`) until child `id` is settled or gone.
    async fn until_settled(&self, id: &str, limit: Duration) -> Option<WorkerInfo> {
        let mut rx = self.changed.subscribe();
        let wait = async {
            loop {
                match self.entry(id) {
                    Some(e) if e.info.state.is_settled() => return Some(e.info),
                    None => return None,
                    Some(_) => {}
                }
                if rx.changed().await.is_err() {
                    return self.entry(id).map(|e| e.info);
                }
            }
        };
        match tokio::time::timeout(limit, wait).await {
            Ok(r) => r,
            Err(_) => self.entry(id).map(|e| e.info),
        }
    }

    /// Cancels child `child`'s run (its tools' processes are killed by the
    /// cancel path) and answers it once settled.
    pub async fn stop(&self, parent: &str, child: &str) -> Result<WorkerInfo> {
        let e = self.child_of(parent, child)?;
        if e.info.state.is_settled() {
            return Ok(e.info);
        }
        if let Ok(s) = self.sessions.get(child).await {
            s.cancel();
        }
        self.until_settled(child, STOP_WAIT)
            .await
            .ok_or_else(|| not_found(child, parent))
    }

    /// Steers child `child`: queued into its live run, or a new run of a
    /// settled child.
    pub async fn steer(&self, parent: &str, child: &str, text: String) -> Result<WorkerInfo> {
        self.child_of(parent, child)?;
        if text.trim().is_empty() {
            return Err(Error::invalid("text is required"));
        }
        let s = self.sessions.get(child).await?;
        if let Some(e) = self.start(&s, text, false).await {
            return Err(e);
        }
        self.entry(child)
            .map(|e| e.info)
            .ok_or_else(|| not_found(child, parent))
    }

    /// n isolated candidates of `prompt` under `parent`: the best-of-N's id
    /// and the candidates, each running.
    pub async fn start_bestofn(
        &self,
        parent: &str,
        prompt: String,
        n: u32,
    ) -> Result<(String, Vec<WorkerInfo>)> {
        let p = self.sessions.get(parent).await?;
        if n < 2 || n > self.max_bestofn {
            return Err(Error::invalid(format!(
                "n {n}: a best-of-N runs 2 to {} candidates (--max-bestofn)",
                self.max_bestofn
            )));
        }
        if prompt.trim().is_empty() {
            return Err(Error::invalid("prompt is required"));
        }
        if self.bus {
            return Err(Error::invalid(
                "with --bus, sessions run in the server's own workspace: no best-of-N",
            ));
        }
        Repo::open(p.workspace_dir(), &self.git).await?;
        let bestofn_id = format!("bon_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
        let mut slots = self.reserve(parent, n as usize)?;
        let mut out = Vec::new();
        for _ in 0..n {
            let one = Reserved(self, 1);
            slots.1 -= 1;
            let req = Spawn {
                parent: parent.to_string(),
                kind: WorkerKind::Candidate,
                prompt: prompt.clone(),
                isolated: true,
                bestofn_id: bestofn_id.clone(),
                wait: true,
            };
            match self.spawn_one(req, one).await {
                Ok(info) => out.push(info),
                Err(e) => {
                    drop(slots);
                    for c in &out {
                        let _ = self.discard_one(c.id.clone(), DiscardWhy::Discarded, false).await;
                    }
                    return Err(e);
                }
            }
        }
        Ok((bestofn_id, out))
    }

    /// Marks `ids` busy (409 `worker_busy` if one already is).
    fn take(&self, ids: Vec<String>) -> Result<Busy<'_>> {
        let mut t = self.table();
        if let Some(id) = ids.iter().find(|id| t.busy.contains(*id)) {
            return Err(Error::conflict(format!(
                "worker_busy: child {id} is being kept, discarded or deleted"
            ))
            .with_reason(WORKER_BUSY));
        }
        t.busy.extend(ids.iter().cloned());
        Ok(Busy(self, ids))
    }

    /// A candidate of `parent`, or 404.
    fn candidate_of(&self, parent: &str, candidate: &str) -> Result<Entry> {
        self.child_of(parent, candidate)
            .ok()
            .filter(|e| e.info.kind == WorkerKind::Candidate)
            .ok_or_else(|| {
                Error::not_found(format!("session {parent} has no candidate {candidate}"))
                    .with_reason(WORKER_NOT_FOUND)
            })
    }

    /// Merges a settled candidate's branch into the parent's workspace, then
    /// discards the best-of-N's other candidates and removes the kept one's
    /// worktree and branch.
    pub async fn keep(&self, parent: &str, candidate: &str) -> Result<Kept> {
        let e = self.candidate_of(parent, candidate)?;
        let live = self.sessions.get(candidate).await.is_ok_and(|s| s.is_busy());
        if !e.info.state.is_settled() || live {
            return Err(Error::conflict(format!(
                "candidate_running: candidate {candidate} is still running; stop it or wait for it to finish"
            ))
            .with_reason(CANDIDATE_RUNNING));
        }
        let busy = self.take(vec![candidate.to_string()])?;
        let repo = Repo::open(&e.workspace, &self.git).await?;
        let wt = Path::new(&e.info.worktree);
        if wt.exists() {
            let what = format!("vak: candidate {}", e.info.id);
            repo.commit_all(wt, &what).await?;
        }
        let merged = repo.merge(&e.info.branch).await?;
        drop(busy);
        let others: Vec<String> = self
            .table()
            .entries
            .iter()
            .filter(|o| o.info.bestofn_id == e.info.bestofn_id && o.info.id != e.info.id)
            .map(|o| o.info.id.clone())
            .collect();
        let mut discarded = Vec::new();
        for o in others {
            match self.discard_one(o.clone(), DiscardWhy::KeptOther, true).await {
                Ok(_) => discarded.push(o),
                Err(err) => tracing::warn!(candidate = %o, "cannot discard: {}", err.message),
            }
        }
        if let Err(err) = self.forget(candidate).await {
            tracing::warn!(candidate, "cannot remove the kept candidate: {}", err.message);
        }
        Ok(Kept {
            candidate: candidate.to_string(),
            branch: e.info.branch,
            merged,
            discarded,
        })
    }

    /// Discards a candidate of `parent`: stopped if running, its worktree
    /// and branch removed, its session deleted, the parent told.
    pub async fn discard(&self, parent: &str, candidate: &str) -> Result<Discarded> {
        self.candidate_of(parent, candidate)?;
        self.discard_one(candidate.to_string(), DiscardWhy::Discarded, true)
            .await
    }

    async fn discard_one(&self, id: String, why: DiscardWhy, tell: bool) -> Result<Discarded> {
        let Some(e) = self.entry(&id) else {
            return Err(Error::not_found(format!("no child {id}")).with_reason(WORKER_NOT_FOUND));
        };
        let branch = e.info.branch.clone();
        self.forget(&id).await?;
        if tell {
            if let Ok(p) = self.sessions.get(&e.info.parent_id).await {
                p.publish(ClientEvent::DraftDiscarded {
                    candidate: id.clone(),
                    branch: branch.clone(),
                    why,
                });
            }
        }
        Ok(Discarded {
            candidate: id,
            branch,
            why,
        })
    }

    /// Stops child `id`, deletes its session (which, through the delete
    /// hook, removes its worktree, branch and entry, and its own children).
    async fn forget(&self, id: &str) -> Result<()> {
        // Busy from the start: the run settling under the cancel commits
        // nothing into a worktree about to go.
        let _busy = self.take(vec![id.to_string()])?;
        if let Ok(s) = self.sessions.get(id).await {
            s.cancel();
            let _ = tokio::time::timeout(STOP_WAIT, s.settled()).await;
            match self.sessions.delete(id).await {
                Ok(()) => {}
                Err(e) if e.kind == ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        // The session was gone already: the entry and worktree still go.
        if let Some(e) = self.entry(id) {
            self.remove_worktree(&e.workspace, &e.info).await;
            if !e.info.worktree.is_empty() {
                // The worktree's runtime goes with it.
                self.sessions.forget_runtime(&e.folder);
            }
            self.table().entries.retain(|x| x.info.id != id);
            self.save().await;
            self.changed.send_modify(|v| *v += 1);
        }
        Ok(())
    }

    async fn remove_worktree(&self, workspace: &Path, info: &WorkerInfo) {
        if info.worktree.is_empty() {
            return;
        }
        let removed = async {
            Repo::open(workspace, &self.git)
                .await?
                .remove(&info.branch, Path::new(&info.worktree))
                .await
        };
        if let Err(e) = removed.await {
            tracing::warn!(child = %info.id, "cannot remove the child's worktree: {}", e.message);
        }
    }

    /// A session is being deleted: its children are stopped and deleted,
    /// and when it is a child its worktree, branch and entry go.
    async fn deleting(&self, id: &str) {
        let kids: Vec<String> = self
            .table()
            .entries
            .iter()
            .filter(|e| e.info.parent_id == id)
            .map(|e| e.info.id.clone())
            .collect();
        for k in kids {
            if let Err(e) = self.forget(&k).await {
                tracing::warn!(child = %k, "cannot delete the child of a deleted session: {}", e.message);
            }
        }
        if let Some(e) = self.entry(id) {
            self.remove_worktree(&e.workspace, &e.info).await;
            if !e.info.worktree.is_empty() {
                // The worktree's runtime goes with it.
                self.sessions.forget_runtime(&e.folder);
            }
            self.table().entries.retain(|x| x.info.id != id);
            self.save().await;
            self.changed.send_modify(|v| *v += 1);
        }
    }
}

impl DeleteHook for Children {
    fn deleting<'a>(&'a self, id: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(Children::deleting(self, id))
    }
}

impl Spawner for Children {
    fn spawn(&self, req: Spawn) -> BoxFuture<'_, Result<WorkerInfo>> {
        Box::pin(async move {
            if req.prompt.trim().is_empty() {
                return Err(Error::invalid("a worker needs a prompt"));
            }
            let slot = self.reserve(&req.parent, 1)?;
            self.spawn_one(req, slot).await
        })
    }

    fn wait(&self, child: &str, cancel: CancellationToken) -> BoxFuture<'_, Result<Settled>> {
        let child = child.to_string();
        Box::pin(async move {
            if self.entry(&child).is_none() {
                return Err(Error::not_found(format!("no child {child}")).with_reason(WORKER_NOT_FOUND));
            }
            let info = tokio::select! {
                got = self.until_settled(&child, RUN_LIMIT) => {
                    got.ok_or_else(|| Error::not_found(format!("child {child} was deleted")).with_reason(WORKER_NOT_FOUND))
                }
                _ = cancel.cancelled() => {
                    if let Ok(s) = self.sessions.get(&child).await {
                        s.cancel();
                    }
                    self.until_settled(&child, STOP_WAIT)
                        .await
                        .ok_or_else(|| Error::not_found(format!("child {child} was deleted")).with_reason(WORKER_NOT_FOUND))
                }
            }?;
            let answer = match info.state {
                WorkerState::Finished => self.last_answer(&child).await,
                _ => String::new(),
            };
            Ok(Settled { info, answer })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_summary_is_the_first_paragraph_bounded() {
        assert_eq!(summarize("  one\nline\n\ntwo"), "one\nline");
        let long = "x".repeat(1000);
        assert_eq!(summarize(&long).chars().count(), SUMMARY_CHARS);
    }
}
