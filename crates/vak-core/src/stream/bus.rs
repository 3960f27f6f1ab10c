//! The per-session event bus: the visible seq, a replay ring, and one bounded, lossless queue per subscriber.
//!
//! Frames reach the bus already numbered and durable (`commit`, called by
//! the session's writer). `commit` never blocks on a subscriber. Each
//! subscriber owns a queue of at most `queue` frames and `max_queued_bytes`
//! of payload, and all queues together at most `max_total_queued_bytes`.
//! Once the frame count is reached, consecutive deltas of one kind merge (the
//! merged frame carries the last seq it covers): new ones into the tail, and
//! those the reader then takes together; if that still frees no room, or a
//! byte budget is spent, the queue is dropped. Its `Subscription`
//! does not end: it resumes from its own cursor (the ring, else the log on
//! disk) inside the same stream, so a slow reader sees neither a gap nor a
//! resync, and a stalled one costs no more than its budget.
//!
//! Each commit wakes every subscriber once. With a `flush_window` set (off
//! by default: measured, it saved nothing), a session with at least
//! `flush_from` subscribers wakes them at most once per window instead (the
//! first commit after a quiet window at once, later ones at the window's
//! end, all together).

use crate::event::Frame;
use crate::log::ledger::Log;
use crate::log::replay::{ReplayCache, CHUNK};
use crate::reasons::{CloseReason, ResyncReason};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::Notify;

/// The most payload one merged delta frame carries: a client's message
/// limit (gRPC's default is 4 MiB) must never be what ends its stream. Past
/// it the queue fills, is dropped, and its reader resumes from its cursor.
const MAX_MERGED: usize = 1 << 20;

/// See `BusConfig::flush_window`. Off: at 1 000 events/s to 1000 readers a
/// 2 or 5 ms window left the server's CPU where it was (readers that fall
/// behind already take many frames per wake-up) and p99 within run-to-run
/// noise (BENCHMARKS.md); it stays a measured, explicit choice.
pub const DEFAULT_FLUSH_WINDOW: Duration = Duration::ZERO;
/// See `BusConfig::flush_from`.
pub const DEFAULT_FLUSH_FROM: usize = 32;

/// Deliveries `Subscription::recv` takes at once: few, since a reader of
/// single deliveries holds them (counted in its budget) until it asks again.
const RECV_AHEAD: usize = 16;

/// The most bytes one take from the queue hands over (at least one frame):
/// what a reader then holds encoded, until written, comes in bounded steps.
const TAKE_BYTES: usize = 1 << 20;

/// A queue whose frames were all taken keeps its allocation only up to this
/// many slots: one that grew for a burst gives it back once drained.
const KEEP_SLOTS: usize = 64;

/// Queued payload bytes across every subscriber of the process.
#[derive(Clone, Debug, Default)]
pub struct QueuedTotal(Arc<AtomicUsize>);

impl QueuedTotal {
    pub fn get(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }

    /// Moves the total from `then` to `now` (one queue's bytes before and after).
    fn shift(&self, then: usize, now: usize) {
        if now >= then {
            self.0.fetch_add(now - then, Ordering::Relaxed);
        } else {
            self.0.fetch_sub(then - now, Ordering::Relaxed);
        }
    }
}

/// Bytes a reader holds outside its queue (frames taken ahead of its caller,
/// or encoded and not yet written by the edge), counted in its byte budget
/// and the total until dropped: what `--max-queued-mib` bounds is what
/// stalled readers really pin, not only what is queued.
pub struct Charge {
    held: Arc<AtomicUsize>,
    total: QueuedTotal,
    bytes: usize,
}

impl Charge {
    /// Gives back `n` of the charged bytes (no more than are charged).
    pub fn release(&mut self, n: usize) {
        let n = n.min(self.bytes);
        self.bytes -= n;
        self.held.fetch_sub(n, Ordering::Relaxed);
        self.total.0.fetch_sub(n, Ordering::Relaxed);
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        let n = self.bytes;
        self.release(n);
    }
}

impl std::fmt::Debug for Charge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Charge({} bytes)", self.bytes)
    }
}

/// Sizes that bound the memory one session and one subscriber can hold.
#[derive(Clone, Debug)]
pub struct BusConfig {
    /// Frames retained for replay.
    pub ring: usize,
    /// Frames a subscriber may have queued before merging or lag kicks in.
    pub queue: usize,
    /// The most bytes a subscriber may hold: its queued frames (merged
    /// deltas at their text's capacity) and what its edge holds encoded
    /// and unwritten (`Charge`): the memory bound of a stalled client.
    pub max_queued_bytes: usize,
    /// The most bytes all subscribers together may hold (as above).
    pub max_total_queued_bytes: usize,
    /// The running total behind `max_total_queued_bytes`, shared by every bus.
    pub total: QueuedTotal,
    /// The shortest time between two wake-ups of a session's subscribers
    /// once it has `flush_from` of them (zero: every commit wakes them).
    pub flush_window: Duration,
    /// Subscribers from which commits inside one `flush_window` share a wake-up.
    pub flush_from: usize,
}

impl Default for BusConfig {
    fn default() -> Self {
        BusConfig {
            ring: 1024,
            queue: 1024,
            max_queued_bytes: 16 << 20,
            max_total_queued_bytes: 512 << 20,
            total: QueuedTotal::default(),
            flush_window: DEFAULT_FLUSH_WINDOW,
            flush_from: DEFAULT_FLUSH_FROM,
        }
    }
}

/// Why a subscription ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum End {
    /// The session was closed (server shutdown, storage failure); the reason says why.
    Closed(CloseReason),
}

/// One item a subscription yields, in order: replayed frames, live frames,
/// and finally at most one end. A resync comes first when the cursor is
/// ahead of the session, or wherever history the cursor needs is missing.
#[derive(Clone, Debug)]
pub enum Delivery {
    /// `lost`: the range of seqs the ledger lost (`Record::Lost`) that the
    /// cursor falls in, with reason `history_lost`.
    Resync {
        reason: ResyncReason,
        latest_seq: u64,
        lost: Option<(u64, u64)>,
    },
    Frame(Arc<Frame>),
    End(End),
}

pub struct Bus {
    shared: Arc<Shared>,
}

struct Shared {
    session_id: Arc<str>,
    cfg: BusConfig,
    log: Option<Arc<dyn Log>>,
    inner: Mutex<Inner>,
    subscribed: Notify,
    /// What replays from disk have read lately, shared by every subscription.
    replay: ReplayCache,
    /// Subscriptions replaying from disk now: once none is, the replay cache
    /// is emptied (a burst of replays does not stay in memory).
    on_disk: AtomicUsize,
}

struct Inner {
    latest: u64,
    ring: VecDeque<Arc<Frame>>,
    subs: Vec<Arc<SubQueue>>,
    closed: Option<CloseReason>,
    /// When the subscribers were last woken together (see `flush_window`).
    last_wake: Option<tokio::time::Instant>,
    /// A wake-up at the end of the current window is scheduled.
    wake_due: bool,
    /// Ranges of seqs the ledger lost, oldest first (bounded by `repair`).
    lost: Vec<(u64, u64)>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Bus {
    /// A bus whose latest seq is `latest`, with `retained` (oldest first)
    /// already in the ring, replaying older cursors from `log`.
    pub fn new(
        session_id: Arc<str>,
        cfg: BusConfig,
        log: Option<Arc<dyn Log>>,
        latest: u64,
        retained: Vec<Arc<Frame>>,
    ) -> Self {
        let cfg = BusConfig {
            ring: cfg.ring.max(1),
            queue: cfg.queue.max(2),
            max_queued_bytes: cfg.max_queued_bytes.max(1),
            ..cfg
        };
        let skip = retained.len().saturating_sub(cfg.ring);
        Bus {
            shared: Arc::new(Shared {
                session_id,
                log,
                inner: Mutex::new(Inner {
                    latest,
                    ring: retained.into_iter().skip(skip).collect(),
                    subs: Vec::new(),
                    closed: None,
                    last_wake: None,
                    wake_due: false,
                    lost: Vec::new(),
                }),
                cfg,
                subscribed: Notify::new(),
                replay: ReplayCache::default(),
                on_disk: AtomicUsize::new(0),
            }),
        }
    }

    pub fn session_id(&self) -> &Arc<str> {
        &self.shared.session_id
    }

    /// The highest seq visible so far (0: none).
    pub fn latest_seq(&self) -> u64 {
        self.shared.lock().latest
    }

    /// Makes durable frames visible: retained for replay and handed to every
    /// subscriber. Frames come numbered, in order, each one after the last.
    pub fn commit(&self, frames: Vec<Arc<Frame>>) {
        if frames.is_empty() {
            return;
        }
        let mut inner = self.shared.lock();
        let ring = self.shared.cfg.ring;
        for frame in &frames {
            inner.latest = frame.seq;
            if inner.ring.len() == ring {
                inner.ring.pop_front();
            }
            inner.ring.push_back(frame.clone());
        }
        let wake = self.wake_now(&mut inner);
        inner.subs.retain(|q| q.offer(&frames, wake));
    }

    /// Whether this commit wakes the subscribers now; if not, a wake-up at
    /// the end of the window is (or already was) scheduled.
    fn wake_now(&self, inner: &mut Inner) -> bool {
        let cfg = &self.shared.cfg;
        if cfg.flush_window.is_zero() || inner.subs.len() < cfg.flush_from {
            return true;
        }
        let now = tokio::time::Instant::now();
        let due = match inner.last_wake {
            Some(last) if now < last + cfg.flush_window => last + cfg.flush_window,
            _ => {
                inner.last_wake = Some(now);
                return true;
            }
        };
        if inner.wake_due {
            return false;
        }
        // Outside a runtime (never in the server) nobody could wake them later.
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            inner.last_wake = Some(now);
            return true;
        };
        inner.wake_due = true;
        let shared = Arc::downgrade(&self.shared);
        rt.spawn(async move {
            tokio::time::sleep_until(due).await;
            if let Some(shared) = shared.upgrade() {
                let mut inner = shared.lock();
                inner.wake_due = false;
                inner.last_wake = Some(tokio::time::Instant::now());
                for q in &inner.subs {
                    q.wake_if_pending();
                }
            }
        });
        false
    }

    /// Subscribes: `after` None means live frames only; Some(n) replays
    /// every frame with seq > n first (from the ring, or from the log when
    /// n is older than the ring), or a resync plus the ring when n is ahead
    /// of the session or the history it needs is gone.
    pub fn subscribe(&self, after: Option<u64>) -> Subscription {
        subscribe(&self.shared, after)
    }

    /// How many subscriptions are attached right now.
    pub fn subscriber_count(&self) -> usize {
        let mut inner = self.shared.lock();
        inner.subs.retain(|q| q.is_attached());
        inner.subs.len()
    }

    /// Waits up to `timeout` for a first subscriber, returning at once when
    /// somebody is already watching.
    pub async fn wait_for_subscriber(&self, timeout: Duration) {
        let notified = self.shared.subscribed.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if self.subscriber_count() > 0 {
            return;
        }
        let _ = tokio::time::timeout(timeout, notified).await;
    }

    /// The ranges of seqs this session's ledger lost: a replay across one
    /// resyncs with `history_lost` and the range instead of `history_unavailable`.
    pub fn note_lost(&self, lost: Vec<(u64, u64)>) {
        self.shared.lock().lost = lost;
    }

    /// Ends every subscription with `End::Closed(reason)`; later subscribers end at once.
    pub fn close(&self, reason: CloseReason) {
        let mut inner = self.shared.lock();
        for q in inner.subs.drain(..) {
            q.end(End::Closed(reason.clone()));
        }
        inner.closed = Some(reason);
    }
}

fn subscribe(shared: &Arc<Shared>, after: Option<u64>) -> Subscription {
    subscribe_holding(shared, after, Arc::default())
}

/// `subscribe` for a reader that already holds `held` bytes outside its
/// queue (a resumed one: its edge may still hold what it was handed).
fn subscribe_holding(shared: &Arc<Shared>, after: Option<u64>, held: Arc<AtomicUsize>) -> Subscription {
    let mut inner = shared.lock();
    let latest = inner.latest;
    let first_retained = inner.ring.front().map_or(latest + 1, |f| f.seq);
    let mut sub = Subscription {
        shared: shared.clone(),
        latest_seq: latest,
        cursor: after.unwrap_or(latest),
        resync: None,
        retained_upto: latest,
        from_log: VecDeque::new(),
        queue: Arc::new(SubQueue::new(&shared.cfg, held.clone())),
        held,
        catching_up: false,
        merge_taken: true,
        done: false,
        ready: VecDeque::new(),
        ready_charge: None,
        on_disk: false,
    };
    if let Some(n) = after {
        // What is due up to `latest` is read from the ring (or, older, the
        // log) lazily as the reader asks, never copied here under the lock.
        if n > latest {
            sub.resync = Some((ResyncReason::CursorAhead, latest, None));
            sub.cursor = first_retained - 1;
        } else if n.saturating_add(1) < first_retained && shared.log.is_none() {
            sub.resync = Some((ResyncReason::CursorTooOld, latest, None));
            sub.cursor = first_retained - 1;
        }
    }
    match &inner.closed {
        Some(reason) => sub.queue.end(End::Closed(reason.clone())),
        None => inner.subs.push(sub.queue.clone()),
    }
    drop(inner);
    shared.subscribed.notify_waiters();
    sub
}

/// A subscriber's bounded queue, shared by the bus (producer) and one `Subscription` (consumer).
struct SubQueue {
    state: Mutex<QueueState>,
    notify: Notify,
    cap: usize,
    budget: usize,
    total_budget: usize,
    total: QueuedTotal,
    /// What this queue's reader holds outside it (`Charge`), shared with
    /// the queues it resumes into.
    held: Arc<AtomicUsize>,
}

struct QueueState {
    frames: VecDeque<Arc<Frame>>,
    /// The summed `Frame::queued_cost` of `frames`, exactly (counted into `total` too).
    bytes: usize,
    end: Option<End>,
    /// The bus dropped this queue for lag: its reader resumes from its cursor.
    lagged: bool,
    detached: bool,
}

impl SubQueue {
    fn new(cfg: &BusConfig, held: Arc<AtomicUsize>) -> Self {
        SubQueue {
            state: Mutex::new(QueueState {
                frames: VecDeque::new(),
                bytes: 0,
                end: None,
                lagged: false,
                detached: false,
            }),
            notify: Notify::new(),
            cap: cfg.queue,
            budget: cfg.max_queued_bytes,
            total_budget: cfg.max_total_queued_bytes,
            total: cfg.total.clone(),
            held,
        }
    }

    fn lock(&self) -> MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sets the queue's byte count, keeping the process-wide total in step.
    fn set_bytes(&self, st: &mut QueueState, bytes: usize) {
        self.total.shift(st.bytes, bytes);
        st.bytes = bytes;
    }

    /// Empties the queue and returns its bytes to the total.
    fn clear(&self, st: &mut QueueState) {
        st.frames = VecDeque::new();
        self.set_bytes(st, 0);
    }

    fn is_attached(&self) -> bool {
        let st = self.lock();
        !st.detached && !st.lagged && st.end.is_none()
    }

    /// Queues `frames`, waking the reader if `wake` (otherwise the bus wakes
    /// it at the end of its flush window); false means this queue is gone and
    /// the bus drops it.
    fn offer(&self, frames: &[Arc<Frame>], wake: bool) -> bool {
        let mut guard = self.lock();
        let st = &mut *guard;
        if st.detached || st.lagged || st.end.is_some() {
            return false;
        }
        // The shared total is read once and moved once per commit, not per
        // frame: every subscriber's reader and the committer touch it.
        let (total_then, bytes_then) = (self.total.get(), st.bytes);
        let mut placed = true;
        for frame in frames {
            let total = (total_then + st.bytes).saturating_sub(bytes_then);
            if !self.place(st, frame, total) {
                // Everything queued stays deliverable; past it the reader
                // resumes from its cursor, so nothing is lost by dropping here.
                st.lagged = true;
                placed = false;
                break;
            }
        }
        self.total.shift(bytes_then, st.bytes);
        if !placed {
            drop(guard);
            self.notify.notify_one();
            return false;
        }
        drop(guard);
        if wake {
            self.notify.notify_one();
        }
        true
    }

    /// Queues one frame, merging it into the tail when the queue is full;
    /// false when it does not fit. `total` is every queue's bytes together
    /// as of now; the caller moves the shared total by what was placed.
    /// What a frame costs is what it adds to the memory the queue holds:
    /// its size, or what the merged tail's text grows by.
    fn place(&self, st: &mut QueueState, frame: &Arc<Frame>, total: usize) -> bool {
        // What this queue may still add: its budget less what it and its
        // reader hold, within what the total budget has left.
        let held = self.held.load(Ordering::Relaxed);
        let room = self
            .budget
            .saturating_sub(st.bytes + held)
            .min(self.total_budget.saturating_sub(total));
        if st.frames.len() < self.cap {
            return self.push(st, frame, room);
        }
        if self.merge_tail(st, frame, room) {
            return true;
        }
        // Merge every run of deltas in the queue (which only ever lowers
        // its bytes), then try once more.
        let before = st.bytes;
        compact(st);
        let room = room + (before - st.bytes);
        if st.frames.len() < self.cap {
            return self.push(st, frame, room);
        }
        self.merge_tail(st, frame, room)
    }

    fn push(&self, st: &mut QueueState, frame: &Arc<Frame>, room: usize) -> bool {
        let cost = frame.queued_cost();
        if cost > room {
            return false;
        }
        st.frames.push_back(frame.clone());
        st.bytes += cost;
        true
    }

    fn merge_tail(&self, st: &mut QueueState, frame: &Arc<Frame>, room: usize) -> bool {
        let Some(tail) = st.frames.back_mut() else {
            return false;
        };
        match merge_into(tail, frame, room) {
            Some(old) => {
                st.bytes = st.bytes - old + tail.queued_cost();
                true
            }
            None => false,
        }
    }

    /// Wakes the reader if frames wait for it (a reader that took them while
    /// it was awake anyway needs no wake-up).
    fn wake_if_pending(&self) {
        if !self.lock().frames.is_empty() {
            self.notify.notify_one();
        }
    }

    fn end(&self, end: End) {
        let mut st = self.lock();
        if st.end.is_none() {
            st.end = Some(end);
        }
        drop(st);
        self.notify.notify_one();
    }
}

/// Merges `frame` into `tail` when both are same-kind deltas, the merged
/// text stays within `MAX_MERGED` and the tail grows by at most `room`
/// bytes; returns the tail's `queued_cost` before (None: nothing changed). A tail
/// that is already this subscriber's own merged frame grows in place (its
/// text doubling, so the growth is known beforehand); a shared one (still
/// in the ring or other queues) is copied once, at its exact length.
fn merge_into(tail: &mut Arc<Frame>, frame: &Frame, room: usize) -> Option<usize> {
    let (a, b) = (tail.event.delta_len()?, frame.event.delta_len()?);
    if a + b > MAX_MERGED || !tail.event.merges_with(&frame.event) {
        return None;
    }
    let old = tail.queued_cost();
    if let Some(own) = Arc::get_mut(tail) {
        // Absorbing makes it a merged frame: its cost is its size.
        let new = own.size_after_absorbing(frame)?;
        if new.saturating_sub(old) > room || !own.absorb(frame) {
            return None;
        }
        return Some(old);
    }
    let copy = Frame::merged(&[&**tail, frame]);
    if copy.size.saturating_sub(old) > room {
        return None;
    }
    *tail = Arc::new(copy);
    Some(old)
}

/// Merges every run of consecutive same-kind deltas in the queue (each
/// merged frame at most `MAX_MERGED` of text, allocated at its exact
/// length) and counts its bytes again.
fn compact(st: &mut QueueState) {
    let mut out: VecDeque<Arc<Frame>> = VecDeque::with_capacity(st.frames.len());
    let mut run: Vec<Arc<Frame>> = Vec::new();
    let mut run_len = 0;
    for f in st.frames.drain(..) {
        let len = f.event.delta_len().unwrap_or(0);
        let joins = run.last().is_some_and(|l| l.event.merges_with(&f.event)) && run_len + len <= MAX_MERGED;
        if !joins {
            flush_run(&mut run, &mut out);
            run_len = 0;
        }
        run_len += len;
        run.push(f);
    }
    flush_run(&mut run, &mut out);
    st.bytes = out.iter().map(|f| f.queued_cost()).sum();
    st.frames = out;
}

fn flush_run(run: &mut Vec<Arc<Frame>>, out: &mut VecDeque<Arc<Frame>>) {
    if run.len() > 1 {
        let parts: Vec<&Frame> = run.iter().map(|f| &**f).collect();
        out.push_back(Arc::new(Frame::merged(&parts)));
        run.clear();
    } else {
        out.extend(run.drain(..));
    }
}

enum Queued {
    Out(Vec<Delivery>),
    /// The bus dropped the queue: resume from the cursor.
    Lagged,
    Empty,
}

/// A resync a subscription owes its reader: (reason, latest seq, the lost
/// range with `history_lost`).
type DueResync = (ResyncReason, u64, Option<(u64, u64)>);

/// One subscriber's view of a bus.
pub struct Subscription {
    shared: Arc<Shared>,
    latest_seq: u64,
    /// The last seq handed out: the point a resume continues after.
    cursor: u64,
    /// A resync due next.
    resync: Option<DueResync>,
    /// Frames up to this seq (the latest when the queue was attached) come
    /// from the ring or the log; later ones from the queue.
    retained_upto: u64,
    /// What the last read from the log brought that is still due: a chunk
    /// is read once per subscription, however few frames a call takes.
    from_log: VecDeque<Arc<Frame>>,
    queue: Arc<SubQueue>,
    /// What this reader holds outside its queue (`Charge`s), across resumes.
    held: Arc<AtomicUsize>,
    /// Resumed after its queue overflowed: replayed deltas merge.
    catching_up: bool,
    /// Whether deltas taken together from a full queue merge (not on `/stream`).
    merge_taken: bool,
    done: bool,
    /// Taken by `recv` ahead of its caller, in order (empty before `resume`).
    ready: VecDeque<Delivery>,
    /// `ready`'s bytes, counted in the budget until handed out.
    ready_charge: Option<Charge>,
    /// Counted in `Shared::on_disk`: replaying from the log.
    on_disk: bool,
}

/// The bytes a delivery holds.
fn delivery_size(d: &Delivery) -> usize {
    match d {
        Delivery::Frame(f) => f.size,
        _ => 0,
    }
}

impl Subscription {
    /// This subscription hands queued frames over one by one however far
    /// behind its reader is (only a full queue still merges).
    pub fn frame_by_frame(mut self) -> Self {
        self.merge_taken = false;
        self
    }

    /// Counts `bytes` this reader holds outside its queue (encoded, not yet
    /// written) in its byte budget and the total until the charge is dropped:
    /// while it holds them, its queue has that much less room.
    pub fn charge(&self, bytes: usize) -> Charge {
        self.held.fetch_add(bytes, Ordering::Relaxed);
        self.shared.cfg.total.0.fetch_add(bytes, Ordering::Relaxed);
        Charge {
            held: self.held.clone(),
            total: self.shared.cfg.total.clone(),
            bytes,
        }
    }

    /// The session's latest seq when this subscription was made.
    pub fn latest_seq(&self) -> u64 {
        self.latest_seq
    }

    /// The next delivery; None after the end has been delivered. What is
    /// queued is taken a few at a time (one lock, one allocation), so a
    /// reader of single deliveries costs little more than one of batches.
    /// What it takes ahead stays counted in the reader's budget until it
    /// takes more: handed out, a frame is still being encoded and sent
    /// (gRPC's stream holds the message until the window lets it out), and
    /// one charge per take keeps the shared total off the per-frame path.
    pub async fn recv(&mut self) -> Option<Delivery> {
        if self.ready.is_empty() {
            self.ready_charge = None;
            self.ready = self.recv_many(RECV_AHEAD).await.into();
            let bytes = self.ready.iter().map(delivery_size).sum();
            self.ready_charge = Some(self.charge(bytes));
        }
        self.ready.pop_front()
    }

    /// Up to `max` deliveries at once (at least one unless the subscription is
    /// over), so an edge can coalesce what is queued into one write.
    pub async fn recv_many(&mut self, max: usize) -> Vec<Delivery> {
        let max = max.max(1);
        if !self.ready.is_empty() {
            let n = max.min(self.ready.len());
            let out: Vec<Delivery> = self.ready.drain(..n).collect();
            if let Some(c) = &mut self.ready_charge {
                // Handed to a caller that takes many: it holds them itself.
                c.release(out.iter().map(delivery_size).sum());
            }
            return out;
        }
        loop {
            if self.done {
                return Vec::new();
            }
            if let Some((reason, latest_seq, lost)) = self.resync.take() {
                return vec![Delivery::Resync {
                    reason,
                    latest_seq,
                    lost,
                }];
            }
            if self.cursor < self.retained_upto {
                let out = self.take_retained(max).await;
                if !out.is_empty() {
                    return out;
                }
                continue;
            }
            match self.take_queue(max) {
                Queued::Out(out) => return out,
                Queued::Lagged => self.resume(),
                Queued::Empty => self.queue.notify.notified().await,
            }
        }
    }

    /// A retained frame must follow the cursor exactly; where it does not
    /// (history lost to a corrupt ledger line), a resync comes first.
    fn follows(&mut self, seq: u64) -> bool {
        if seq == self.cursor + 1 {
            return true;
        }
        self.gap(seq - 1);
        false
    }

    /// The history after the cursor up to `upto` is missing: a resync is
    /// due (`history_lost` with the range when the ledger recorded losing
    /// it), and the cursor moves past the gap.
    fn gap(&mut self, upto: u64) {
        let inner = self.shared.lock();
        let lost = inner
            .lost
            .iter()
            .find(|&&(from, to)| from <= upto && to > self.cursor)
            .copied();
        let reason = if lost.is_some() {
            ResyncReason::HistoryLost
        } else {
            ResyncReason::HistoryUnavailable
        };
        self.resync = Some((reason, inner.latest, lost));
        drop(inner);
        self.cursor = upto;
    }

    /// The next retained frames after the cursor: from the ring while it
    /// still holds them, else from the log.
    async fn take_retained(&mut self, max: usize) -> Vec<Delivery> {
        let upto = self.retained_upto;
        if !self.from_log.is_empty() {
            return self.take_from_log(upto, max);
        }
        let from_ring: Result<Vec<Arc<Frame>>, u64> = {
            let inner = self.shared.lock();
            match inner.ring.front().map(|f| f.seq) {
                Some(first) if first <= self.cursor + 1 => {
                    // Ring seqs are consecutive (a restore after a corrupt
                    // line may leave a gap: then scan).
                    let skip = (self.cursor + 1 - first) as usize;
                    // Catching up merges many frames into few: take a chunk.
                    let max = if self.catching_up {
                        max.max(CHUNK as usize)
                    } else {
                        max
                    };
                    let frames: Vec<Arc<Frame>> = match inner.ring.get(skip) {
                        Some(f) if f.seq == self.cursor + 1 => {
                            inner.ring.range(skip..).take(max).cloned().collect()
                        }
                        _ => inner
                            .ring
                            .iter()
                            .filter(|f| f.seq > self.cursor)
                            .take(max)
                            .cloned()
                            .collect(),
                    };
                    Ok(frames)
                }
                Some(first) => Err(first - 1),
                None => Err(upto),
            }
        };
        let frames = match from_ring {
            Ok(frames) => frames,
            Err(older) => return self.read_disk(older.min(upto), max).await,
        };
        self.leave_disk();
        let mut out = Vec::new();
        for f in &frames {
            if !self.accept(&mut out, f, upto, max) {
                break;
            }
        }
        if out.is_empty() && self.resync.is_none() {
            // The ring has nothing more up to `upto` (it cannot lose what it
            // holds, so only a gap does this): say so, go on live.
            self.gap(upto);
        }
        out
    }

    /// Counts this subscription as replaying from the log.
    fn enter_disk(&mut self) {
        if !self.on_disk {
            self.on_disk = true;
            self.shared.on_disk.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// No longer replaying from the log: the last one to stop empties the
    /// replay cache, and what is left of its own read goes too.
    fn leave_disk(&mut self) {
        if self.on_disk {
            self.on_disk = false;
            self.from_log = VecDeque::new();
            if self.shared.on_disk.fetch_sub(1, Ordering::AcqRel) == 1 {
                self.shared.replay.clear();
            }
        }
    }

    /// The frames read from the log, as far as `max` allows.
    fn take_from_log(&mut self, upto: u64, max: usize) -> Vec<Delivery> {
        let mut out = Vec::new();
        while let Some(f) = self.from_log.front().cloned() {
            if f.seq <= self.cursor {
                self.from_log.pop_front();
                continue;
            }
            if !self.accept(&mut out, &f, upto, max) {
                break;
            }
            self.from_log.pop_front();
        }
        out
    }

    /// Adds retained frame `f` to `out` if it is due and there is room;
    /// false when the replay stops here for now. A subscription catching up
    /// after its queue overflowed merges consecutive deltas as its queue
    /// would have (up to `MAX_MERGED`), so a slow reader catches up in few
    /// frames; a replay a client asked for hands every frame as published.
    fn accept(&mut self, out: &mut Vec<Delivery>, f: &Arc<Frame>, upto: u64, max: usize) -> bool {
        if f.seq > upto || !self.follows(f.seq) {
            return false;
        }
        if self.catching_up {
            if let Some(Delivery::Frame(tail)) = out.last_mut() {
                if merge_into(tail, f, usize::MAX).is_some() {
                    self.cursor = f.seq;
                    return true;
                }
            }
        }
        if out.len() >= max {
            return false;
        }
        self.cursor = f.seq;
        out.push(Delivery::Frame(f.clone()));
        true
    }

    /// The next chunk of a replay from disk, read off the runtime.
    async fn read_disk(&mut self, upto: u64, max: usize) -> Vec<Delivery> {
        let Some(log) = self.shared.log.clone() else {
            // Rotated out of the ring and no log to read it from.
            self.gap(upto);
            return Vec::new();
        };
        self.enter_disk();
        let after = self.cursor;
        let chunk = match self
            .shared
            .replay
            .chunk(after / CHUNK, &log, &self.shared.session_id)
            .await
        {
            Ok(chunk) => chunk,
            Err(e) => {
                tracing::warn!(session = %self.shared.session_id, after, "replay from the ledger failed: {e}");
                Arc::from(Vec::new())
            }
        };
        self.from_log = chunk
            .iter()
            .filter(|f| f.seq > after && f.seq <= upto)
            .cloned()
            .collect();
        let out = self.take_from_log(upto, max);
        if out.is_empty() && self.resync.is_none() {
            // The log has nothing more up to `upto`: say so, then go on.
            self.gap(upto);
        }
        out
    }

    /// What the live queue holds, up to `max` deliveries. A reader that
    /// finds its queue full (where new deltas already merge into the tail)
    /// gets the consecutive same-kind deltas it takes together as one (up
    /// to `MAX_MERGED`): what lets it catch up is fewer frames to encode,
    /// write and parse on every transport. A queue that never filled hands
    /// every frame over as published.
    fn take_queue(&mut self, max: usize) -> Queued {
        let mut st = self.queue.lock();
        let full = self.merge_taken && st.frames.len() >= self.queue.cap;
        let mut out: Vec<Delivery> = Vec::with_capacity(max.min(st.frames.len()));
        let mut taken = 0;
        while let Some(f) = st.frames.front() {
            if taken >= TAKE_BYTES {
                break;
            }
            let merged = match out.last_mut() {
                Some(Delivery::Frame(tail)) if full => merge_into(tail, f, usize::MAX).is_some(),
                _ => false,
            };
            if !merged && out.len() >= max {
                break;
            }
            let Some(f) = st.frames.pop_front() else { break };
            taken += f.queued_cost();
            self.cursor = self.cursor.max(f.seq);
            if !merged {
                out.push(Delivery::Frame(f));
            }
        }
        // One update of the shared total per take, not per frame: every
        // subscriber's reader and the committer touch that counter.
        let bytes = if st.frames.is_empty() {
            if st.frames.capacity() > KEEP_SLOTS {
                // Grown for a burst: a drained queue gives that back.
                st.frames = VecDeque::new();
            }
            0
        } else {
            st.bytes.saturating_sub(taken)
        };
        if bytes != st.bytes {
            self.queue.set_bytes(&mut st, bytes);
        }
        if !out.is_empty() {
            return Queued::Out(out);
        }
        if let Some(end) = st.end.clone() {
            self.done = true;
            return Queued::Out(vec![Delivery::End(end)]);
        }
        if st.lagged {
            return Queued::Lagged;
        }
        Queued::Empty
    }

    /// Replaces a dropped queue with a fresh subscription after the cursor.
    fn resume(&mut self) {
        let mut next = subscribe_holding(&self.shared, Some(self.cursor), self.held.clone());
        next.latest_seq = self.latest_seq;
        next.catching_up = true;
        next.merge_taken = self.merge_taken;
        *self = next;
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.leave_disk();
        let mut st = self.queue.lock();
        st.detached = true;
        self.queue.clear(&mut st);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::ClientEvent;
    use crate::log::ledger::{Batch, Ledger};
    use crate::Durability;

    /// What the session's writer does once an event is durable.
    fn publish(b: &Bus, event: ClientEvent) -> u64 {
        let seq = b.latest_seq() + 1;
        b.commit(vec![Arc::new(Frame::new(seq, b.session_id().clone(), event))]);
        seq
    }

    fn bus(ring: usize, queue: usize) -> Bus {
        let cfg = BusConfig {
            ring,
            queue,
            max_queued_bytes: 1 << 20,
            ..BusConfig::default()
        };
        Bus::new("s".into(), cfg, None, 0, Vec::new())
    }

    fn text(t: &str) -> ClientEvent {
        ClientEvent::TextDelta { text: t.into() }
    }

    /// What `sub` delivers up to seq `upto` (the bus's latest when called),
    /// with any resync on the way; stops early at the end. A deadline, not a
    /// quiet gap, bounds a wait that would never finish.
    async fn drain(sub: &mut Subscription, upto: u64) -> Vec<Delivery> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        let mut out: Vec<Delivery> = Vec::new();
        let reached = |out: &[Delivery]| {
            upto == 0
                || out.iter().any(|d| match d {
                    Delivery::Frame(f) => f.seq >= upto,
                    Delivery::Resync { .. } => false,
                    Delivery::End(_) => true,
                })
        };
        while !reached(&out) {
            let batch = tokio::time::timeout_at(deadline, sub.recv_many(64))
                .await
                .unwrap_or_else(|_| panic!("seq {upto} never came: {out:?}"));
            if batch.is_empty() {
                break;
            }
            out.extend(batch);
        }
        out
    }

    fn seqs(ds: &[Delivery]) -> Vec<u64> {
        ds.iter()
            .filter_map(|d| match d {
                Delivery::Frame(f) => Some(f.seq),
                _ => None,
            })
            .collect()
    }

    #[tokio::test]
    async fn seqs_are_gap_free_and_replay_follows_the_cursor() {
        let b = bus(8, 16);
        for i in 0..5 {
            assert_eq!(publish(&b, text(&i.to_string())), i + 1);
        }
        let mut sub = b.subscribe(Some(2));
        assert_eq!(sub.latest_seq(), 5);
        publish(&b, text("live"));
        assert_eq!(seqs(&drain(&mut sub, b.latest_seq()).await), vec![3, 4, 5, 6]);
        let mut live = b.subscribe(None);
        publish(&b, text("x"));
        assert_eq!(seqs(&drain(&mut live, b.latest_seq()).await), vec![7]);
    }

    #[tokio::test]
    async fn a_cursor_older_than_the_ring_or_ahead_resyncs_then_replays_the_ring() {
        let b = bus(4, 16);
        for _ in 0..10 {
            publish(&b, text("x"));
        }
        for (after, reason) in [(2, "cursor_too_old"), (11, "cursor_ahead")] {
            let mut sub = b.subscribe(Some(after));
            let got = drain(&mut sub, b.latest_seq()).await;
            match &got[0] {
                Delivery::Resync {
                    reason: r,
                    latest_seq,
                    lost: None,
                } => {
                    assert_eq!((r.as_str(), *latest_seq), (reason, 10));
                }
                other => panic!("expected resync, got {other:?}"),
            }
            assert_eq!(seqs(&got), vec![7, 8, 9, 10]);
        }
        // The oldest cursor the ring can still serve exactly: 6 (next is 7).
        let mut sub = b.subscribe(Some(6));
        let got = drain(&mut sub, b.latest_seq()).await;
        assert!(matches!(got[0], Delivery::Frame(_)));
        assert_eq!(seqs(&got), vec![7, 8, 9, 10]);
    }

    #[tokio::test]
    async fn a_full_queue_merges_deltas_losslessly() {
        let b = bus(4, 4);
        let mut sub = b.subscribe(Some(0));
        publish(&b, ClientEvent::Status { busy: true });
        let mut expected = String::new();
        for i in 0..1000 {
            let t = format!("t{i} ");
            expected.push_str(&t);
            publish(&b, text(&t));
        }
        publish(&b, ClientEvent::Status { busy: false });
        let got = drain(&mut sub, b.latest_seq()).await;
        assert!(got.len() <= 4, "queue stayed bounded: {}", got.len());
        let mut all = String::new();
        for d in &got {
            if let Delivery::Frame(f) = d {
                if let ClientEvent::TextDelta { text } = &f.event {
                    all.push_str(text);
                }
            }
        }
        assert_eq!(all, expected);
        assert_eq!(
            *seqs(&got).last().unwrap(),
            1002,
            "the last frame carries the last seq"
        );
    }

    #[tokio::test]
    async fn a_reader_whose_queue_filled_gets_the_deltas_it_takes_together_merged_and_a_replay_or_frame_by_frame_gets_every_frame(
    ) {
        // A queue of 8 frames: full, its reader is behind.
        let b = bus(64, 8);
        let mut live = b.subscribe(None);
        let mut exact = b.subscribe(None).frame_by_frame();
        // A queue that is not full hands every frame over as published.
        for t in ["x ", "y "] {
            publish(&b, text(t));
        }
        assert_eq!(seqs(&live.recv_many(16).await), vec![1, 2]);
        assert_eq!(seqs(&exact.recv_many(16).await), vec![1, 2]);
        for t in ["a ", "b ", "c "] {
            publish(&b, text(t));
        }
        publish(&b, ClientEvent::Status { busy: false });
        publish(&b, text("d "));
        publish(&b, ClientEvent::ThinkingDelta { text: "e ".into() });
        publish(&b, text("f "));
        publish(&b, text("g "));
        let got = live.recv_many(16).await;
        let shown: Vec<(u64, String)> = got
            .iter()
            .map(|d| match d {
                Delivery::Frame(f) => (f.seq, format!("{:?}", f.event)),
                other => panic!("{other:?}"),
            })
            .collect();
        let want = [
            (5, text("a b c ")),
            (6, ClientEvent::Status { busy: false }),
            (7, text("d ")),
            (8, ClientEvent::ThinkingDelta { text: "e ".into() }),
            (10, text("f g ")),
        ]
        .map(|(seq, e)| (seq, format!("{e:?}")));
        assert_eq!(
            shown, want,
            "one frame per run of same-kind deltas, carrying its last seq"
        );
        // The ring keeps every frame: a replay a client asks for is exact.
        let mut replay = b.subscribe(Some(0));
        assert_eq!(seqs(&replay.recv_many(16).await), (1..=10).collect::<Vec<_>>());
        // So does a subscription that asked for every frame (`/stream`'s).
        assert_eq!(seqs(&exact.recv_many(16).await), (3..=10).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn a_full_queue_merges_tool_output_per_call_and_stream_in_order() {
        use crate::event::OutputStream::{Stderr, Stdout};
        let b = bus(4, 4);
        let mut sub = b.subscribe(Some(0));
        let out = |call: &str, stream, text: String| ClientEvent::ToolOutput {
            call_id: call.into(),
            stream,
            text,
        };
        let runs = [
            ("c", Stdout, 400),
            ("c", Stderr, 300),
            ("c", Stdout, 200),
            ("d", Stdout, 100),
        ];
        let mut expected = Vec::new();
        for (call, stream, n) in runs {
            let mut all = String::new();
            for i in 0..n {
                let t = format!("{call}{i} ");
                all.push_str(&t);
                publish(&b, out(call, stream, t));
            }
            expected.push((call.to_string(), stream, all));
        }
        let got = drain(&mut sub, b.latest_seq()).await;
        assert!(got.len() <= 4, "queue stayed bounded: {}", got.len());
        let frames: Vec<_> = got
            .iter()
            .map(|d| match d {
                Delivery::Frame(f) => match &f.event {
                    ClientEvent::ToolOutput {
                        call_id,
                        stream,
                        text,
                    } => (call_id.clone(), *stream, text.clone()),
                    other => panic!("{other:?}"),
                },
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(
            frames, expected,
            "every byte, in order, never mixing calls or streams"
        );
        assert_eq!(*seqs(&got).last().unwrap(), 1000);
    }

    #[tokio::test]
    async fn a_merged_delta_never_grows_past_its_cap_and_nothing_is_lost() {
        let dir = tempfile::tempdir().unwrap();
        let (b, ledger) = logged_bus(dir.path(), 8, 4);
        let mut sub = b.subscribe(None);
        let chunk = "y".repeat(10_000);
        for _ in 0..500 {
            write(&b, &ledger, text(&chunk));
        }
        let got = drain(&mut sub, b.latest_seq()).await;
        let mut all = 0;
        for d in &got {
            if let Delivery::Frame(f) = d {
                let len = f.event.delta_len().unwrap();
                assert!(len <= MAX_MERGED, "a merged frame of {len} bytes");
                all += len;
            }
        }
        assert_eq!(all, 500 * 10_000, "every byte arrives");
        assert_eq!(*seqs(&got).last().unwrap(), 500);
    }

    #[tokio::test]
    async fn a_subscriber_too_far_behind_resumes_from_its_cursor_in_the_same_subscription() {
        let b = bus(64, 4);
        let mut sub = b.subscribe(None);
        for i in 0..10 {
            publish(&b, ClientEvent::Status { busy: i % 2 == 0 });
        }
        assert_eq!(b.subscriber_count(), 0, "the lagging queue was dropped");
        let got = drain(&mut sub, b.latest_seq()).await;
        assert_eq!(
            seqs(&got),
            (1..=10).collect::<Vec<_>>(),
            "no gap, no end: {got:?}"
        );
        assert!(got.iter().all(|d| matches!(d, Delivery::Frame(_))));
        assert_eq!(b.subscriber_count(), 1, "attached again");
        publish(&b, ClientEvent::Status { busy: true });
        assert_eq!(seqs(&drain(&mut sub, b.latest_seq()).await), vec![11]);
    }

    #[tokio::test]
    async fn a_commit_of_many_frames_reaches_each_subscriber_in_order_and_one_that_fills_mid_commit_resumes_from_its_cursor(
    ) {
        // Queues of 4 frames that cannot merge (status frames), one commit of 10.
        let b = bus(64, 4);
        let mut fast = b.subscribe(None);
        let mut slow = b.subscribe(None);
        let first: Vec<Arc<Frame>> = (1..=3)
            .map(|seq| {
                Arc::new(Frame::new(
                    seq,
                    b.session_id().clone(),
                    ClientEvent::Status { busy: true },
                ))
            })
            .collect();
        b.commit(first);
        // `fast` reads those three; `slow` keeps them queued, so the next
        // commit fills its queue part-way through.
        assert_eq!(seqs(&drain(&mut fast, 3).await), vec![1, 2, 3]);
        let many: Vec<Arc<Frame>> = (4..=13)
            .map(|seq| {
                Arc::new(Frame::new(
                    seq,
                    b.session_id().clone(),
                    ClientEvent::Status { busy: seq % 2 == 0 },
                ))
            })
            .collect();
        b.commit(many);
        assert_eq!(b.latest_seq(), 13);
        assert_eq!(
            b.subscriber_count(),
            0,
            "both queues filled within the commit and were dropped"
        );
        for sub in [&mut fast, &mut slow] {
            let got = drain(sub, 13).await;
            assert!(
                got.iter().all(|d| matches!(d, Delivery::Frame(_))),
                "no resync, no end: {got:?}"
            );
            let from = seqs(&got)[0];
            assert_eq!(seqs(&got), (from..=13).collect::<Vec<_>>(), "in order, no gap");
        }
        assert_eq!(b.subscriber_count(), 2, "both attached again");
        b.commit(Vec::new());
        assert_eq!(b.latest_seq(), 13, "an empty commit changes nothing");
    }

    fn logged_bus(dir: &std::path::Path, ring: usize, queue: usize) -> (Bus, Arc<Ledger>) {
        let ledger = Arc::new(Ledger::create(&dir.join("s.jsonl"), "s", "t", Durability::Process).unwrap());
        let cfg = BusConfig {
            ring,
            queue,
            max_queued_bytes: 1 << 20,
            ..BusConfig::default()
        };
        let log: Arc<dyn Log> = ledger.clone();
        (Bus::new("s".into(), cfg, Some(log), 0, Vec::new()), ledger)
    }

    /// Appends then commits, as the writer does.
    fn write(b: &Bus, ledger: &Ledger, event: ClientEvent) {
        let frame = Arc::new(Frame::new(b.latest_seq() + 1, b.session_id().clone(), event));
        let mut batch = Batch::default();
        batch.push_frame(&frame);
        ledger.append(&batch).unwrap();
        b.commit(vec![frame]);
    }

    #[tokio::test]
    async fn a_cursor_older_than_the_ring_is_replayed_from_the_log_then_joins_live() {
        let dir = tempfile::tempdir().unwrap();
        let (b, ledger) = logged_bus(dir.path(), 16, 64);
        for i in 0..3000 {
            write(&b, &ledger, text(&format!("{i} ")));
        }
        let mut sub = b.subscribe(Some(500));
        write(&b, &ledger, text("live"));
        let got = drain(&mut sub, b.latest_seq()).await;
        assert!(got.iter().all(|d| matches!(d, Delivery::Frame(_))), "no resync");
        assert_eq!(seqs(&got), (501..=3001).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn a_stalled_subscriber_past_the_ring_resumes_from_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let (b, ledger) = logged_bus(dir.path(), 8, 4);
        let mut sub = b.subscribe(None);
        for i in 0..2000 {
            // Status frames never merge: the queue overflows at once.
            write(&b, &ledger, ClientEvent::Status { busy: i % 2 == 0 });
        }
        let got = drain(&mut sub, b.latest_seq()).await;
        assert!(
            got.iter().all(|d| matches!(d, Delivery::Frame(_))),
            "no resync, no end"
        );
        assert_eq!(seqs(&got), (1..=2000).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn replay_across_missing_history_says_resync_instead_of_skipping() {
        let dir = tempfile::tempdir().unwrap();
        let (b, ledger) = logged_bus(dir.path(), 4, 64);
        for i in 0..10 {
            write(&b, &ledger, text(&i.to_string()));
        }
        // A ledger that lost seqs 3..=5 (a corrupt middle line left out).
        let frames: Vec<Arc<Frame>> = [1u64, 2, 6, 7, 8, 9, 10]
            .iter()
            .map(|&s| Arc::new(Frame::new(s, "s".into(), text("x"))))
            .collect();
        let gappy = Bus::new("s".into(), BusConfig::default(), None, 10, frames);
        let got = drain(&mut gappy.subscribe(Some(0)), gappy.latest_seq()).await;
        assert_eq!(seqs(&got[..2]), vec![1, 2]);
        assert!(
            matches!(&got[2], Delivery::Resync { reason, .. } if reason.as_str() == "history_unavailable")
        );
        assert_eq!(seqs(&got[3..]), vec![6, 7, 8, 9, 10]);
        drop(ledger);
    }

    #[tokio::test]
    async fn a_stalled_subscriber_holds_at_most_its_byte_budget() {
        let budget = 64 * 1024;
        let cfg = BusConfig {
            ring: 8,
            queue: 16,
            max_queued_bytes: budget,
            ..BusConfig::default()
        };
        let b = Bus::new("s".into(), cfg, None, 0, Vec::new());
        let sub = b.subscribe(None);
        let chunk = "x".repeat(1000);
        let mut most = 0;
        for _ in 0..1000 {
            publish(&b, text(&chunk));
            most = most.max(cfg_total(&b));
        }
        assert_eq!(b.subscriber_count(), 0, "over budget: dropped, not grown");
        assert!(most <= budget, "held {most} bytes");
        assert!(
            most > budget / 2,
            "the budget is used before the queue is dropped ({most})"
        );
        drop(sub);
        assert_eq!(cfg_total(&b), 0, "the bytes are returned when the reader goes");
    }

    fn cfg_total(b: &Bus) -> usize {
        b.shared.cfg.total.get()
    }

    /// What a queued frame may really hold, counted independently of
    /// `Frame::queued_cost`: a delta's text at its capacity, and for one as
    /// published (the tests' 1000-byte deltas; merged ones are longer) the
    /// encoding a reader may have cached on it.
    fn real_size(f: &Frame) -> usize {
        match &f.event {
            ClientEvent::TextDelta { text } if text.len() == 1000 => {
                64 + text.capacity() + text.len() + f.session_id.len() + 96
            }
            ClientEvent::TextDelta { text } => 64 + text.capacity(),
            other => other.approx_size(),
        }
    }

    /// (counted, really held) bytes of a subscription's queue.
    fn queue_bytes(sub: &Subscription) -> (usize, usize) {
        let st = sub.queue.lock();
        (st.bytes, st.frames.iter().map(|f| real_size(f)).sum())
    }

    #[tokio::test]
    async fn a_full_queue_counts_merged_text_at_its_capacity_and_never_holds_more_than_its_budget() {
        let budget = 64 * 1024;
        let cfg = BusConfig {
            ring: 8,
            queue: 4,
            max_queued_bytes: budget,
            ..BusConfig::default()
        };
        let b = Bus::new("s".into(), cfg, None, 0, Vec::new());
        let sub = b.subscribe(None);
        let chunk = "x".repeat(1000);
        let mut most = 0;
        for _ in 0..1000 {
            publish(&b, text(&chunk));
            let (counted, real) = queue_bytes(&sub);
            assert_eq!(counted, real, "the count is what the queued frames hold");
            assert_eq!(cfg_total(&b), counted, "and what the total says");
            most = most.max(real);
        }
        assert_eq!(b.subscriber_count(), 0, "over budget: dropped, not grown");
        assert!(most <= budget, "held {most} bytes, budget {budget}");
        assert!(
            most > budget / 2,
            "the budget is used before the queue is dropped ({most})"
        );
        drop(sub);
        assert_eq!(cfg_total(&b), 0);
    }

    #[tokio::test]
    async fn what_a_reader_holds_outside_its_queue_counts_in_its_budget_until_dropped() {
        let budget = 64 * 1024;
        let cfg = BusConfig {
            ring: 1024,
            queue: 1 << 20,
            max_queued_bytes: budget,
            ..BusConfig::default()
        };
        let b = Bus::new("s".into(), cfg, None, 0, Vec::new());
        let mut sub = b.subscribe(None);
        let chunk = "x".repeat(1000);
        for _ in 0..10 {
            publish(&b, text(&chunk));
        }
        assert_eq!(seqs(&sub.recv_many(64).await), (1..=10).collect::<Vec<_>>());
        assert_eq!(cfg_total(&b), 0, "taken: no longer queued");
        // The edge encoded them and cannot write them yet.
        let charge = sub.charge(40_000);
        assert_eq!(cfg_total(&b), 40_000);
        for _ in 0..30 {
            publish(&b, text(&chunk));
        }
        assert_eq!(
            b.subscriber_count(),
            0,
            "what the reader holds left room for fewer frames: dropped"
        );
        let (queued, _) = queue_bytes(&sub);
        assert!(queued + 40_000 <= budget, "queued {queued} + held 40000");
        assert!(
            queued + 40_000 > budget - 2200,
            "the rest of the budget was used ({queued})"
        );
        assert_eq!(cfg_total(&b), queued + 40_000);
        drop(charge);
        assert_eq!(cfg_total(&b), queued, "given back when the edge drops it");
        // Nothing is lost: the reader resumes from its cursor.
        let rest = drain(&mut sub, b.latest_seq()).await;
        assert!(rest.iter().all(|d| matches!(d, Delivery::Frame(_))), "no resync");
        let mut text_len = 0;
        for d in &rest {
            if let Delivery::Frame(f) = d {
                text_len += f.event.delta_len().unwrap();
            }
        }
        assert_eq!(text_len, 30 * 1000, "every byte after what it was handed");
        assert_eq!(*seqs(&rest).last().unwrap(), 40);
        drop(sub);
        assert_eq!(cfg_total(&b), 0);
    }

    #[tokio::test]
    async fn deliveries_taken_ahead_by_recv_stay_counted_until_it_takes_more() {
        let b = bus(64, 64);
        let mut sub = b.subscribe(None);
        for _ in 0..5 {
            publish(&b, text("abc"));
        }
        let size = Frame::new(1, "s".into(), text("abc")).size;
        assert!(matches!(sub.recv().await, Some(Delivery::Frame(f)) if f.seq == 1));
        assert_eq!(cfg_total(&b), 5 * size, "taken ahead: counted as the reader's");
        for seq in 2..=5 {
            assert!(matches!(sub.recv().await, Some(Delivery::Frame(f)) if f.seq == seq));
        }
        assert_eq!(
            cfg_total(&b),
            5 * size,
            "the last ones may still be on their way out"
        );
        publish(&b, text("abc"));
        assert!(matches!(sub.recv().await, Some(Delivery::Frame(f)) if f.seq == 6));
        assert_eq!(cfg_total(&b), size, "taking more gives the earlier ones back");
        drop(sub);
        assert_eq!(cfg_total(&b), 0);
    }

    #[tokio::test]
    async fn a_drained_queue_and_a_finished_replay_give_back_what_a_burst_grew() {
        let b = bus(64, 1 << 20);
        let mut sub = b.subscribe(None);
        for i in 0..1000 {
            publish(&b, ClientEvent::Status { busy: i % 2 == 0 });
        }
        assert!(sub.queue.lock().frames.capacity() >= 1000);
        assert_eq!(drain(&mut sub, 1000).await.len(), 1000);
        assert!(
            sub.queue.lock().frames.capacity() <= KEEP_SLOTS,
            "a drained queue keeps {} slots",
            sub.queue.lock().frames.capacity()
        );

        let dir = tempfile::tempdir().unwrap();
        let (b, ledger) = logged_bus(dir.path(), 16, 64);
        for i in 0..3000 {
            write(&b, &ledger, text(&format!("{i} ")));
        }
        let mut replay = b.subscribe(Some(0));
        let first = replay.recv_many(64).await;
        assert_eq!(seqs(&first), (1..=64).collect::<Vec<_>>());
        assert!(
            b.shared.replay.cached_chunks() > 0,
            "read from disk, cached for other readers"
        );
        let rest = drain(&mut replay, 3000).await;
        assert_eq!(*seqs(&rest).last().unwrap(), 3000);
        assert_eq!(
            b.shared.replay.cached_chunks(),
            0,
            "caught up: the cached chunks are gone"
        );
        assert!(replay.from_log.capacity() == 0);
    }

    #[tokio::test]
    async fn all_subscribers_together_hold_at_most_the_total_budget() {
        let cfg = BusConfig {
            ring: 8,
            queue: 1 << 20,
            max_queued_bytes: 1 << 20,
            max_total_queued_bytes: 100 * 1024,
            ..BusConfig::default()
        };
        let b = Bus::new("s".into(), cfg, None, 0, Vec::new());
        let subs: Vec<Subscription> = (0..10).map(|_| b.subscribe(None)).collect();
        let chunk = "x".repeat(1000);
        for _ in 0..1000 {
            publish(&b, ClientEvent::Status { busy: true });
            publish(&b, text(&chunk));
        }
        assert!(cfg_total(&b) <= 100 * 1024, "total {}", cfg_total(&b));
        drop(subs);
        assert_eq!(cfg_total(&b), 0);
    }

    #[tokio::test]
    async fn close_ends_every_subscription() {
        let b = bus(8, 8);
        let mut sub = b.subscribe(None);
        publish(&b, text("a"));
        b.close(CloseReason::ShuttingDown);
        // Up to the end, which comes after the last seq.
        let got = drain(&mut sub, u64::MAX).await;
        assert_eq!(seqs(&got), vec![1]);
        assert!(
            matches!(got.last(), Some(Delivery::End(End::Closed(r))) if r.as_str() == "server shutting down")
        );
        let mut late = b.subscribe(None);
        assert!(matches!(late.recv().await, Some(Delivery::End(End::Closed(_)))));
        assert!(late.recv().await.is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn waiting_for_a_subscriber_returns_when_one_arrives_or_times_out() {
        let b = Arc::new(bus(8, 8));
        let start = tokio::time::Instant::now();
        b.wait_for_subscriber(Duration::from_secs(2)).await;
        assert_eq!(start.elapsed(), Duration::from_secs(2));

        let b2 = b.clone();
        let waiter = tokio::spawn(async move { b2.wait_for_subscriber(Duration::from_secs(2)).await });
        tokio::task::yield_now().await;
        let start = tokio::time::Instant::now();
        let _sub = b.subscribe(None);
        waiter.await.unwrap();
        assert!(start.elapsed() < Duration::from_secs(2));

        let start = tokio::time::Instant::now();
        b.wait_for_subscriber(Duration::from_secs(2)).await;
        assert_eq!(start.elapsed(), Duration::ZERO, "no wait when someone watches");
    }

    fn flushing_bus(window_ms: u64, from: usize) -> Bus {
        let cfg = BusConfig {
            flush_window: Duration::from_millis(window_ms),
            flush_from: from,
            ..BusConfig::default()
        };
        Bus::new("s".into(), cfg, None, 0, Vec::new())
    }

    /// What `sub` has ready right now (without waiting), as seqs.
    fn ready(sub: &mut Subscription) -> Option<Vec<u64>> {
        use futures_util::FutureExt;
        sub.recv_many(64).now_or_never().map(|d| seqs(&d))
    }

    #[tokio::test(start_paused = true)]
    async fn a_busy_session_with_many_subscribers_wakes_them_once_per_flush_window() {
        let b = flushing_bus(10, 3);
        let mut subs: Vec<Subscription> = (0..3).map(|_| b.subscribe(None)).collect();
        // The first commit after a quiet window goes out at once.
        publish(&b, text("a"));
        for s in &mut subs {
            assert_eq!(ready(s), Some(vec![1]));
        }
        // Readers waiting for more: commits inside the window wait for its
        // end, then come together in one wake-up.
        let start = tokio::time::Instant::now();
        let waiting: Vec<_> = subs
            .into_iter()
            .map(|mut s| {
                tokio::spawn(async move {
                    let got = seqs(&s.recv_many(64).await);
                    (got, start.elapsed(), s)
                })
            })
            .collect();
        tokio::task::yield_now().await;
        tokio::time::advance(Duration::from_millis(1)).await;
        publish(&b, text("b"));
        tokio::time::advance(Duration::from_millis(1)).await;
        publish(&b, text("c"));
        let mut subs = Vec::new();
        for w in waiting {
            let (got, woken, s) = w.await.unwrap();
            assert_eq!(got, vec![2, 3], "one wake-up carries both frames");
            assert_eq!(woken, Duration::from_millis(10), "woken at the window's end");
            subs.push(s);
        }
        // After a quiet window, again at once.
        tokio::time::advance(Duration::from_millis(10)).await;
        publish(&b, text("d"));
        for s in &mut subs {
            assert_eq!(ready(s), Some(vec![4]));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn below_flush_from_or_with_no_window_every_commit_wakes_at_once() {
        for b in [flushing_bus(10, 3), flushing_bus(0, 1)] {
            let mut subs: Vec<Subscription> = (0..2).map(|_| b.subscribe(None)).collect();
            for n in 1..=3 {
                publish(&b, text("x"));
                for s in &mut subs {
                    assert_eq!(ready(s), Some(vec![n]));
                }
                tokio::time::advance(Duration::from_millis(1)).await;
            }
        }
    }
}
