//! One subscriber's view of a bus: replay read lazily from the ring or the log, then its live queue, resumed from its cursor when the bus drops the queue.

use crate::event::Frame;
use crate::log::replay::CHUNK;
use crate::reasons::ResyncReason;
use crate::stream::bus_config::Charge;
use crate::stream::delivery::{Delivery, End};
use crate::stream::ring::Shared;
use crate::stream::sub_queue::{merge_into, SubQueue};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Deliveries `Subscription::recv` takes at once: few, since a reader of
/// single deliveries holds them (counted in its budget) until it asks again.
const RECV_AHEAD: usize = 16;

/// The most bytes one take from the queue hands over (at least one frame):
/// what a reader then holds encoded, until written, comes in bounded steps.
const TAKE_BYTES: usize = 1 << 20;

/// A queue whose frames were all taken keeps its allocation only up to this
/// many slots: one that grew for a burst gives it back once drained.
pub(super) const KEEP_SLOTS: usize = 64;

/// `subscribe` for a reader that already holds `held` bytes outside its
/// queue (a resumed one: its edge may still hold what it was handed).
pub(super) fn subscribe_holding(
    shared: &Arc<Shared>,
    after: Option<u64>,
    held: Arc<AtomicUsize>,
) -> Subscription {
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
        merged: 0,
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
    crate::metrics_names::hot().subscribers.increment(1.0);
    sub
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
    pub(super) latest_seq: u64,
    /// The last seq handed out: the point a resume continues after.
    cursor: u64,
    /// A resync due next.
    resync: Option<DueResync>,
    /// Frames up to this seq (the latest when the queue was attached) come
    /// from the ring or the log; later ones from the queue.
    retained_upto: u64,
    /// What the last read from the log brought that is still due: a chunk
    /// is read once per subscription, however few frames a call takes.
    pub(super) from_log: VecDeque<Arc<Frame>>,
    pub(super) queue: Arc<SubQueue>,
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
    /// Deltas this reader's takes merged since its last take was counted.
    merged: u64,
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
        let out = self.take_fresh(max).await;
        // Counted per take, not per frame or per subscriber.
        let frames = out.iter().filter(|d| matches!(d, Delivery::Frame(_))).count();
        let hot = crate::metrics_names::hot();
        hot.delivered.increment(frames as u64);
        if self.merged > 0 {
            hot.merges.increment(std::mem::take(&mut self.merged));
        }
        out
    }

    /// Up to `max` deliveries not taken before: a resync due, retained
    /// frames, or what is queued.
    async fn take_fresh(&mut self, max: usize) -> Vec<Delivery> {
        loop {
            if self.done {
                return Vec::new();
            }
            if let Some((reason, latest_seq, lost)) = self.resync.take() {
                metrics::counter!(crate::metrics_names::RESYNCS, "reason" => reason.as_str()).increment(1);
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
            // Boxed: a read from disk is rare and its future is large, and
            // every idle reader's pending receive would otherwise keep room
            // for it.
            Err(older) => return Box::pin(self.read_disk(older.min(upto), max)).await,
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
            crate::metrics_names::hot().replays_from_disk.increment(1);
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
                    self.merged += 1;
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
            self.merged += u64::from(merged);
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
        crate::metrics_names::hot().subscribers.decrement(1.0);
        self.leave_disk();
        let mut st = self.queue.lock();
        st.detached = true;
        self.queue.clear(&mut st);
    }
}
