//! What the scheduler is given (a firer, a slot claim, a store, a clock) and the handle through which the server asks its owner task about tasks.

use std::sync::Arc;

use futures_util::future::BoxFuture;
use jiff::tz::TimeZone;
use jiff::{Timestamp, Zoned};
use tokio::sync::{mpsc, oneshot};

use super::clock::Clock;
use super::store::TaskPersist;
use super::task::{FieldError, LastFire, NewTask, TaskCheck, TaskDef, TaskPatch};
use crate::{Error, ErrorKind};

/// One fire of a task.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fire {
    /// A scheduled slot's instant as unix seconds (digits only: it names
    /// the run's request id `task:<id>:<slot>` and the claim key
    /// `task/<id>/<slot>`), or `now-<unix millis>` for a run-now.
    pub slot: String,
    /// When the scheduler fired it (later than the slot when it was late
    /// or caught up at startup).
    pub at: Timestamp,
    /// Run now, not the schedule.
    pub manual: bool,
}

/// Does what a fire does (admits a run, runs a script) and says how it
/// went. The scheduler spawns the future and records its answer; `fire`
/// itself is called on the scheduler's owner task, so it only builds the
/// future and does its work inside it.
pub trait Firer: Send + Sync + 'static {
    fn fire(&self, task: TaskDef, fire: Fire) -> BoxFuture<'static, LastFire>;
}

/// Claims a scheduled slot for this replica: false means another replica
/// has it (and fires it), so this one moves on.
pub trait SlotClaim: Send + Sync + 'static {
    fn claim(&self, task_id: &str, slot: &str) -> BoxFuture<'_, bool>;
}

/// A single server: every slot is its own.
#[derive(Clone, Copy, Debug, Default)]
pub struct LocalClaim;

impl SlotClaim for LocalClaim {
    fn claim(&self, _task_id: &str, _slot: &str) -> BoxFuture<'_, bool> {
        Box::pin(async { true })
    }
}

/// What the scheduler is given at start.
pub struct SchedulerConfig {
    pub persist: Arc<dyn TaskPersist>,
    pub clock: Arc<dyn Clock>,
    /// The zone schedules are read in (`zone::resolve`).
    pub tz: TimeZone,
    /// Fire each task's most recent missed slot once at start.
    pub catch_up_missed: bool,
    pub firer: Arc<dyn Firer>,
    pub claim: Arc<dyn SlotClaim>,
    pub check: Arc<dyn TaskCheck>,
}

/// A task and when it fires next (enabled and scheduled only).
#[derive(Clone, Debug, PartialEq)]
pub struct TaskView {
    pub def: TaskDef,
    pub next_fire: Option<Zoned>,
}

/// Why a request about tasks was refused.
#[derive(Debug)]
pub enum TaskError {
    NotFound,
    /// A field is wrong; `FieldError::field` is its wire name.
    Invalid(FieldError),
    /// `MAX_TASKS` exist.
    Full,
    /// The store failed, or the scheduler has stopped.
    Store(Error),
}

impl std::fmt::Display for TaskError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TaskError::NotFound => f.write_str("no such task"),
            TaskError::Invalid(e) => e.fmt(f),
            TaskError::Full => write!(f, "at most {} tasks", super::store::MAX_TASKS),
            TaskError::Store(e) => f.write_str(&e.message),
        }
    }
}

impl std::error::Error for TaskError {}

impl From<TaskError> for Error {
    fn from(e: TaskError) -> Error {
        match e {
            TaskError::NotFound => Error::not_found(e.to_string()),
            TaskError::Invalid(_) => Error::invalid(e.to_string()),
            TaskError::Full => Error::new(ErrorKind::ResourceExhausted, e.to_string()),
            TaskError::Store(e) => e,
        }
    }
}

/// A request to the owner task, each with its reply.
pub(super) enum Request {
    List(oneshot::Sender<Vec<TaskView>>),
    Get(String, oneshot::Sender<Result<TaskView, TaskError>>),
    Create(NewTask, oneshot::Sender<Result<TaskView, TaskError>>),
    Update(String, TaskPatch, oneshot::Sender<Result<TaskView, TaskError>>),
    Delete(String, oneshot::Sender<Result<(), TaskError>>),
    RunNow(String, oneshot::Sender<Result<TaskView, TaskError>>),
    NextFires(usize, oneshot::Sender<Vec<TaskView>>),
    Reload(oneshot::Sender<Result<(), TaskError>>),
    Stop(oneshot::Sender<()>),
}

/// Requests waiting for the owner task, at most.
pub(super) const REQUEST_QUEUE: usize = 64;

/// Asks the owner task; clones share it. It stops when every handle is
/// dropped or `stop` is called.
#[derive(Clone)]
pub struct SchedulerHandle {
    tx: mpsc::Sender<Request>,
    tz: TimeZone,
}

impl SchedulerHandle {
    pub(super) fn new(tx: mpsc::Sender<Request>, tz: TimeZone) -> SchedulerHandle {
        SchedulerHandle { tx, tz }
    }
}

fn stopped() -> TaskError {
    TaskError::Store(Error::new(ErrorKind::Unavailable, "the scheduler has stopped"))
}

impl SchedulerHandle {
    async fn ask<T>(&self, make: impl FnOnce(oneshot::Sender<T>) -> Request) -> Result<T, TaskError> {
        let (tx, rx) = oneshot::channel();
        self.tx.send(make(tx)).await.map_err(|_| stopped())?;
        rx.await.map_err(|_| stopped())
    }

    /// Every task, oldest first.
    pub async fn list(&self) -> Result<Vec<TaskView>, TaskError> {
        self.ask(Request::List).await
    }

    pub async fn get(&self, id: &str) -> Result<TaskView, TaskError> {
        self.ask(|r| Request::Get(id.to_owned(), r)).await?
    }

    /// Validates, persists and schedules a new task.
    pub async fn create(&self, task: NewTask) -> Result<TaskView, TaskError> {
        self.ask(|r| Request::Create(task, r)).await?
    }

    /// Applies, validates and persists a change; a changed schedule or a
    /// task enabled again fires next after now (and after its last slot).
    pub async fn update(&self, id: &str, patch: TaskPatch) -> Result<TaskView, TaskError> {
        self.ask(|r| Request::Update(id.to_owned(), patch, r)).await?
    }

    /// Removes a task; a fire of it in flight finishes and its result is dropped.
    pub async fn delete(&self, id: &str) -> Result<(), TaskError> {
        self.ask(|r| Request::Delete(id.to_owned(), r)).await?
    }

    /// Fires the task now (`manual`, no claim, disabled or not) and
    /// schedules its next fire after now; answers once the fire is spawned.
    pub async fn run_now(&self, id: &str) -> Result<TaskView, TaskError> {
        self.ask(|r| Request::RunNow(id.to_owned(), r)).await?
    }

    /// Enabled, scheduled tasks, soonest first, at most `limit`.
    pub async fn next_fires(&self, limit: usize) -> Result<Vec<TaskView>, TaskError> {
        self.ask(|r| Request::NextFires(limit, r)).await
    }

    /// Reads the store again (one that other replicas write): its tasks
    /// replace these; a task's last slot is the later of the two.
    pub async fn reload(&self) -> Result<(), TaskError> {
        self.ask(Request::Reload).await?
    }

    /// The zone schedules are read in.
    pub async fn timezone(&self) -> TimeZone {
        self.tz.clone()
    }

    /// Stops the owner task and waits for it: no fire starts after this
    /// returns (fires already running finish; their results are dropped).
    pub async fn stop(&self) {
        let _ = self.ask(Request::Stop).await;
    }
}
