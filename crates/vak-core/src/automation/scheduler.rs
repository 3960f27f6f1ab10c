//! The scheduler: one owner task holds every task definition, fires due slots through a `Firer`, persists a slot before firing it, and answers its handles on a bounded queue.
//!
//! tokio-console's aggregator pattern, like `file_owner`: the state lives
//! in the owner task alone, so nothing is shared behind a lock. The owner
//! never awaits a fire: each runs in a task of its own and reports its
//! `LastFire` back on a second bounded queue. It sleeps until the next due
//! slot, at most `MAX_SLEEP` at a time, then reads the clock again, so a
//! wall-clock jump is noticed within a minute.

use std::sync::Arc;
use std::time::Duration;

use jiff::tz::TimeZone;
use jiff::{SignedDuration, Timestamp};
use tokio::sync::mpsc;

pub use super::clock::{Clock, SystemClock, TokioClock};
use super::cron::CronSchedule;
pub use super::handle::{
    Fire, Firer, LocalClaim, SchedulerConfig, SchedulerHandle, SlotClaim, TaskError, TaskView,
};
use super::handle::{Request, REQUEST_QUEUE};
use super::store::{TaskPersist, MAX_TASKS};
use super::task::{new_task_id, LastFire, NewTask, TaskCheck, TaskDef, TaskOutcome, TaskPatch};
use crate::{Error, Result};

/// How long the owner sleeps at most before reading the clock again.
const MAX_SLEEP: Duration = Duration::from_secs(60);

/// How long a claim may take; past it the slot is left to other replicas
/// (firing it unclaimed could fire it twice).
const CLAIM_TIMEOUT: Duration = Duration::from_secs(10);

/// Finished fires waiting to be recorded, at most.
const DONE_QUEUE: usize = 64;

/// How far back `latest_slot` looks for a task's most recent slot, in
/// widening steps, so a dense schedule is not walked from a slot years old.
const LOOK_BACK: [SignedDuration; 6] = [
    SignedDuration::from_hours(1),
    SignedDuration::from_hours(24),
    SignedDuration::from_hours(24 * 7),
    SignedDuration::from_hours(24 * 32),
    SignedDuration::from_hours(24 * 366),
    SignedDuration::from_hours(24 * 366 * 5),
];

pub struct Scheduler;

impl Scheduler {
    /// Loads the tasks and starts the owner task on the current tokio
    /// runtime. A store that cannot be read fails the start.
    pub fn start(cfg: SchedulerConfig) -> Result<SchedulerHandle> {
        let tasks = cfg.persist.load()?;
        let (tx, requests) = mpsc::channel(REQUEST_QUEUE);
        let (done_tx, done_rx) = mpsc::channel(DONE_QUEUE);
        let owner = Owner {
            persist: cfg.persist,
            clock: cfg.clock,
            tz: cfg.tz.clone(),
            firer: cfg.firer,
            claim: cfg.claim,
            check: cfg.check,
            tasks: tasks.into_iter().map(Entry::new).collect(),
            requests,
            done_tx,
            done_rx,
        };
        tokio::spawn(owner.run(cfg.catch_up_missed));
        Ok(SchedulerHandle::new(tx, cfg.tz))
    }
}

/// The most recent slot at or before `now`, given `first`, one at or before it.
fn latest_slot(schedule: &CronSchedule, first: Timestamp, now: Timestamp, tz: &TimeZone) -> Timestamp {
    let mut latest = first;
    for window in LOOK_BACK {
        let anchor = now - window;
        if anchor <= latest {
            break;
        }
        if let Some(s) = schedule.next_after(anchor, tz).filter(|&s| s <= now) {
            latest = s;
            break;
        }
    }
    while let Some(s) = schedule.next_after(latest, tz).filter(|&s| s <= now) {
        latest = s;
    }
    latest
}

/// A task as the owner holds it.
struct Entry {
    def: TaskDef,
    /// The parsed schedule; None when the task has none (or the stored one
    /// no longer parses, which is logged).
    schedule: Option<CronSchedule>,
    /// The next slot to fire; None when disabled or unscheduled.
    next: Option<Timestamp>,
}

impl Entry {
    fn new(def: TaskDef) -> Entry {
        let schedule = def.schedule.as_deref().and_then(|s| match CronSchedule::parse(s) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(task = %def.id, "stored schedule does not parse, the task will not fire: {e}");
                None
            }
        });
        Entry {
            def,
            schedule,
            next: None,
        }
    }

    /// The last slot fired, as an instant.
    fn last_slot(&self) -> Option<Timestamp> {
        let secs = self.def.last_slot.as_deref()?.parse::<i64>().ok()?;
        Timestamp::from_second(secs).ok()
    }

    /// Sets `next` to the first slot after `from`, the last slot and the
    /// task's creation (a slot at the instant of creation was never due).
    fn plan(&mut self, from: Timestamp, tz: &TimeZone) {
        let from = from.max(self.def.created_at);
        let from = self.last_slot().map_or(from, |l| l.max(from));
        self.next = match &self.schedule {
            Some(s) if self.def.enabled => s.next_after(from, tz),
            _ => None,
        };
    }
}

/// A fire's answer, for the owner to record.
struct Done {
    task_id: String,
    last: LastFire,
}

struct Owner {
    persist: Arc<dyn TaskPersist>,
    clock: Arc<dyn Clock>,
    tz: TimeZone,
    firer: Arc<dyn Firer>,
    claim: Arc<dyn SlotClaim>,
    check: Arc<dyn TaskCheck>,
    /// Oldest first.
    tasks: Vec<Entry>,
    requests: mpsc::Receiver<Request>,
    done_tx: mpsc::Sender<Done>,
    done_rx: mpsc::Receiver<Done>,
}

impl Owner {
    async fn run(mut self, catch_up: bool) {
        let now = self.clock.now();
        // A slot at exactly the start instant is due, not missed.
        let start = now - SignedDuration::from_nanos(1);
        for i in 0..self.tasks.len() {
            if catch_up {
                self.catch_up(i, now).await;
            }
            self.tasks[i].plan(start, &self.tz);
        }
        loop {
            self.fire_due(self.clock.now()).await;
            let wait = self.sleep_for(self.clock.now());
            tokio::select! {
                request = self.requests.recv() => match request {
                    None => break,
                    Some(Request::Stop(reply)) => {
                        let _ = reply.send(());
                        break;
                    }
                    Some(request) => self.handle(request).await,
                },
                Some(done) = self.done_rx.recv() => self.record(done).await,
                () = tokio::time::sleep(wait) => {}
            }
        }
        tracing::debug!("the scheduler has stopped");
    }

    /// Until the soonest next slot, at most `MAX_SLEEP`.
    fn sleep_for(&self, now: Timestamp) -> Duration {
        self.tasks
            .iter()
            .filter_map(|e| e.next)
            .min()
            .map_or(MAX_SLEEP, |next| {
                Duration::try_from(next.duration_since(now))
                    .unwrap_or(Duration::ZERO)
                    .min(MAX_SLEEP)
            })
    }

    /// Fires each task's most recent slot due by `now` (the planned one,
    /// unless the clock jumped past later ones: those before it are
    /// skipped), then plans its next slot after now.
    async fn fire_due(&mut self, now: Timestamp) {
        for i in 0..self.tasks.len() {
            let entry = &self.tasks[i];
            let Some(due) = entry.next.filter(|&s| s <= now) else {
                continue;
            };
            let slot = entry
                .schedule
                .as_ref()
                .map_or(due, |s| latest_slot(s, due, now, &self.tz));
            self.fire_slot(i, slot, now).await;
            self.tasks[i].plan(now.max(slot), &self.tz);
        }
    }

    /// At start: fires a task's most recent slot at or before `now` when it
    /// is later than its last slot and than the task's creation.
    async fn catch_up(&mut self, i: usize, now: Timestamp) {
        let entry = &self.tasks[i];
        let Some(schedule) = entry.schedule.as_ref().filter(|_| entry.def.enabled) else {
            return;
        };
        // Slots strictly after this are candidates: a slot at the very
        // instant of creation was not planned then (plans are strictly
        // after now), so it is not missed either.
        let created = entry.def.created_at;
        let floor = entry.last_slot().map_or(created, |l| l.max(created));
        let Some(first) = schedule.next_after(floor, &self.tz).filter(|&s| s <= now) else {
            return;
        };
        let latest = latest_slot(schedule, first, now, &self.tz);
        tracing::info!(task = %entry.def.id, slot = %latest, "catching up a missed slot");
        self.fire_slot(i, latest, now).await;
    }

    /// Claims a scheduled slot, persists it as the task's last slot, then
    /// spawns its fire. Unclaimed: another replica has it. Not persisted:
    /// not fired either, since a restart would not know it had been.
    async fn fire_slot(&mut self, i: usize, slot: Timestamp, now: Timestamp) {
        let id = self.tasks[i].def.id.clone();
        let slot_name = slot.as_second().to_string();
        let claimed = tokio::time::timeout(CLAIM_TIMEOUT, self.claim.claim(&id, &slot_name))
            .await
            .unwrap_or_else(|_| {
                tracing::warn!(task = %id, slot = %slot_name, "claiming the slot timed out; left to other replicas");
                false
            });
        if !claimed {
            tracing::debug!(task = %id, slot = %slot_name, "slot claimed elsewhere");
            return;
        }
        self.tasks[i].def.last_slot = Some(slot_name.clone());
        if let Err(e) = self.persist().await {
            tracing::error!(task = %id, slot = %slot_name, "not firing: {}", e.message);
            self.tasks[i].def.last_fire = Some(LastFire {
                at: now,
                outcome: TaskOutcome::Failed,
                slot: slot_name,
                session_id: None,
                message: format!("not fired: {}", e.message),
            });
            return;
        }
        let def = self.tasks[i].def.clone();
        self.spawn_fire(
            def,
            Fire {
                slot: slot_name,
                at: now,
                manual: false,
            },
        );
    }

    fn spawn_fire(&self, def: TaskDef, fire: Fire) {
        let task_id = def.id.clone();
        let run = self.firer.fire(def, fire);
        let done = self.done_tx.clone();
        tokio::spawn(async move {
            let last = run.await;
            // The owner may have stopped: the result has nowhere to go.
            let _ = done.send(Done { task_id, last }).await;
        });
    }

    /// Records a finished fire; a task deleted meanwhile drops it.
    async fn record(&mut self, done: Done) {
        let Some(i) = self.index(&done.task_id) else {
            return;
        };
        self.tasks[i].def.last_fire = Some(done.last);
        if let Err(e) = self.persist().await {
            tracing::error!(task = %done.task_id, "cannot record the last fire: {}", e.message);
        }
    }

    /// Writes every task through the store, off the runtime's threads.
    async fn persist(&self) -> Result<()> {
        let defs: Vec<TaskDef> = self.tasks.iter().map(|e| e.def.clone()).collect();
        let persist = self.persist.clone();
        tokio::task::spawn_blocking(move || persist.save(&defs))
            .await
            .map_err(|e| Error::internal(format!("the task store's writer failed: {e}")))?
    }

    fn index(&self, id: &str) -> Option<usize> {
        self.tasks.iter().position(|e| e.def.id == id)
    }

    fn view(&self, entry: &Entry) -> TaskView {
        TaskView {
            def: entry.def.clone(),
            next_fire: entry.next.map(|t| t.to_zoned(self.tz.clone())),
        }
    }

    async fn handle(&mut self, request: Request) {
        // A requester that went away does not care for the answer.
        match request {
            Request::List(reply) => {
                let _ = reply.send(self.tasks.iter().map(|e| self.view(e)).collect());
            }
            Request::Get(id, reply) => {
                let view = self.index(&id).map(|i| self.view(&self.tasks[i]));
                let _ = reply.send(view.ok_or(TaskError::NotFound));
            }
            Request::Create(task, reply) => {
                let _ = reply.send(self.create(task).await);
            }
            Request::Update(id, patch, reply) => {
                let _ = reply.send(self.update(&id, patch).await);
            }
            Request::Delete(id, reply) => {
                let _ = reply.send(self.delete(&id).await);
            }
            Request::RunNow(id, reply) => {
                let _ = reply.send(self.run_now(&id));
            }
            Request::NextFires(limit, reply) => {
                let mut due: Vec<&Entry> = self.tasks.iter().filter(|e| e.next.is_some()).collect();
                due.sort_by_key(|e| e.next);
                let _ = reply.send(due.into_iter().take(limit).map(|e| self.view(e)).collect());
            }
            Request::Reload(reply) => {
                let _ = reply.send(self.reload().await);
            }
            // The run loop answers Stop itself.
            Request::Stop(reply) => {
                let _ = reply.send(());
            }
        }
    }

    async fn create(&mut self, task: NewTask) -> Result<TaskView, TaskError> {
        if self.tasks.len() >= MAX_TASKS {
            return Err(TaskError::Full);
        }
        let now = self.clock.now();
        let def = task.into_def(new_task_id(), now).map_err(TaskError::Invalid)?;
        def.validate(self.check.as_ref()).map_err(TaskError::Invalid)?;
        let mut entry = Entry::new(def);
        entry.plan(now, &self.tz);
        self.tasks.push(entry);
        if let Err(e) = self.persist().await {
            self.tasks.pop();
            return Err(TaskError::Store(e));
        }
        Ok(self.view(&self.tasks[self.tasks.len() - 1]))
    }

    async fn update(&mut self, id: &str, patch: TaskPatch) -> Result<TaskView, TaskError> {
        let i = self.index(id).ok_or(TaskError::NotFound)?;
        let def = self.tasks[i].def.patched(patch).map_err(TaskError::Invalid)?;
        def.validate(self.check.as_ref()).map_err(TaskError::Invalid)?;
        let old = &self.tasks[i];
        let same_plan = old.def.schedule == def.schedule && old.def.enabled == def.enabled;
        let kept_next = old.next;
        let mut entry = Entry::new(def);
        if same_plan {
            entry.next = kept_next;
        } else {
            entry.plan(self.clock.now(), &self.tz);
        }
        let old = std::mem::replace(&mut self.tasks[i], entry);
        if let Err(e) = self.persist().await {
            self.tasks[i] = old;
            return Err(TaskError::Store(e));
        }
        Ok(self.view(&self.tasks[i]))
    }

    async fn delete(&mut self, id: &str) -> Result<(), TaskError> {
        let i = self.index(id).ok_or(TaskError::NotFound)?;
        let removed = self.tasks.remove(i);
        if let Err(e) = self.persist().await {
            self.tasks.insert(i, removed);
            return Err(TaskError::Store(e));
        }
        Ok(())
    }

    /// Fires now, unclaimed (a person asked this replica), and plans the
    /// next scheduled slot after now.
    fn run_now(&mut self, id: &str) -> Result<TaskView, TaskError> {
        let i = self.index(id).ok_or(TaskError::NotFound)?;
        let now = self.clock.now();
        let fire = Fire {
            slot: format!("now-{}", now.as_millisecond()),
            at: now,
            manual: true,
        };
        self.spawn_fire(self.tasks[i].def.clone(), fire);
        self.tasks[i].plan(now, &self.tz);
        Ok(self.view(&self.tasks[i]))
    }

    /// Replaces the tasks with the store's. A task's last slot is the
    /// later of the two (either replica may have fired last); its next
    /// slot is kept when its schedule and state are unchanged and it is
    /// still after the last slot, else planned from now.
    async fn reload(&mut self) -> Result<(), TaskError> {
        let persist = self.persist.clone();
        let loaded = tokio::task::spawn_blocking(move || persist.load())
            .await
            .map_err(|e| TaskError::Store(Error::internal(format!("the task store's reader failed: {e}"))))?
            .map_err(TaskError::Store)?;
        let now = self.clock.now();
        let mut tasks = Vec::with_capacity(loaded.len());
        for def in loaded {
            let mut entry = Entry::new(def);
            match self.index(&entry.def.id).map(|i| &self.tasks[i]) {
                Some(old) => {
                    if old.last_slot() > entry.last_slot() {
                        entry.def.last_slot.clone_from(&old.def.last_slot);
                    }
                    let same_plan =
                        old.def.schedule == entry.def.schedule && old.def.enabled == entry.def.enabled;
                    let after_last = |t: Timestamp| entry.last_slot().is_none_or(|l| t > l);
                    match old.next.filter(|&t| same_plan && after_last(t)) {
                        Some(next) => entry.next = Some(next),
                        None => entry.plan(now, &self.tz),
                    }
                }
                None => entry.plan(now, &self.tz),
            }
            tasks.push(entry);
        }
        self.tasks = tasks;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
