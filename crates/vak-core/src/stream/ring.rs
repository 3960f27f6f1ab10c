//! A session's bus state, shared by its `Bus` and every `Subscription`: the visible seq, the replay ring, the attached queues and the replay cache.

use crate::event::Frame;
use crate::log::ledger::Log;
use crate::log::replay::ReplayCache;
use crate::reasons::CloseReason;
use crate::stream::bus_config::BusConfig;
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
}
