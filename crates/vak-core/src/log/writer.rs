//! The one writer of a session: it numbers every event, appends whole batches to the log off the runtime (group commit), and only then makes them visible.
//!
//! Publishers push operations into a `Pipe` without waiting for the disk;
//! the writer task takes everything that arrived while its previous append
//! was in flight and appends it as one batch on a blocking thread. No lock
//! is held across the file I/O. A batch becomes visible (folds, ring,
//! subscriber queues) only after its append succeeded, so a seq a client
//! has seen is always on disk. A failed append fails the session: nothing
//! of that batch or after it becomes visible, and every later push is
//! refused with the storage reason.

use crate::event::{ClientEvent, Frame, Note};
use crate::log::ledger::{Batch, Log, Record};
use crate::stopped::Stopped;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Instant;
use tokio::sync::{oneshot, Notify};

/// Operations waiting for the writer beyond which publishers that pace
/// themselves (the agent loop) wait for room.
pub(crate) const PIPE_ROOM: usize = 4096;

/// A reply to an operation that must be durable before its caller goes on.
pub(crate) type Done = oneshot::Sender<Result<(), Stopped>>;

pub(crate) enum Op {
    /// A client event, its frame built by the publisher (seq 0 until the
    /// writer numbers it): the allocation and sizing happen on the
    /// publisher's task, not on the writer's, which every event goes through.
    Event(Arc<Frame>),
    /// An internal fact, kept in order with the events around it.
    Note(Note),
    /// A request id admitted; replied to once it is durable.
    Admitted { request_id: String, done: Done },
    /// Replied to once everything pushed before it is durable and visible.
    Barrier(Done),
}

impl Op {
    pub(crate) fn event(session_id: &Arc<str>, event: ClientEvent) -> Op {
        Op::Event(Arc::new(Frame::new(0, session_id.clone(), event)))
    }

    fn refuse(self, reason: &Stopped) {
        match self {
            Op::Admitted { done, .. } | Op::Barrier(done) => {
                let _ = done.send(Err(reason.clone()));
            }
            Op::Event(_) | Op::Note(_) => {}
        }
    }
}

/// What the writer hands back to the session once a batch is durable.
pub(crate) trait Visible: Send + Sync + 'static {
    /// `notes` each carry the seq of the last event published before them.
    fn commit(&self, frames: Vec<Arc<Frame>>, notes: Vec<(u64, Note)>, admitted: Vec<String>);
    /// The session's state as of the last commit, as a ledger record.
    fn snapshot(&self) -> Record;
    fn failed(&self, reason: &Stopped);
}

#[derive(Default)]
pub(crate) struct Pipe {
    state: Mutex<PipeState>,
    /// The writer waits here for work (one consumer: a stored permit is never lost).
    wake: Notify,
    /// Pacing publishers wait here for room.
    room: Notify,
}

#[derive(Default)]
struct PipeState {
    ops: Vec<Op>,
    /// The last taken batch's buffer, emptied and handed back by the writer:
    /// the next batch fills it instead of growing a fresh one by doubling.
    spare: Vec<Op>,
    closed: bool,
    /// Why the session's writes stopped, and when: the first cause is kept
    /// (a lost lease, then its log's refusal), except that a mirror's
    /// standing refusal gives way to the stop that ends it. The one place
    /// a session's failure is kept.
    failed: Option<(Stopped, Instant)>,
}

impl Pipe {
    fn lock(&self) -> MutexGuard<'_, PipeState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `op` for the writer; never waits. Refused (dropped, or replied
    /// to with the reason) once the session's storage has failed.
    pub(crate) fn push(&self, op: Op) {
        let mut st = self.lock();
        if let Some((reason, _)) = st.failed.clone() {
            drop(st);
            op.refuse(&reason);
            return;
        }
        // Only the push into an empty queue wakes the writer: later ones
        // find it already woken and not yet taking (one atomic per event saved).
        let wake = st.ops.is_empty();
        st.ops.push(op);
        drop(st);
        if wake {
            self.wake.notify_one();
        }
    }

    /// Waits while the writer is `PIPE_ROOM` operations behind: the
    /// backpressure a fast producer feels, never a subscriber.
    pub(crate) async fn pace(&self) {
        loop {
            let room = self.room.notified();
            tokio::pin!(room);
            room.as_mut().enable();
            {
                let st = self.lock();
                if st.ops.len() < PIPE_ROOM || st.failed.is_some() || st.closed {
                    return;
                }
            }
            room.await;
        }
    }

    /// Resolves once everything pushed before it is durable and visible.
    pub(crate) async fn barrier(&self) -> Result<(), Stopped> {
        let (tx, rx) = oneshot::channel();
        self.push(Op::Barrier(tx));
        rx.await.unwrap_or(Err(Stopped::WriterGone))
    }

    /// Records an admitted request id durably.
    pub(crate) async fn admitted(&self, request_id: String) -> Result<(), Stopped> {
        let (done, rx) = oneshot::channel();
        self.push(Op::Admitted { request_id, done });
        rx.await.unwrap_or(Err(Stopped::WriterGone))
    }

    /// What stopped this session's writes, and when, if anything did (a
    /// mirror's standing refusal is no stop).
    pub(crate) fn failure(&self) -> Option<(Stopped, Instant)> {
        self.lock()
            .failed
            .clone()
            .filter(|(s, _)| !matches!(s, Stopped::ReadOnly { .. }))
    }

    /// How many operations wait for the writer.
    pub(crate) fn backlog(&self) -> usize {
        self.lock().ops.len()
    }

    /// No more pushes will come: the writer finishes what is queued and stops.
    pub(crate) fn close(&self) {
        self.lock().closed = true;
        self.wake.notify_one();
    }

    /// Stops the session's writes: what is queued and every later push is
    /// refused with the first such reason (a failed append, or a lease
    /// lost to another replica).
    pub(crate) fn fail(&self, reason: &Stopped) {
        let (first, ops) = {
            let mut st = self.lock();
            if matches!(st.failed, Some((Stopped::ReadOnly { .. }, _))) {
                st.failed = None;
            }
            let first = st
                .failed
                .get_or_insert_with(|| (reason.clone(), Instant::now()))
                .0
                .clone();
            (first, std::mem::take(&mut st.ops))
        };
        for op in ops {
            op.refuse(&first);
        }
        self.room.notify_waiters();
    }

    /// Takes back a batch's emptied buffer for the next batch while the
    /// writer is busy, unless it grew past what a paced producer fills.
    fn recycle(&self, ops: Vec<Op>) {
        debug_assert!(ops.is_empty());
        if ops.capacity() <= 2 * PIPE_ROOM {
            self.lock().spare = ops;
        }
    }

    /// Whatever is queued now (maybe nothing), without waiting.
    fn take_now(&self) -> Vec<Op> {
        let ops = {
            let mut st = self.lock();
            let spare = std::mem::take(&mut st.spare);
            std::mem::replace(&mut st.ops, spare)
        };
        if !ops.is_empty() {
            self.room.notify_waiters();
        }
        ops
    }

    async fn take(&self) -> Option<Vec<Op>> {
        loop {
            {
                let mut st = self.lock();
                if !st.ops.is_empty() {
                    let spare = std::mem::take(&mut st.spare);
                    let ops = std::mem::replace(&mut st.ops, spare);
                    drop(st);
                    self.room.notify_waiters();
                    return Some(ops);
                }
                if st.closed {
                    return None;
                }
                // Caught up: an idle session keeps no batch buffer.
                st.spare = Vec::new();
            }
            self.wake.notified().await;
        }
    }
}

/// One entry of a batch, in push order.
enum Item {
    Frame(Arc<Frame>),
    Record(Record),
}

/// Encodes and appends `items` on another thread; the bytes written.
async fn append(log: &Arc<dyn Log>, session: &str, items: Vec<Item>) -> std::io::Result<u64> {
    spawn_append(log, session, items).finish().await
}

/// The largest batch buffer a blocking thread keeps between appends.
const KEEP_BATCH: usize = 4 << 20;

thread_local! {
    /// The appending thread's batch buffer, reused by its next append: a
    /// fresh one grew by `realloc` through every size of a large batch and
    /// was mapped, faulted in and unmapped again each time (`realloc`, page
    /// faults and `free` were near the top of `perf` following a burst).
    static BATCH: std::cell::RefCell<Batch> = std::cell::RefCell::new(Batch::default());
}

/// An append under way: on an appender thread, or on a blocking-pool thread
/// of its own when the log's appends wait on more than a `write`.
enum InFlight {
    Pool(tokio::task::JoinHandle<std::io::Result<u64>>),
    Appender(tokio::sync::oneshot::Receiver<Result<std::io::Result<u64>, super::appender::Panicked>>),
}

impl InFlight {
    async fn finish(self) -> std::io::Result<u64> {
        let panicked = |what: String| {
            Err(std::io::Error::other(format!(
                "the ledger writer panicked: {what}"
            )))
        };
        match self {
            InFlight::Pool(h) => h.await.unwrap_or_else(|e| panicked(e.to_string())),
            InFlight::Appender(rx) => match rx.await {
                Ok(Ok(r)) => r,
                _ => panicked("an appender job".into()),
            },
        }
    }
}

/// Starts encoding and appending `items` (on another thread: see `InFlight`).
/// `session` names the ledger in its `ledger_commit` span.
fn spawn_append(log: &Arc<dyn Log>, session: &str, items: Vec<Item>) -> InFlight {
    let waits = log.append_waits();
    let log = log.clone();
    // A root of its own: one batch holds the events of every run the session has live.
    let span = tracing::info_span!(
        target: crate::trace::TARGET,
        parent: None,
        "ledger_commit",
        session,
        batch_size = crate::trace::int(items.len() as u64),
        bytes = tracing::field::Empty,
    );
    let job = move || {
        let started = Instant::now();
        let mut batch = BATCH.with(|b| std::mem::take(&mut *b.borrow_mut()));
        for item in &items {
            match item {
                Item::Frame(frame) => batch.push_frame(frame),
                Item::Record(record) => batch.push(record),
            }
        }
        let r = log.append(&batch).map(|()| batch.len() as u64);
        // Once per batch: its duration, size and records.
        if let Ok(bytes) = &r {
            span.record("bytes", crate::trace::int(*bytes));
            let hot = crate::metrics_names::hot();
            hot.ledger_seconds.record(started.elapsed().as_secs_f64());
            hot.batch_records.record(items.len() as f64);
            hot.ledger_bytes.increment(*bytes);
        }
        batch.clear_keeping(KEEP_BATCH);
        BATCH.with(|b| *b.borrow_mut() = batch);
        r
    };
    if waits {
        InFlight::Pool(tokio::task::spawn_blocking(job))
    } else {
        InFlight::Appender(super::appender::submit(job))
    }
}

/// When the writer appends a snapshot: after at least `min` bytes, and at
/// least four times the last snapshot's size, so snapshots never cost more
/// than a quarter of the ledger however large a session's state grows.
pub(crate) struct SnapshotPolicy {
    pub min: u64,
    since: u64,
    last: u64,
}

impl SnapshotPolicy {
    pub(crate) fn new(min: u64) -> Self {
        SnapshotPolicy {
            min,
            since: 0,
            last: 0,
        }
    }

    fn due(&mut self, appended: u64) -> bool {
        self.since += appended;
        self.since >= self.min.max(self.last.saturating_mul(4))
    }

    fn taken(&mut self, size: u64) {
        self.since = 0;
        self.last = size;
    }
}

/// What a batch makes visible once it is on disk, and whom it answers then.
#[derive(Default)]
struct Pending {
    frames: Vec<Arc<Frame>>,
    notes: Vec<(u64, Note)>,
    admitted: Vec<String>,
    replies: Vec<Done>,
}

impl Pending {
    fn is_empty(&self) -> bool {
        self.frames.is_empty() && self.notes.is_empty() && self.admitted.is_empty() && self.replies.is_empty()
    }
}

/// Numbers the events of `ops` after `latest`: the items to append and what
/// they make visible.
fn prepare(ops: &mut Vec<Op>, latest: &mut u64) -> (Vec<Item>, Pending) {
    let mut p = Pending::default();
    let mut items = Vec::with_capacity(ops.len());
    for op in ops.drain(..) {
        match op {
            Op::Event(mut frame) => {
                *latest += 1;
                match Arc::get_mut(&mut frame) {
                    Some(f) => f.seq = *latest,
                    // Only the pipe held it so far; a shared one is copied.
                    None => {
                        frame = Arc::new(Frame::new(*latest, frame.session_id.clone(), frame.event.clone()))
                    }
                }
                items.push(Item::Frame(frame.clone()));
                p.frames.push(frame);
            }
            Op::Note(note) => {
                items.push(Item::Record(match &note {
                    Note::Usage(u) => Record::Usage(*u),
                    Note::Signature(s) => Record::Signature { signature: s.clone() },
                    Note::Compaction(c) => Record::Compaction(c.clone()),
                    Note::Undo(u) => Record::Undo(*u),
                    Note::Background(p) => Record::Background(p.clone()),
                    Note::Receipt(r) => Record::Receipt(r.clone()),
                }));
                p.notes.push((*latest, note));
            }
            Op::Admitted { request_id, done } => {
                items.push(Item::Record(Record::Admitted {
                    request_id: request_id.clone(),
                }));
                p.admitted.push(request_id);
                p.replies.push(done);
            }
            Op::Barrier(done) => p.replies.push(done),
        }
    }
    (items, p)
}

/// Stops the session at a failed append: nothing of `lost` becomes visible.
fn fail(
    session_id: &str,
    pipe: &Pipe,
    log: &Arc<dyn Log>,
    visible: &Weak<dyn Visible>,
    lost: Pending,
    e: std::io::Error,
) {
    let reason = Stopped::from_append(e);
    tracing::error!(session = %session_id, "{}: nothing after seq {} is kept; the session stops until it is reloaded", reason.reason(), log.durable_seq());
    pipe.fail(&reason);
    for done in lost.replies {
        let _ = done.send(Err(reason.clone()));
    }
    if let Some(v) = visible.upgrade() {
        v.failed(&reason);
    }
}

/// The writer task of one session whose latest durable seq is `latest`.
/// It ends when the pipe is closed and drained, or at the first failed append.
///
/// Two stages overlap: while batch k+1 is appended on a blocking thread,
/// batch k (already on disk) is made visible here, so the disk and the
/// folds and fan-out work at the same time. The order of both is kept: one
/// append at a time, and k is visible before k+1 is. A snapshot is the
/// exception: it must follow its batch directly in the log (it is exact as
/// of that batch's last seq), so the batch after it waits.
pub(crate) async fn run(
    session_id: Arc<str>,
    pipe: Arc<Pipe>,
    log: Arc<dyn Log>,
    visible: Weak<dyn Visible>,
    mut latest: u64,
    mut snapshots: SnapshotPolicy,
) {
    // The batch on disk and not yet visible, and whether a snapshot is due after it.
    let mut written: Option<(Pending, bool)> = None;
    loop {
        let mut ops = match &written {
            // Nothing to make visible: wait for work.
            None => match pipe.take().await {
                Some(ops) => ops,
                None => return,
            },
            // Take what is there without waiting: `written` must not wait for it.
            Some(_) => pipe.take_now(),
        };
        let (items, next) = prepare(&mut ops, &mut latest);
        pipe.recycle(ops);
        let snapshot_due = written.as_ref().is_some_and(|(_, due)| *due);
        let mut items = (!items.is_empty()).then_some(items);
        let in_flight = match items.take() {
            Some(batch) if !snapshot_due => Some(spawn_append(&log, &session_id, batch)),
            batch => {
                items = batch;
                None
            }
        };
        if let Some((k, due)) = written.take() {
            let v = visible.upgrade();
            if let Some(v) = &v {
                v.commit(k.frames, k.notes, k.admitted);
            }
            if let Some(v) = v.filter(|_| due) {
                // Taken right after the commit: exact as of its last seq.
                match append(&log, &session_id, vec![Item::Record(v.snapshot())]).await {
                    Ok(size) => snapshots.taken(size),
                    Err(e) => {
                        let mut lost = next;
                        lost.replies.extend(k.replies);
                        return fail(&session_id, &pipe, &log, &visible, lost, e);
                    }
                }
            }
            for done in k.replies {
                let _ = done.send(Ok(()));
            }
        }
        let appended = match (in_flight, items) {
            (Some(h), _) => h.finish().await,
            (None, Some(batch)) => append(&log, &session_id, batch).await,
            (None, None) => Ok(0),
        };
        match appended {
            Ok(bytes) if !next.is_empty() => written = Some((next, bytes > 0 && snapshots.due(bytes))),
            Ok(_) => {}
            Err(e) => return fail(&session_id, &pipe, &log, &visible, next, e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::ClientEvent;
    use crate::log::memory::MemLog;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// Checks at every commit that what becomes visible is on disk and
    /// follows what was visible before; its snapshot names the last seq.
    struct Seen {
        log: Arc<MemLog>,
        last: AtomicU64,
        early: Mutex<Vec<u64>>,
    }

    impl Visible for Seen {
        fn commit(&self, frames: Vec<Arc<Frame>>, _: Vec<(u64, Note)>, _: Vec<String>) {
            for f in frames {
                if f.seq > self.log.durable_seq() {
                    self.early.lock().unwrap().push(f.seq);
                }
                let before = self.last.swap(f.seq, Ordering::SeqCst);
                assert_eq!(f.seq, before + 1, "visible in seq order, no gap");
            }
        }
        fn snapshot(&self) -> Record {
            Record::Admitted {
                request_id: format!("snapshot {}", self.last.load(Ordering::SeqCst)),
            }
        }
        fn failed(&self, reason: &Stopped) {
            panic!("no failure expected: {reason}");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn batches_become_visible_in_order_after_their_append_and_a_snapshot_directly_follows_its_batch() {
        let log = Arc::new(MemLog::default());
        let seen = Arc::new(Seen {
            log: log.clone(),
            last: AtomicU64::new(0),
            early: Mutex::new(Vec::new()),
        });
        let pipe = Arc::new(Pipe::default());
        let visible: Arc<dyn Visible> = seen.clone();
        let sid: Arc<str> = "s".into();
        let writer = tokio::spawn(run(
            sid.clone(),
            pipe.clone(),
            log.clone() as Arc<dyn Log>,
            Arc::downgrade(&visible),
            0,
            // Small, so snapshots fall between many batches.
            SnapshotPolicy::new(2048),
        ));
        const N: u64 = 20_000;
        for i in 0..N {
            pipe.push(Op::event(
                &sid,
                ClientEvent::TextDelta {
                    text: format!("t{i} "),
                },
            ));
            if i % 500 == 0 {
                // A barrier answers only once everything before it is visible.
                pipe.barrier().await.unwrap();
                assert_eq!(seen.last.load(Ordering::SeqCst), i + 1);
            }
            pipe.pace().await;
        }
        pipe.barrier().await.unwrap();
        pipe.close();
        writer.await.unwrap();

        assert_eq!(seen.last.load(Ordering::SeqCst), N);
        assert!(
            seen.early.lock().unwrap().is_empty(),
            "visible before on disk: {:?}",
            seen.early.lock().unwrap()
        );
        let lines = log.lines();
        let mut snapshots = 0;
        let mut expect = 1;
        for (i, line) in lines.iter().enumerate() {
            if let Some(seq) = line.strip_prefix("event ") {
                assert_eq!(seq.parse::<u64>().unwrap(), expect, "events in seq order");
                expect += 1;
            } else if let Some(at) = line.split("snapshot ").nth(1) {
                let at: u64 = at.trim_end_matches("\"}}").parse().unwrap();
                assert!(i > 0, "a snapshot follows a batch");
                assert_eq!(
                    lines[i - 1],
                    format!("event {at}"),
                    "the snapshot of seq {at} directly follows it"
                );
                snapshots += 1;
            }
        }
        assert!(snapshots > 1, "snapshots were taken: {snapshots}");
    }
}
