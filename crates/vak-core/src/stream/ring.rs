//! A session's bus state, shared by its `Bus` and every `Subscription`: the visible seq, the replay ring, the attached queues and the replay cache.

use crate::event::Frame;
use crate::log::ledger::Log;
use crate::log::replay::ReplayCache;
use crate::reasons::CloseReason;
use crate::stream::bus_config::{retained_cost, BusConfig, MIN_RING};
use crate::stream::sub_queue::SubQueue;
use std::collections::VecDeque;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::Notify;

pub(super) struct Shared {
    pub(super) session_id: Arc<str>,
    pub(super) cfg: BusConfig,
    pub(super) log: Option<Arc<dyn Log>>,
    pub(super) inner: Mutex<Inner>,
    pub(super) subscribed: Notify,
    /// What replays from disk have read lately, shared by every subscription.
    pub(super) replay: ReplayCache,
    /// Subscriptions replaying from disk now: once none is, the replay cache
    /// is emptied (a burst of replays does not stay in memory).
    pub(super) on_disk: AtomicUsize,
}

pub(super) struct Inner {
    pub(super) latest: u64,
    pub(super) ring: VecDeque<Arc<Frame>>,
    /// What `ring` counts in `BusConfig::retained` (`retained_cost` of each frame).
    pub(super) ring_bytes: usize,
    pub(super) subs: Vec<Arc<SubQueue>>,
    pub(super) closed: Option<CloseReason>,
    /// When the subscribers were last woken together (see `flush_window`).
    pub(super) last_wake: Option<tokio::time::Instant>,
    /// A wake-up at the end of the current window is scheduled.
    pub(super) wake_due: bool,
    /// Ranges of seqs the ledger lost, oldest first (bounded by `repair`).
    pub(super) lost: Vec<(u64, u64)>,
}

impl Shared {
    pub(super) fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Appends committed frames to the ring: at most `cfg.ring` frames, and
    /// while every ring together is over `cfg.max_total_retained_bytes`,
    /// this one gives up its oldest down to `MIN_RING`.
    pub(super) fn retain(&self, inner: &mut Inner, frames: &[Arc<Frame>]) {
        let (cfg, total) = (&self.cfg, &self.cfg.retained);
        let before = inner.ring_bytes;
        for frame in frames {
            if inner.ring.len() == cfg.ring {
                if let Some(old) = inner.ring.pop_front() {
                    inner.ring_bytes -= retained_cost(&old);
                }
            }
            inner.ring_bytes += retained_cost(frame);
            inner.ring.push_back(frame.clone());
        }
        total.add(inner.ring_bytes);
        total.sub(before);
        while total.get() > cfg.max_total_retained_bytes && inner.ring.len() > MIN_RING {
            if let Some(old) = inner.ring.pop_front() {
                let cost = retained_cost(&old);
                inner.ring_bytes -= cost;
                total.sub(cost);
            }
        }
    }
}

impl Drop for Shared {
    /// An unloaded session's ring leaves the shared total.
    fn drop(&mut self) {
        let bytes = self.lock().ring_bytes;
        self.cfg.retained.sub(bytes);
    }
}
