//! What a child session is to its parent (a worker or a best-of-N candidate), as events and listings carry it.

use serde::{Deserialize, Serialize};

/// Why a child was spawned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkerKind {
    /// The model's `spawn_worker` tool (or the offline model's `/worker`).
    Worker,
    /// One run of a best-of-N.
    Candidate,
}

/// Where a child is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkerState {
    Running,
    /// Steered after it finished, its next run not started yet.
    Idle,
    Finished,
    Failed,
    Cancelled,
}

impl WorkerKind {
    pub fn as_str(self) -> &'static str {
        match self {
            WorkerKind::Worker => "worker",
            WorkerKind::Candidate => "candidate",
        }
    }
}

impl WorkerState {
    pub fn as_str(self) -> &'static str {
        match self {
            WorkerState::Running => "running",
            WorkerState::Idle => "idle",
            WorkerState::Finished => "finished",
            WorkerState::Failed => "failed",
            WorkerState::Cancelled => "cancelled",
        }
    }

    /// Whether the child's work is over (it may still be steered).
    pub fn is_settled(self) -> bool {
        matches!(
            self,
            WorkerState::Finished | WorkerState::Failed | WorkerState::Cancelled
        )
    }
}

/// What a `worker` event says happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkerPhase {
    Spawned,
    State,
    Finished,
}

impl WorkerPhase {
    pub fn as_str(self) -> &'static str {
        match self {
            WorkerPhase::Spawned => "spawned",
            WorkerPhase::State => "state",
            WorkerPhase::Finished => "finished",
        }
    }
}

/// A change's size, as `git diff --shortstat` counts it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiffStat {
    pub files: u32,
    pub insertions: u32,
    pub deletions: u32,
}

/// One child of a session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerInfo {
    /// The child's own session id.
    pub id: String,
    pub parent_id: String,
    pub kind: WorkerKind,
    pub prompt: String,
    pub state: WorkerState,
    /// `vak/<parent-id>/<child-id>`; empty when not isolated.
    #[serde(default)]
    pub branch: String,
    /// The worktree's absolute path; empty when not isolated.
    #[serde(default)]
    pub worktree: String,
    /// RFC 3339, UTC.
    pub started_at: String,
    /// The final answer's first paragraph, or why it failed.
    #[serde(default)]
    pub summary: String,
    /// The worktree's change once finished (isolated children only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diff_stat: Option<DiffStat>,
    /// The best-of-N a candidate belongs to; empty for a worker.
    #[serde(default)]
    pub bestofn_id: String,
}

/// Why a candidate's worktree and branch were removed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DiscardWhy {
    /// `POST /sessions/:id/discard`.
    Discarded,
    /// Another candidate was kept.
    KeptOther,
}

impl DiscardWhy {
    pub fn as_str(self) -> &'static str {
        match self {
            DiscardWhy::Discarded => "discarded",
            DiscardWhy::KeptOther => "kept_other",
        }
    }
}

/// A request to spawn one child.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Spawn {
    pub parent: String,
    pub kind: WorkerKind,
    pub prompt: String,
    /// Run in a fresh git worktree of the parent's workspace (else in the
    /// parent's workspace itself).
    pub isolated: bool,
    /// The best-of-N a candidate belongs to; empty for a worker.
    pub bestofn_id: String,
    /// Whether the parent waits for the child's answer (`spawn_worker`'s
    /// `wait`). When false, the spawner delivers the child's final answer to
    /// the parent as a `background_result` (source worker, id the child's)
    /// once the child settles.
    pub wait: bool,
}

/// A child whose run has settled, as a waiter gets it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settled {
    pub info: WorkerInfo,
    /// Its run's whole final answer (the listing's `summary` is only its
    /// first paragraph); empty when it said nothing or did not finish.
    pub answer: String,
}

/// What spawns children and waits for them: the host's children table
/// implements it (`host/children.rs`); the agent loop's `spawn_worker`
/// tool reaches it through the runtime, so the session layer needs no
/// handle on the registry.
pub trait Spawner: Send + Sync + 'static {
    /// Spawns a child and starts its run; answers its info (state running).
    fn spawn(&self, req: Spawn) -> futures_util::future::BoxFuture<'_, crate::Result<WorkerInfo>>;
    /// Resolves once the child's run has settled (finished, failed or
    /// cancelled), with its info and final answer. Cancelling `cancel`
    /// stops the child first.
    fn wait(
        &self,
        child: &str,
        cancel: tokio_util::sync::CancellationToken,
    ) -> futures_util::future::BoxFuture<'_, crate::Result<Settled>>;
}
