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

use super::event::{ClientEvent, Frame, Note};
use super::ledger::{Batch, Log, Record};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use tokio::sync::{oneshot, Notify};

/// Operations waiting for the writer beyond which publishers that pace
/// themselves (the agent loop) wait for room.
pub const PIPE_ROOM: usize = 4096;

/// A reply to an operation that must be durable before its caller goes on.
pub type Done = oneshot::Sender<Result<(), String>>;

pub enum Op {
    Event(ClientEvent),
    /// An internal fact, kept in order with the events around it.
    Note(Note),
    /// A request id admitted; replied to once it is durable.
    Admitted {
        request_id: String,
        done: Done,
    },
    /// Replied to once everything pushed before it is durable and visible.
    Barrier(Done),
}

impl Op {
    fn refuse(self, reason: &str) {
        match self {
            Op::Admitted { done, .. } | Op::Barrier(done) => {
                let _ = done.send(Err(reason.to_string()));
            }
            Op::Event(_) | Op::Note(_) => {}
        }
    }
}

/// What the writer hands back to the session once a batch is durable.
pub trait Visible: Send + Sync + 'static {
    /// `notes` each carry the seq of the last event published before them.
    fn commit(&self, frames: Vec<Arc<Frame>>, notes: Vec<(u64, Note)>, admitted: Vec<String>);
    /// The session's state as of the last commit, as a ledger record.
    fn snapshot(&self) -> Record;
    fn failed(&self, reason: &str);
}

#[derive(Default)]
pub struct Pipe {
    state: Mutex<PipeState>,
    /// The writer waits here for work (one consumer: a stored permit is never lost).
    wake: Notify,
    /// Pacing publishers wait here for room.
    room: Notify,
}

#[derive(Default)]
struct PipeState {
    ops: Vec<Op>,
    closed: bool,
    failed: Option<String>,
}

impl Pipe {
    fn lock(&self) -> MutexGuard<'_, PipeState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `op` for the writer; never waits. Refused (dropped, or replied
    /// to with the reason) once the session's storage has failed.
    pub fn push(&self, op: Op) {
        let mut st = self.lock();
        if let Some(reason) = st.failed.clone() {
            drop(st);
            op.refuse(&reason);
            return;
        }
        st.ops.push(op);
        drop(st);
        self.wake.notify_one();
    }

    /// Waits while the writer is `PIPE_ROOM` operations behind: the
    /// backpressure a fast producer feels, never a subscriber.
    pub async fn pace(&self) {
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
    pub async fn barrier(&self) -> Result<(), String> {
        let (tx, rx) = oneshot::channel();
        self.push(Op::Barrier(tx));
        rx.await
            .unwrap_or_else(|_| Err("the session's writer stopped".into()))
    }

    /// Records an admitted request id durably.
    pub async fn admitted(&self, request_id: String) -> Result<(), String> {
        let (done, rx) = oneshot::channel();
        self.push(Op::Admitted { request_id, done });
        rx.await
            .unwrap_or_else(|_| Err("the session's writer stopped".into()))
    }

    /// The storage failure that stopped this session, if any.
    pub fn failure(&self) -> Option<String> {
        self.lock().failed.clone()
    }

    /// How many operations wait for the writer.
    pub fn backlog(&self) -> usize {
        self.lock().ops.len()
    }

    /// No more pushes will come: the writer finishes what is queued and stops.
    pub fn close(&self) {
        self.lock().closed = true;
        self.wake.notify_one();
    }

    /// Stops the session's writes: what is queued and every later push is
    /// refused with `reason` (a failed append, or a lease lost to another replica).
    pub fn fail(&self, reason: &str) {
        let ops = {
            let mut st = self.lock();
            st.failed = Some(reason.to_string());
            std::mem::take(&mut st.ops)
        };
        for op in ops {
            op.refuse(reason);
        }
        self.room.notify_waiters();
    }

    async fn take(&self) -> Option<Vec<Op>> {
        loop {
            {
                let mut st = self.lock();
                if !st.ops.is_empty() {
                    let ops = std::mem::take(&mut st.ops);
                    drop(st);
                    self.room.notify_waiters();
                    return Some(ops);
                }
                if st.closed {
                    return None;
                }
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

/// Encodes and appends `items` on a blocking thread; the bytes written.
async fn append(log: &Arc<dyn Log>, items: Vec<Item>) -> std::io::Result<u64> {
    let log = log.clone();
    tokio::task::spawn_blocking(move || {
        let mut batch = Batch::default();
        for item in &items {
            match item {
                Item::Frame(frame) => batch.push_frame(frame),
                Item::Record(record) => batch.push(record),
            }
        }
        log.append(&batch).map(|()| batch.len() as u64)
    })
    .await
    .unwrap_or_else(|e| Err(std::io::Error::other(format!("the ledger writer panicked: {e}"))))
}

/// When the writer appends a snapshot: after at least `min` bytes, and at
/// least four times the last snapshot's size, so snapshots never cost more
/// than a quarter of the ledger however large a session's state grows.
pub struct SnapshotPolicy {
    pub min: u64,
    since: u64,
    last: u64,
}

impl SnapshotPolicy {
    pub fn new(min: u64) -> Self {
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

/// The writer task of one session whose latest durable seq is `latest`.
/// It ends when the pipe is closed and drained, or at the first failed append.
pub async fn run(
    session_id: Arc<str>,
    pipe: Arc<Pipe>,
    log: Arc<dyn Log>,
    visible: Weak<dyn Visible>,
    mut latest: u64,
    mut snapshots: SnapshotPolicy,
) {
    while let Some(ops) = pipe.take().await {
        let mut frames = Vec::new();
        let mut notes = Vec::new();
        let mut admitted = Vec::new();
        let mut replies = Vec::new();
        let mut items = Vec::with_capacity(ops.len());
        for op in ops {
            match op {
                Op::Event(event) => {
                    latest += 1;
                    let frame = Arc::new(Frame::new(latest, session_id.clone(), event));
                    items.push(Item::Frame(frame.clone()));
                    frames.push(frame);
                }
                Op::Note(note) => {
                    items.push(Item::Record(match &note {
                        Note::Usage(u) => Record::Usage(*u),
                        Note::Signature(s) => Record::Signature { signature: s.clone() },
                        Note::Compaction(c) => Record::Compaction(c.clone()),
                        Note::Undo(u) => Record::Undo(*u),
                    }));
                    notes.push((latest, note));
                }
                Op::Admitted { request_id, done } => {
                    items.push(Item::Record(Record::Admitted {
                        request_id: request_id.clone(),
                    }));
                    admitted.push(request_id);
                    replies.push(done);
                }
                Op::Barrier(done) => replies.push(done),
            }
        }
        let mut appended = if items.is_empty() {
            Ok(0)
        } else {
            append(&log, items).await
        };
        if let Ok(bytes) = appended {
            let v = visible.upgrade();
            if let Some(v) = &v {
                v.commit(frames, notes, admitted);
            }
            if let Some(v) = v.filter(|_| snapshots.due(bytes)) {
                // Taken right after the commit: exact as of its last seq.
                appended = append(&log, vec![Item::Record(v.snapshot())]).await;
                if let Ok(size) = appended {
                    snapshots.taken(size);
                }
            }
        }
        match appended {
            Ok(_) => {
                for done in replies {
                    let _ = done.send(Ok(()));
                }
            }
            Err(e) => {
                let reason = format!("storage_failed: {e}");
                tracing::error!(session = %session_id, "{reason}: nothing after seq {} is kept; the session stops until it is reloaded", log.durable_seq());
                pipe.fail(&reason);
                for done in replies {
                    let _ = done.send(Err(reason.clone()));
                }
                if let Some(v) = visible.upgrade() {
                    v.failed(&reason);
                }
                return;
            }
        }
    }
}
