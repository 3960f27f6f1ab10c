//! One live session: its turn chain (admitted as `admission.rs` decides), cancel, history edits, approvals, side runs, and the publish path into the bus, the ledger and the transcript.

use crate::background::{BackgroundQueue, BackgroundResult, Pending};
use crate::error::{Error, ErrorKind, Result};
use crate::event::{
    project, AgentEvent, ApprovalOutcome, ClientEvent, Compaction, Frame, Note, NoticeLevel, RunOutcome,
    SideOutcome, SidePhase, StopReason, Undo,
};
use crate::host::rules::Rule;
use crate::log::folds::{Folds, Snapshot};
use crate::log::ledger::{Ledger, Log, OpenError, Record};
use crate::log::presentation::{Presenter, Timeline};
use crate::log::transcript::Transcript;
use crate::log::writer::{self, Op, Pipe, Visible};
use crate::provider::TokenUsage;
use crate::reasons::{CloseReason, Surface};
pub use crate::route::Route;
use crate::session::admission::{
    self, Admission, AdmissionState, AfterLeg, CancelResult, Checked, Input, Placed, Refused, RunState,
};
use crate::session::agent;
use crate::session::approvals::{Answer, Approvals, PLAN_TOOL};
use crate::session::attachments::AttachmentRef;
use crate::session::context::TurnContext;
use crate::session::restore::{Restore, Restored};
use crate::session::runtime::Runtime;
use crate::session::side::SideEntry;
use crate::stopped::Stopped;
use crate::stream::bus::Bus;
use crate::stream::subscription::Subscription;
use crate::PermissionMode;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// What answering an approval did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answered {
    pub outcome: ApprovalOutcome,
    /// With `always`: the rule stored, or None when storing it failed (a
    /// notice told the session's clients why).
    pub rule: Option<Rule>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionInfo {
    pub session_id: String,
    pub created_at: String,
    pub title: String,
    pub latest_seq: u64,
    pub loaded: bool,
    pub busy: bool,
    /// Tokens the session's model turns have consumed.
    pub usage: TokenUsage,
    /// The workspace the session runs in (absolute; empty when not known).
    pub workspace: String,
}

pub struct Session {
    id: Arc<str>,
    created_at: String,
    rt: Arc<Runtime>,
    bus: Bus,
    log: Arc<dyn Log>,
    /// To the session's writer, the only path into the ledger and the bus.
    pipe: Arc<Pipe>,
    folds: Mutex<Folds>,
    presence: watch::Sender<Vec<Client>>,
    approvals: Approvals,
    run: Mutex<RunState>,
    busy: watch::Sender<bool>,
    /// When a client last asked for this session (idle unloading).
    last_used: Mutex<Instant>,
    /// The title a client chose (`sessions/<id>.title`), over the derived one.
    title: Mutex<Option<String>>,
    /// The live side run, if any: its own admission, beside the main run's.
    side: Mutex<Option<SideLive>>,
    side_busy: watch::Sender<bool>,
    /// Turns true when the writer stops (storage failure, fence, lost lease).
    stopped: watch::Sender<bool>,
    /// Background results waiting for the session to be idle. Locked only
    /// under `run` (idle is the run state's word), so a result is either
    /// delivered by its arrival or by the run's end, never both.
    background: Mutex<BackgroundQueue>,
    /// Slots for the children its `spawn_worker` calls run (`--max-workers`).
    worker_slots: Arc<tokio::sync::Semaphore>,
    /// The base each model-call receipt stores its request against.
    prompt_base: std::sync::Mutex<crate::receipt::PromptBase>,
}

/// A side run in flight.
struct SideLive {
    side_id: String,
    cancel: CancellationToken,
}

impl Drop for Session {
    fn drop(&mut self) {
        // Nobody can publish any more: the writer drains what is queued and stops.
        self.pipe.close();
    }
}

/// A client attached to a session (a stream of any surface), for coworking frames.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Client {
    pub client_id: String,
    pub surface: Surface,
    /// When it attached (RFC 3339, UTC, seconds).
    pub attached_at: String,
}

/// Keeps a client listed as attached until dropped.
pub struct PresenceGuard {
    presence: watch::Sender<Vec<Client>>,
    client_id: String,
}

impl Drop for PresenceGuard {
    fn drop(&mut self) {
        self.presence
            .send_modify(|clients| clients.retain(|c| c.client_id != self.client_id));
    }
}

/// A subscription opened together with the timeline it starts from.
pub struct Presented {
    pub subscription: Subscription,
    /// The presenter at the subscription point: feed it the frames that follow.
    pub presenter: Presenter,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Session {
    /// A brand-new session with an empty ledger.
    pub fn create(rt: Arc<Runtime>, id: &str, created_at: String, log: Arc<dyn Log>) -> Arc<Session> {
        Self::build(rt, id, created_at, log, 0, Vec::new(), None)
    }

    /// Rebuilds a session from its ledger, read a record at a time: the
    /// transcript, seq, the replay ring and remembered request ids. A run
    /// the server died in the middle of is settled now (failed), so clients
    /// never wait forever.
    pub fn restore(rt: Arc<Runtime>, path: &std::path::Path) -> std::result::Result<Arc<Session>, OpenError> {
        let same = rt.clone();
        Self::restore_in(rt, path, 0, move |_| same)
    }

    /// `restore`, in the runtime `pick` gives for the workspace the ledger's
    /// header names (a session keeps the workspace it was created in).
    ///
    /// `recorded` is the highest seq known to have been issued elsewhere
    /// (the session index): a ledger found cut short of it gets the missing
    /// range marked lost (`repair::mark_lost`), so no seq is issued twice.
    pub fn restore_in(
        rt: Arc<Runtime>,
        path: &std::path::Path,
        recorded: u64,
        pick: impl FnOnce(&str) -> Arc<Runtime>,
    ) -> std::result::Result<Arc<Session>, OpenError> {
        let mut r = Restore::new(rt.cfg.bus.ring.max(1));
        let ledger = Ledger::open(path, rt.cfg.durability, |record| r.visit(record))?;
        let covered = r.covered(ledger.durable_seq());
        if let Some(lost) =
            crate::log::repair::mark_lost(&ledger, covered, recorded).map_err(OpenError::Io)?
        {
            r.visit(lost);
        }
        let rt = match r.take_workspace() {
            Some(ws) if !ws.is_empty() && ws != rt.workspace() => pick(&ws),
            _ => rt,
        };
        let restored = r.finish().map_err(OpenError::Io)?;
        Self::from_restored(rt, Arc::new(ledger), restored, None).map_err(OpenError::Io)
    }

    /// A session rebuilt from its folded ledger. What the server stopped in
    /// the middle of (a run, a side run, approvals, tool calls) is settled
    /// now, unless this is a mirror (`read_only`), whose writer settles it.
    fn from_restored(
        rt: Arc<Runtime>,
        log: Arc<dyn Log>,
        restored: Restored,
        read_only: Option<&str>,
    ) -> Result<Arc<Session>> {
        let Restored {
            id,
            created_at,
            latest,
            ring,
            folds,
            lost,
        } = restored;
        let session = Session::build(rt, &id, created_at, log, latest, ring, read_only);
        session.bus.note_lost(lost);
        let (facts, open_side) = {
            let mut f = lock(&session.folds);
            if let Some(restored) = folds {
                *f = restored;
            }
            f.searched = latest;
            // The ledger is the truth: a listing that missed a change (an
            // unclean stop) is mended when the session loads.
            if !f.plan.rows().is_empty() {
                session
                    .rt
                    .portfolio()
                    .put(&id, session.rt.workspace(), f.plan.rows().to_vec());
            }
            (f.facts.clone(), f.sides.open())
        };
        // A side run the server stopped in the middle of is settled too.
        if let Some(side_id) = open_side {
            session.publish(ClientEvent::Side {
                side_id,
                phase: SidePhase::Finished {
                    outcome: SideOutcome::Failed,
                    message: "interrupted: the server stopped during this side run".into(),
                    usage: TokenUsage::default(),
                },
            });
        }
        for (rid, outcome) in &facts.settled {
            session.approvals.remember(rid, *outcome);
        }
        {
            let mut run = lock(&session.run);
            for rid in &facts.request_ids {
                run.remember(rid);
            }
        }
        // A mirror's run is its writer's to settle.
        if facts.busy && read_only.is_none() {
            for rid in facts.open_approvals {
                session.approvals.remember(&rid, ApprovalOutcome::Expired);
                session.publish(ClientEvent::ApprovalResolved {
                    request_id: rid,
                    outcome: ApprovalOutcome::Expired,
                    reason: "the server stopped during this run".into(),
                });
            }
            // Every tool call gets exactly one result, also across a crash.
            for call_id in facts.open_calls {
                session.publish(ClientEvent::ToolResult {
                    call_id,
                    ok: false,
                    output: "interrupted: the server stopped during this call".into(),
                });
            }
            session.publish(ClientEvent::status(false));
            session.publish(ClientEvent::finished(
                RunOutcome::Failed,
                "interrupted: the server stopped during this run",
            ));
        }
        // Results queued before the server stopped: the session is idle
        // now, so they are delivered (a mirror's writer delivers its own).
        let queued = lock(&session.folds).background.clone();
        if read_only.is_none() {
            let _run = lock(&session.run);
            let mut bg = lock(&session.background);
            *bg = queued;
            session.drain_background(&mut bg);
        }
        Ok(session)
    }

    /// Queues a background result for this session and returns once it is
    /// durable. It is delivered (a `background_result` event) at once when
    /// the session is idle, else right after its run's run_finished, so never
    /// inside a run; in arrival order, each exactly once.
    pub async fn deliver_background(&self, result: BackgroundResult) -> Result<()> {
        {
            let run = lock(&self.run);
            run.open(self.stopped_by()).map_err(|r| r.error(&self.id))?;
            let mut bg = lock(&self.background);
            let n = bg.next_n;
            self.pipe.push(Op::Note(Note::Background(Pending {
                n,
                result: result.clone(),
                summarised: 0,
            })));
            bg.queue(n, result);
            if !run.running() {
                self.drain_background(&mut bg);
            }
        }
        self.flush().await
    }

    /// Publishes every queued background result (the caller holds `run`
    /// and knows the session is idle or its run has just finished).
    fn drain_background(&self, bg: &mut BackgroundQueue) {
        for p in bg.take() {
            self.publish(ClientEvent::BackgroundResult {
                result: p.result,
                upto: p.n,
                summarised: p.summarised,
            });
        }
    }

    /// The folder this session's tools work in (its workspace).
    pub fn workspace_dir(&self) -> &std::path::Path {
        &self.rt.cfg.workspace
    }

    /// Its workspace's canonical path, as its ledger header names it.
    pub fn workspace(&self) -> &str {
        self.rt.workspace()
    }

    /// Rebuilds a session from the records of a log that is not a file (the
    /// JetStream log): the same fold as `restore`.
    pub fn restore_records(
        rt: Arc<Runtime>,
        log: Arc<dyn Log>,
        records: Vec<Record>,
    ) -> Result<Arc<Session>> {
        let mut r = Restore::new(rt.cfg.bus.ring.max(1));
        for record in records {
            r.visit(record);
        }
        Self::from_restored(rt, log, r.finish()?, None)
    }

    /// A read-only copy of a session another replica writes (`--bus`),
    /// folded from `records` like a load; it settles nothing, has no writer,
    /// and refuses every write with `read_only`. Whoever follows the log
    /// hands it what is stored next through `Visible::commit` (`mirror.rs`).
    pub fn mirror(
        rt: Arc<Runtime>,
        log: Arc<dyn Log>,
        records: Vec<Record>,
        read_only: &str,
    ) -> Result<Arc<Session>> {
        let mut r = Restore::new(rt.cfg.bus.ring.max(1));
        for record in records {
            r.visit(record);
        }
        Self::from_restored(rt, log, r.finish()?, Some(read_only))
    }

    /// `read_only`: a mirror, with no writer and every write refused with it.
    fn build(
        rt: Arc<Runtime>,
        id: &str,
        created_at: String,
        log: Arc<dyn Log>,
        latest: u64,
        ring: Vec<Arc<Frame>>,
        read_only: Option<&str>,
    ) -> Arc<Session> {
        let sid: Arc<str> = Arc::from(id);
        let bus = Bus::new(sid.clone(), rt.cfg.bus.clone(), Some(log.clone()), latest, ring);
        let pipe = Arc::new(Pipe::default());
        let worker_slots = Arc::new(tokio::sync::Semaphore::new(rt.cfg.max_workers.max(1)));
        let session = Arc::new(Session {
            id: sid.clone(),
            created_at,
            rt,
            bus,
            log: log.clone(),
            pipe: pipe.clone(),
            folds: Mutex::new(Folds::new(id)),
            presence: watch::channel(Vec::new()).0,
            approvals: Approvals::default(),
            run: Mutex::new(RunState::default()),
            busy: watch::channel(false).0,
            last_used: Mutex::new(Instant::now()),
            title: Mutex::new(None),
            side: Mutex::new(None),
            side_busy: watch::channel(false).0,
            stopped: watch::channel(false).0,
            background: Mutex::new(BackgroundQueue::default()),
            worker_slots,
            prompt_base: Default::default(),
        });
        if let Some(why) = read_only {
            pipe.fail(&Stopped::ReadOnly { why: why.to_string() });
            return session;
        }
        let visible: Weak<dyn Visible> = Arc::downgrade(&session) as Weak<Session>;
        let snapshots = writer::SnapshotPolicy::new(session.rt.cfg.snapshot_min_bytes);
        tokio::spawn(writer::run(sid, pipe, log, visible, latest, snapshots));
        session
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn runtime(&self) -> &Runtime {
        &self.rt
    }

    pub fn info(&self) -> SessionInfo {
        let chosen = lock(&self.title).clone();
        let (title, usage) = {
            let f = lock(&self.folds);
            let title = chosen.unwrap_or_else(|| {
                f.transcript
                    .messages
                    .iter()
                    .find(|m| m.role == crate::log::transcript::Role::User)
                    .map(|m| crate::host::index::title_of(&m.text))
                    .unwrap_or_default()
            });
            (title, f.transcript.usage)
        };
        SessionInfo {
            session_id: self.id.to_string(),
            created_at: self.created_at.clone(),
            title,
            latest_seq: self.bus.latest_seq(),
            loaded: true,
            busy: lock(&self.run).running(),
            usage,
            workspace: self.workspace_dir().display().to_string(),
        }
    }

    /// Routes an agent event to the session's writer: usage to the ledger
    /// and transcript, client events to be numbered, persisted, folded and
    /// fanned out (in that order), internal traffic nowhere. Never waits;
    /// a fast producer calls `pace` to feel the writer's backpressure.
    pub fn emit(&self, event: AgentEvent) {
        match event {
            AgentEvent::Usage(u) => self.pipe.push(Op::Note(Note::Usage(u))),
            AgentEvent::ThinkingSignature(s) => self.pipe.push(Op::Note(Note::Signature(s))),
            AgentEvent::Compaction(c) => self.pipe.push(Op::Note(Note::Compaction(c))),
            AgentEvent::Receipt(r) => self.pipe.push(Op::Note(Note::Receipt(r))),
            event => {
                if let Some(client) = project(event) {
                    self.pipe.push(Op::event(self.bus.session_id(), client));
                }
            }
        }
    }

    pub fn publish(&self, event: ClientEvent) {
        self.emit(AgentEvent::Client(event));
    }

    /// Waits while the writer is far behind what was published.
    pub async fn pace(&self) {
        self.pipe.pace().await
    }

    /// How much of its ledger file its writer has appended whole (a backup
    /// copies no further); None when its log is no file.
    pub(crate) fn committed_len(&self) -> Option<u64> {
        self.log.committed_len()
    }

    /// Resolves once everything published so far is durable and visible.
    pub async fn flush(&self) -> Result<()> {
        self.pipe.barrier().await.map_err(Error::from)
    }

    /// What stopped this session's writes, with when it happened (kept by its pipe).
    pub fn storage_failure(&self) -> Option<(Stopped, Instant)> {
        self.pipe.failure()
    }

    /// Turns true when this session's writer stops (`recovery.rs` reloads it).
    pub fn watch_stopped(&self) -> watch::Receiver<bool> {
        self.stopped.subscribe()
    }

    /// Notes a use by a client (idle unloading counts from the last one).
    pub fn touch(&self) {
        *lock(&self.last_used) = Instant::now();
    }

    /// Whether nothing uses this session: no run, no subscriber, no pending
    /// writes, and no client for `idle`.
    pub fn is_idle(&self, idle: Duration) -> bool {
        !lock(&self.run).running()
            && lock(&self.side).is_none()
            && self.bus.subscriber_count() == 0
            && self.pipe.backlog() == 0
            && lock(&self.last_used).elapsed() >= idle
    }

    pub fn subscribe(&self, after: Option<u64>) -> Subscription {
        self.bus.subscribe(after)
    }

    pub fn latest_seq(&self) -> u64 {
        self.bus.latest_seq()
    }

    /// Subscribes and captures the presenter at exactly the subscription point.
    pub fn subscribe_presented(&self, after: Option<u64>) -> Presented {
        let f = lock(&self.folds);
        Presented {
            subscription: self.bus.subscribe(after),
            presenter: f.presenter.clone(),
        }
    }

    pub fn timeline(&self) -> Timeline {
        lock(&self.folds).presenter.timeline().clone()
    }

    /// Lists a client as attached until the guard drops.
    pub fn join(&self, client_id: &str, surface: Surface) -> PresenceGuard {
        let client = Client {
            client_id: client_id.to_string(),
            surface,
            attached_at: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
        };
        self.presence.send_modify(|clients| clients.push(client));
        PresenceGuard {
            presence: self.presence.clone(),
            client_id: client_id.to_string(),
        }
    }

    pub fn watch_presence(&self) -> watch::Receiver<Vec<Client>> {
        self.presence.subscribe()
    }

    pub fn transcript(&self) -> Transcript {
        lock(&self.folds).transcript.clone()
    }

    pub fn approvals(&self) -> &Approvals {
        &self.approvals
    }

    /// Admits a prompt or steering text. Never rejects a busy session: the
    /// input starts a chain when idle and is queued as its next leg otherwise.
    pub async fn admit(self: &Arc<Self>, text: String, request_id: Option<String>) -> Result<Admission> {
        self.admit_with(text, request_id, Vec::new()).await
    }

    /// `admit` for an input with images (already stored in the home): a
    /// queued input keeps them until its leg starts.
    pub async fn admit_with(
        self: &Arc<Self>,
        text: String,
        request_id: Option<String>,
        attachments: Vec<AttachmentRef>,
    ) -> Result<Admission> {
        self.admit_input(text, request_id, attachments, None, true).await
    }

    /// `admit` for a task's fire: its leg runs on `model` when pinned.
    pub async fn admit_pinned(
        self: &Arc<Self>,
        text: String,
        request_id: String,
        model: Option<String>,
    ) -> Result<Admission> {
        // A task's prompt is never read as steering of the user's goal.
        self.admit_input(text, Some(request_id), Vec::new(), model, false)
            .await
    }

    async fn admit_input(
        self: &Arc<Self>,
        text: String,
        request_id: Option<String>,
        attachments: Vec<AttachmentRef>,
        model: Option<String>,
        steering: bool,
    ) -> Result<Admission> {
        let id = &*self.id;
        let request_id = admission::request_id(&text, request_id).map_err(|r| r.error(id))?;
        let cap = self.rt.cfg.max_queued_inputs;
        let duplicate = {
            let mut run = lock(&self.run);
            let checked = run
                .check(&request_id, self.stopped_by(), cap)
                .map_err(|r| r.error(id))?;
            (checked == Checked::Duplicate).then(|| self.bus.latest_seq())
        };
        if let Some(after_seq) = duplicate {
            return Ok(Admission {
                request_id,
                state: AdmissionState::Duplicate,
                after_seq,
            });
        }
        // `started` or `queued` is answered only once the id is on disk: a
        // retry after any crash or storage failure is then a duplicate.
        if let Err(reason) = self.pipe.admitted(request_id.clone()).await {
            lock(&self.run).forget(&request_id);
            return Err(Refused::Stopped(reason).error(id));
        }
        let input = Input {
            request_id: request_id.clone(),
            text,
            attachments,
            model,
        };
        let mut run = lock(&self.run);
        // Steering into a live chain is read against its goal first.
        let steered = steering
            .then(|| self.steer_goal(&mut run, &input.text, &request_id))
            .flatten();
        if let Some(state) = steered {
            return Ok(Admission {
                request_id,
                state,
                after_seq: self.bus.latest_seq(),
            });
        }
        // Refused when deleted or closed while the id was written.
        let placed = run.place(input, self.stopped_by()).map_err(|r| r.error(id))?;
        let Placed::Started(input) = placed else {
            return Ok(Admission {
                request_id,
                state: AdmissionState::Queued,
                after_seq: self.bus.latest_seq(),
            });
        };
        self.busy.send_replace(true);
        // Read before the chain exists: nothing of this run is published yet.
        let after_seq = self.bus.latest_seq();
        drop(run);
        // Made here, on the admitting task, so its parent is the span this
        // admission runs under (an RPC's `request`), though the run executes
        // on its own task.
        let span = tracing::info_span!(
            target: crate::trace::TARGET,
            "run",
            session = %self.id,
            request_id = %request_id,
            outcome = tracing::field::Empty,
        );
        tokio::spawn(tracing::Instrument::instrument(self.clone().chain(input), span));
        Ok(Admission {
            request_id,
            state: AdmissionState::Started,
            after_seq,
        })
    }

    /// Runs legs until the steering queue is empty (holding while paused), then settles: exactly one
    /// run_finished per chain (a failed or cancelled leg ends its chain), published after the session is idle again so a
    /// client reacting to it is admitted as `started`.
    async fn chain(self: Arc<Self>, first: Input) {
        if self.bus.subscriber_count() == 0 {
            let cancel = lock(&self.run).leg_token();
            tokio::select! {
                _ = self.bus.wait_for_subscriber(self.rt.cfg.first_subscriber_wait) => {}
                _ = cancel.cancelled() => {}
            }
        }
        self.publish(ClientEvent::status(true));
        let started = std::time::Instant::now();
        // The run's tokens, for its log line.
        let mut usage = crate::provider::TokenUsage::default();
        tracing::info!(session = %self.id(), request_id = %first.request_id, "run started");
        let mut input = first;
        loop {
            let cancel = lock(&self.run).leg_token();
            let (
                agent::LegEnd {
                    mut outcome,
                    mut message,
                    stop_reason,
                },
                used,
            ) = agent::run_leg(&*self, &input, &cancel).await;
            usage.add(used);
            self.approvals.expire_all("the run ended", |e| self.publish(e));
            // A failed or cancelled leg ends its chain: steering queued for
            // it is discarded (as `cancel` does), and run_finished says so,
            // so a client reacting to run_finished is always admitted as
            // `started`. Paused by steering, the next leg waits for a resume
            // or a cancel (the run lock is not held while it waits).
            let next = loop {
                let wake = {
                    let mut run = lock(&self.run);
                    if outcome == RunOutcome::Cancelled && run.closing() {
                        message = "cancelled: the server is shutting down".into();
                    }
                    match run.after_leg(outcome) {
                        AfterLeg::Hold(wake) => wake,
                        AfterLeg::Next(next) => break Some(next),
                        AfterLeg::Finished { discarded } => {
                            if discarded > 0 {
                                message = format!(
                                    "{message} ({} discarded)",
                                    crate::text::count(discarded, "queued input")
                                );
                            }
                            tracing::Span::current().record("outcome", outcome.as_str());
                            let outcome_label = outcome.as_str();
                            metrics::counter!(crate::metrics_names::RUNS, "outcome" => outcome_label)
                                .increment(1);
                            metrics::histogram!(crate::metrics_names::RUN_DURATION_SECONDS, "outcome" => outcome_label)
                                .record(started.elapsed().as_secs_f64());
                            tracing::info!(
                                session = %self.id(),
                                outcome = outcome.as_str(),
                                stop_reason = stop_reason.map(StopReason::as_str),
                                duration_ms = started.elapsed().as_millis() as u64,
                                input_tokens = usage.input_tokens,
                                output_tokens = usage.output_tokens,
                                "run finished"
                            );
                            self.publish(ClientEvent::status(false));
                            self.publish(ClientEvent::RunFinished {
                                outcome,
                                message,
                                stop_reason,
                            });
                            // What arrived during the run, now that it is over.
                            self.drain_background(&mut lock(&self.background));
                            self.busy.send_replace(false);
                            crate::session::hooks::stop(&self.rt, self.id(), outcome);
                            break None;
                        }
                    }
                };
                self.publish(ClientEvent::Notice {
                    level: NoticeLevel::Info,
                    text: crate::goal::HELD.into(),
                });
                tokio::select! {
                    _ = wake.notified() => {}
                    _ = cancel.cancelled() => {
                        // Cancelled while held: the run ends cancelled.
                        outcome = RunOutcome::Cancelled;
                        message = agent::CANCELLED.into();
                    }
                }
            };
            match next {
                Some(next) => input = next,
                None => return,
            }
        }
    }

    /// Admits a side question: one model turn on a branch beside the main
    /// conversation (which it sees as the model would be sent it now), its
    /// frames `side` events of this session. One at a time: a second while
    /// one is live is a conflict with reason `side_busy`. Runs beside a live
    /// main run. Returns the side id and the latest seq at admission.
    pub fn side_run(self: &Arc<Self>, question: String) -> Result<(String, u64)> {
        if question.trim().is_empty() {
            return Err(Error::invalid("the question is empty"));
        }
        if question.len() > crate::session::side::MAX_QUESTION {
            return Err(Error::invalid(format!(
                "the question is {} bytes; at most {} are accepted",
                question.len(),
                crate::session::side::MAX_QUESTION
            )));
        }
        let side_id = format!("side_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
        let cancel = CancellationToken::new();
        let after_seq = {
            let run = lock(&self.run);
            run.open(self.stopped_by()).map_err(|r| r.error(&self.id))?;
            // Under the run lock, as delete's check is: no side run starts
            // once a delete is accepted.
            let mut side = lock(&self.side);
            if let Some(live) = &*side {
                return Err(Error::conflict(format!(
                    "side_busy: side run {} is live in session {}; cancel it (POST /sessions/{}/side/cancel) or wait for its side finished frame",
                    live.side_id, self.id, self.id
                ))
                .with_reason("side_busy"));
            }
            *side = Some(SideLive {
                side_id: side_id.clone(),
                cancel: cancel.clone(),
            });
            self.side_busy.send_replace(true);
            self.bus.latest_seq()
        };
        tokio::spawn(self.clone().side_task(side_id.clone(), question, cancel));
        Ok((side_id, after_seq))
    }

    async fn side_task(self: Arc<Self>, side_id: String, question: String, cancel: CancellationToken) {
        // The branch sees what a main leg starting now would: everything
        // published so far, folded in.
        let _ = self.flush().await;
        let (history, branch_seq) = {
            let f = lock(&self.folds);
            (f.transcript.chat(), f.transcript.seq)
        };
        self.publish(ClientEvent::Side {
            side_id: side_id.clone(),
            phase: SidePhase::Started {
                question: question.clone(),
                branch_seq,
            },
        });
        let (outcome, message, usage) =
            crate::session::side::answer(&*self, &side_id, history, &question, &cancel).await;
        // Published before the slot frees, so a client reacting to finished
        // is admitted, and the side log never has two runs open.
        let mut side = lock(&self.side);
        self.publish(ClientEvent::Side {
            side_id,
            phase: SidePhase::Finished {
                outcome,
                message,
                usage,
            },
        });
        *side = None;
        self.side_busy.send_replace(false);
    }

    /// Stops the live side run; its id, or None when none was live.
    pub fn side_cancel(&self) -> Option<String> {
        let side = lock(&self.side);
        let live = side.as_ref()?;
        live.cancel.cancel();
        Some(live.side_id.clone())
    }

    /// Reads the session's plan (its commitments) as folded so far.
    pub fn with_plan<R>(&self, f: impl FnOnce(&crate::log::plan::Plan) -> R) -> R {
        f(&lock(&self.folds).plan)
    }

    /// The session's recent side runs, oldest first.
    pub fn side_history(&self) -> Vec<SideEntry> {
        lock(&self.folds).sides.runs()
    }

    /// Stops the live leg and discards queued continuation input.
    pub fn cancel(&self) -> CancelResult {
        lock(&self.run).cancel()
    }

    /// Answers a pending approval. With `always`, the rule is stored first
    /// (so the call's later siblings already see it), then the approval is
    /// settled; a rule that cannot be stored leaves the approval valid this
    /// once and tells the session's clients with a notice.
    pub async fn answer(&self, request_id: &str, answer: Answer) -> Result<Answered> {
        // Approval ids are ours (`ap_` and 12 hex digits): anything far from
        // that shape is refused before it is looked up or echoed back.
        crate::ids::validate_plain_id("approval id", request_id)?;
        let stored = match self.approvals.prepare(request_id, &answer)? {
            Some(c) => Some((c.clone(), self.rt.rules().add(c).await)),
            None => None,
        };
        let settled = self.approvals.answer(request_id, answer, |tool, answer, event| {
            // An approved plan leaves plan mode before its call resumes, so
            // the run goes on in the new mode.
            if tool == PLAN_TOOL && answer.approve {
                let mode = answer.mode.unwrap_or(PermissionMode::Default);
                self.rt.set_mode(mode);
                // With --bus every replica switches too (without interrupting).
                if let Some(shared) = self.rt.cfg.shared_config.clone() {
                    tokio::spawn(async move {
                        let m = crate::cluster::shared_config::SharedMode { mode, interrupt: false };
                        if let Err(e) = shared.put_mode(m).await {
                            tracing::warn!("the plan's mode did not reach the other replicas: {}", e.message);
                        }
                    });
                }
                tracing::info!(session = %self.id, mode = mode.as_str(), "plan approved: permission mode changed");
            }
            self.publish(event)
        });
        let outcome = match settled {
            Ok(o) => o,
            Err(e) => {
                // Settled meanwhile by someone else: a rule made for this
                // answer alone goes too.
                if let Some((_, Ok((rule, true)))) = &stored {
                    let _ = self.rt.rules().delete(&rule.id).await;
                }
                return Err(e);
            }
        };
        let rule = match stored {
            None => None,
            Some((_, Ok((rule, _)))) => {
                tracing::info!(session = %self.id, rule = %rule.id, covers = %rule.what.describe(), "always-allow rule stored");
                Some(rule)
            }
            Some((c, Err(e))) => {
                let why = if e.kind == ErrorKind::Internal {
                    let incident = &uuid::Uuid::new_v4().simple().to_string()[..12];
                    tracing::error!(session = %self.id, incident, "cannot store an always-allow rule: {}", e.message);
                    format!("the server could not write its rules file (incident {incident}: the server log has the details)")
                } else {
                    e.message
                };
                self.publish(ClientEvent::Notice {
                    level: NoticeLevel::Warning,
                    text: format!(
                        "approved once: the always-allow rule for {} was not saved: {why}",
                        c.describe()
                    ),
                });
                None
            }
        };
        Ok(Answered { outcome, rule })
    }

    /// The permission mode changed: denies every pending approval with
    /// `reason`, then cancels the live run (and its queue) and the live side
    /// run. How many runs were cancelled (main and side), and how many
    /// approvals were denied.
    pub fn interrupt(&self, reason: &str) -> (usize, usize) {
        let denied = self.approvals.deny_all(reason, |e| self.publish(e));
        let main = usize::from(self.cancel().cancelled);
        let side = usize::from(self.side_cancel().is_some());
        (main + side, denied)
    }

    /// This replica lost the session's lease to another: it stops writing
    /// at once, as after a storage failure (the live run ends, streams get
    /// session_closed with `reason`, input is refused until a reload).
    pub fn stop_writing(&self, reason: &Stopped) {
        self.pipe.fail(reason);
        Visible::failed(self, reason);
    }

    /// Sets the title a client chose (None: derive it from the first prompt).
    pub fn set_title(&self, title: Option<String>) {
        *lock(&self.title) = title;
    }

    /// Whether a run is in flight now.
    pub fn is_busy(&self) -> bool {
        lock(&self.run).running()
    }

    /// The first step of deleting the session: from now on input is refused
    /// as not found. Refused (a conflict) while a run is live, checked under
    /// the same lock admission takes, so no run can start in between.
    pub fn begin_delete(&self) -> Result<()> {
        let mut run = lock(&self.run);
        run.idle().map_err(|r| r.error(&self.id))?;
        if let Some(live) = &*lock(&self.side) {
            return Err(Error::conflict(format!(
                "side_busy: session {} has a live side run {}; cancel it and wait for its side finished frame first",
                self.id, live.side_id
            ))
            .with_reason("side_busy"));
        }
        run.mark_deleted();
        Ok(())
    }

    /// What stopped this session's writer, if anything did (new work is refused with it).
    fn stopped_by(&self) -> Option<Stopped> {
        self.pipe.failure().map(|(reason, _)| reason)
    }

    /// Clears the history the model sees (clients keep the whole transcript):
    /// from the next run on the model starts afresh, as after a compaction
    /// with no summary (a ledger note, so it holds after a reload). Refused
    /// while a run is live; admissions are refused (conflict) until the
    /// note is folded in, so no run can start on the old history. Returns
    /// the last seq the model no longer sees.
    pub async fn clear_history(&self) -> Result<u64> {
        self.edit_history(|latest, _| {
            let note = Note::Compaction(Compaction {
                summary: String::new(),
                upto_seq: latest,
            });
            Ok((note, latest))
        })
        .await
    }

    /// Takes the last exchange the model sees back from it (its user
    /// message and everything after), like `clear_history` otherwise; a
    /// conflict when there is none. Returns the seqs it no longer sees
    /// (after_seq, upto_seq].
    pub async fn undo_last(&self) -> Result<Undo> {
        self.edit_history(|latest, t| {
            let u = t
                .last_exchange(latest)
                .ok_or_else(|| Error::conflict("nothing to undo: the model sees no exchange"))?;
            Ok((Note::Undo(u), u))
        })
        .await
    }

    /// Has the model summarise the history now; from the next run on it sees
    /// the summary in place of the messages up to the returned seq (clients
    /// keep the transcript). Refused unless idle or with nothing to
    /// compact; admissions are refused (conflict) until it is done. Bounded
    /// by the provider's timeouts; shutdown cancels it.
    pub async fn compact_history(&self) -> Result<u64> {
        // Cancel (and shutdown) cancel the leg token: they stop this too.
        let cancel = CancellationToken::new();
        {
            let begun = lock(&self.run).begin_edit(Some(cancel.clone()));
            begun.map_err(|r| r.error(&self.id))?;
        }
        let compacted = async {
            self.flush().await?;
            if self.transcript().chat().is_empty() {
                return Err(Error::conflict("nothing to compact: the model sees no message"));
            }
            crate::session::agent::compact_now(self, &cancel).await?;
            self.flush().await?;
            Ok(lock(&self.folds)
                .transcript
                .compaction
                .as_ref()
                .map_or(0, |c| c.upto_seq))
        }
        .await;
        lock(&self.run).end_edit();
        compacted
    }

    /// Changes what the model sees of the history with one ledger note made
    /// from the history as of its latest seq. Refused unless the session is
    /// idle; admissions are refused (conflict) until the note is folded in,
    /// so no run starts on the old history.
    async fn edit_history<T>(&self, make: impl FnOnce(u64, &Transcript) -> Result<(Note, T)>) -> Result<T> {
        {
            let begun = lock(&self.run).begin_edit(None);
            begun.map_err(|r| r.error(&self.id))?;
        }
        let edited = async {
            // Everything published so far (a run_finished still in the
            // writer) is folded in before the note is placed after it.
            self.flush().await?;
            let latest = self.bus.latest_seq();
            let (note, out) = make(latest, &lock(&self.folds).transcript)?;
            self.pipe.push(Op::Note(note));
            self.flush().await?;
            Ok(out)
        }
        .await;
        lock(&self.run).end_edit();
        edited
    }

    /// Ends every stream of the session with session_closed {reason}, once
    /// what was published before is visible on them.
    pub async fn close_streams(&self, reason: CloseReason) {
        let _ = self.pipe.barrier().await;
        self.bus.close(reason);
    }

    /// Resolves once no run is in flight, main or side (its run_finished
    /// or side finished published).
    pub async fn settled(&self) {
        let mut busy = self.busy.subscribe();
        let _ = busy.wait_for(|b| !*b).await;
        let mut side_busy = self.side_busy.subscribe();
        let _ = side_busy.wait_for(|b| !*b).await;
    }

    /// Refuses new input, cancels what runs, waits (bounded) for the chain
    /// to settle, then ends every subscription and syncs the ledger.
    pub async fn shutdown(&self, grace: Duration) {
        {
            lock(&self.run).shut();
        }
        self.side_cancel();
        let mut busy = self.busy.subscribe();
        let _ = tokio::time::timeout(grace, busy.wait_for(|b| !*b)).await;
        let mut side_busy = self.side_busy.subscribe();
        let _ = tokio::time::timeout(grace, side_busy.wait_for(|b| !*b)).await;
        // What the settled run published reaches the disk and its streams
        // before they are closed.
        let _ = tokio::time::timeout(grace, self.pipe.barrier()).await;
        self.bus.close(CloseReason::ShuttingDown);
        let log = self.log.clone();
        let synced = tokio::task::spawn_blocking(move || log.sync()).await;
        if let Ok(Err(e)) = synced {
            tracing::error!(session = %self.id, "ledger sync failed: {e}");
        }
    }
}

/// The agent loop and side chat see the session through this.
impl TurnContext for Session {
    fn id(&self) -> &str {
        Session::id(self)
    }
    fn runtime(&self) -> &Runtime {
        Session::runtime(self)
    }
    fn emit(&self, event: AgentEvent) {
        Session::emit(self, event)
    }
    fn pace(&self) -> impl Future<Output = ()> + Send + '_ {
        Session::pace(self)
    }
    fn flush(&self) -> impl Future<Output = Result<()>> + Send + '_ {
        Session::flush(self)
    }
    fn transcript(&self) -> Transcript {
        Session::transcript(self)
    }
    fn approvals(&self) -> &Approvals {
        Session::approvals(self)
    }
    fn worker_slots(&self) -> &Arc<tokio::sync::Semaphore> {
        &self.worker_slots
    }
    fn update_plan<'a>(
        &'a self,
        input: &'a serde_json::Value,
    ) -> impl Future<Output = std::result::Result<String, String>> + Send + 'a {
        Session::update_plan(self, input)
    }
    fn prompt_base(&self) -> &std::sync::Mutex<crate::receipt::PromptBase> {
        &self.prompt_base
    }
}

impl Visible for Session {
    fn commit(&self, frames: Vec<Arc<Frame>>, notes: Vec<(u64, Note)>, admitted: Vec<String>) {
        // Folds, then bus, under the folds lock: `subscribe_presented` sees
        // both at the same point.
        let mut f = lock(&self.folds);
        for id in admitted {
            f.facts.remember_request(id);
        }
        let mut notes = notes.into_iter().peekable();
        for frame in &frames {
            while let Some((_, note)) = notes.next_if(|(after, _)| *after < frame.seq) {
                f.note(&note);
            }
            f.apply(frame.seq, &frame.event);
        }
        for (_, note) in notes {
            f.note(&note);
        }
        crate::session::derived::feed(&self.rt, &self.id, &mut f, &frames);
        self.bus.commit(frames);
    }

    fn snapshot(&self) -> Record {
        let f = lock(&self.folds);
        Record::Snapshot(Box::new(Snapshot {
            seq: self.bus.latest_seq(),
            transcript: f.transcript.clone(),
            presenter: f.presenter.clone(),
            facts: f.facts.clone(),
            sides: f.sides.clone(),
            background: f.background.clone(),
            plan: f.plan.clone(),
        }))
    }

    /// The live run ends, queued input is dropped, every stream gets
    /// session_closed with the reason, and new work is refused with it until
    /// the session is reloaded.
    fn failed(&self, reason: &Stopped) {
        {
            // The pipe keeps the cause (it failed first); new work is refused from it.
            lock(&self.run).cancel();
        }
        self.side_cancel();
        self.bus.close(CloseReason::Stopped(reason.clone()));
        self.stopped.send_replace(true);
    }
}
