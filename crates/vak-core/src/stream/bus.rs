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
//!
//! The bus in parts: `bus_config` (sizes and the byte budget), `ring` (the
//! state the bus and its subscriptions share), `sub_queue` (a subscriber's
//! queue and the merging of its deltas), `subscription` (a reader's lazy
//! replay, live queue and resume) and `delivery` (what a reader gets).

use crate::event::Frame;
use crate::log::ledger::Log;
use crate::log::replay::ReplayCache;
use crate::reasons::CloseReason;
use crate::stream::bus_config::BusConfig;
use crate::stream::delivery::End;
use crate::stream::ring::{Inner, Shared};
use crate::stream::subscription::{subscribe_holding, Subscription};
use std::collections::VecDeque;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;

pub(crate) struct Bus {
    shared: Arc<Shared>,
}

impl Bus {
    /// A bus whose latest seq is `latest`, with `retained` (oldest first)
    /// already in the ring, replaying older cursors from `log`.
    pub(crate) fn new(
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
        let shared = Arc::new(Shared {
            session_id,
            log,
            inner: Mutex::new(Inner {
                latest,
                ring: VecDeque::new(),
                ring_bytes: 0,
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
        });
        let kept: Vec<Arc<Frame>> = retained.into_iter().skip(skip).collect();
        shared.retain(&mut shared.lock(), &kept);
        Bus { shared }
    }

    pub(crate) fn session_id(&self) -> &Arc<str> {
        &self.shared.session_id
    }

    /// The highest seq visible so far (0: none).
    pub(crate) fn latest_seq(&self) -> u64 {
        self.shared.lock().latest
    }

    /// Makes durable frames visible: retained for replay and handed to every
    /// subscriber. Frames come numbered, in order, each one after the last.
    pub(crate) fn commit(&self, frames: Vec<Arc<Frame>>) {
        if frames.is_empty() {
            return;
        }
        // Once per commit, never per subscriber.
        crate::metrics_names::hot()
            .published
            .increment(frames.len() as u64);
        let mut inner = self.shared.lock();
        if let Some(last) = frames.last() {
            inner.latest = last.seq;
        }
        self.shared.retain(&mut inner, &frames);
        let wake = self.wake_now(&mut inner);
        let mut merged = 0;
        inner.subs.retain(|q| q.offer(&frames, wake, &mut merged));
        if merged > 0 {
            crate::metrics_names::hot().merges.increment(merged);
        }
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
    pub(crate) fn subscribe(&self, after: Option<u64>) -> Subscription {
        subscribe(&self.shared, after)
    }

    /// How many subscriptions are attached right now.
    pub(crate) fn subscriber_count(&self) -> usize {
        let mut inner = self.shared.lock();
        inner.subs.retain(|q| q.is_attached());
        inner.subs.len()
    }

    /// Waits up to `timeout` for a first subscriber, returning at once when
    /// somebody is already watching.
    pub(crate) async fn wait_for_subscriber(&self, timeout: Duration) {
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
    pub(crate) fn note_lost(&self, lost: Vec<(u64, u64)>) {
        self.shared.lock().lost = lost;
    }

    /// Ends every subscription with `End::Closed(reason)`; later subscribers end at once.
    pub(crate) fn close(&self, reason: CloseReason) {
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

#[cfg(test)]
mod tests;
