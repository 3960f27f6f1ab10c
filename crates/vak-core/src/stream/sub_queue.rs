//! A subscriber's bounded, lossless queue (the bus produces, one `Subscription` consumes) and the delta merging that keeps it within its budget.

use crate::event::Frame;
use crate::stream::bus_config::{BusConfig, QueuedTotal};
use crate::stream::delivery::End;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::Notify;

/// The most payload one merged delta frame carries: a client's message
/// limit (gRPC's default is 4 MiB) must never be what ends its stream. Past
/// it the queue fills, is dropped, and its reader resumes from its cursor.
pub(super) const MAX_MERGED: usize = 1 << 20;

/// A subscriber's bounded queue, shared by the bus (producer) and one `Subscription` (consumer).
pub(super) struct SubQueue {
    pub(super) state: Mutex<QueueState>,
    pub(super) notify: Notify,
    pub(super) cap: usize,
    pub(super) budget: usize,
    pub(super) total_budget: usize,
    pub(super) total: QueuedTotal,
    /// What this queue's reader holds outside it (`Charge`), shared with
    /// the queues it resumes into.
    pub(super) held: Arc<AtomicUsize>,
}

pub(super) struct QueueState {
    pub(super) frames: VecDeque<Arc<Frame>>,
    /// The summed `Frame::queued_cost` of `frames`, exactly (counted into `total` too).
    pub(super) bytes: usize,
    pub(super) end: Option<End>,
    /// The bus dropped this queue for lag: its reader resumes from its cursor.
    pub(super) lagged: bool,
    pub(super) detached: bool,
}

impl SubQueue {
    pub(super) fn new(cfg: &BusConfig, held: Arc<AtomicUsize>) -> Self {
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

    pub(super) fn lock(&self) -> MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sets the queue's byte count, keeping the process-wide total in step.
    pub(super) fn set_bytes(&self, st: &mut QueueState, bytes: usize) {
        self.total.shift(st.bytes, bytes);
        st.bytes = bytes;
    }

    /// Empties the queue and returns its bytes to the total.
    pub(super) fn clear(&self, st: &mut QueueState) {
        st.frames = VecDeque::new();
        self.set_bytes(st, 0);
    }

    pub(super) fn is_attached(&self) -> bool {
        let st = self.lock();
        !st.detached && !st.lagged && st.end.is_none()
    }

    /// Queues `frames`, waking the reader if `wake` (otherwise the bus wakes
    /// it at the end of its flush window); false means this queue is gone and
    /// the bus drops it.
    /// Frames merged into others are added to `merged` (the bus counts them
    /// once per commit, not per subscriber).
    pub(super) fn offer(&self, frames: &[Arc<Frame>], wake: bool, merged: &mut u64) -> bool {
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
            if !self.place(st, frame, total, merged) {
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
            crate::metrics_names::hot().lags.increment(1);
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
    fn place(&self, st: &mut QueueState, frame: &Arc<Frame>, total: usize, merged: &mut u64) -> bool {
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
            *merged += 1;
            return true;
        }
        // Merge every run of deltas in the queue (which only ever lowers
        // its bytes), then try once more.
        let before = st.bytes;
        *merged += compact(st);
        let room = room + (before - st.bytes);
        if st.frames.len() < self.cap {
            return self.push(st, frame, room);
        }
        let placed = self.merge_tail(st, frame, room);
        *merged += u64::from(placed);
        placed
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
    pub(super) fn wake_if_pending(&self) {
        if !self.lock().frames.is_empty() {
            self.notify.notify_one();
        }
    }

    pub(super) fn end(&self, end: End) {
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
pub(super) fn merge_into(tail: &mut Arc<Frame>, frame: &Frame, room: usize) -> Option<usize> {
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
/// Returns how many frames it merged away.
fn compact(st: &mut QueueState) -> u64 {
    let before = st.frames.len();
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
    before.saturating_sub(st.frames.len()) as u64
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
