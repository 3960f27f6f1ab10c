//! The per-session event bus: gap-free seq numbering, a replay ring, and one bounded, lossless queue per subscriber.
//!
//! `publish` never blocks on a subscriber. Each subscriber owns a queue of at
//! most `queue` frames and `max_queued_bytes` of payload; when the frame count
//! is reached, consecutive deltas of one kind merge (the merged frame carries
//! the last seq), and if that still frees no room, or the byte budget is spent,
//! the subscriber is ended with `End::Lagged`: it has been handed every frame up
//! to its last delivered seq and resumes by subscribing again with that cursor.

use super::event::{ClientEvent, Frame};
use super::ledger::Ledger;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::Notify;

/// Sizes that bound the memory one session and one subscriber can hold.
#[derive(Clone, Debug)]
pub struct BusConfig {
    /// Frames retained for replay.
    pub ring: usize,
    /// Frames a subscriber may have queued before merging or lag kicks in.
    pub queue: usize,
    /// The most payload bytes (merged or not) a subscriber may have queued:
    /// the memory bound of a stalled client.
    pub max_queued_bytes: usize,
}

impl Default for BusConfig {
    fn default() -> Self {
        BusConfig {
            ring: 1024,
            queue: 1024,
            max_queued_bytes: 16 << 20,
        }
    }
}

/// Why a subscription ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum End {
    /// The session was closed (server shutdown); the reason says why.
    Closed(String),
    /// The subscriber fell too far behind; reconnect with the last seq seen.
    Lagged,
}

/// One item a subscription yields, in order: an optional resync, the replayed
/// frames, live frames, and finally at most one end.
#[derive(Clone, Debug)]
pub enum Delivery {
    Resync { reason: String, latest_seq: u64 },
    Frame(Arc<Frame>),
    End(End),
}

pub struct Bus {
    session_id: Arc<str>,
    cfg: BusConfig,
    ledger: Option<Arc<Ledger>>,
    inner: Mutex<Inner>,
    subscribed: Notify,
}

struct Inner {
    latest: u64,
    ring: VecDeque<Arc<Frame>>,
    subs: Vec<Arc<SubQueue>>,
    closed: Option<String>,
}

impl Bus {
    /// A bus whose next seq is `latest + 1`, with `retained` (oldest first) already in the ring.
    pub fn new(
        session_id: Arc<str>,
        cfg: BusConfig,
        ledger: Option<Arc<Ledger>>,
        latest: u64,
        retained: Vec<Arc<Frame>>,
    ) -> Self {
        let cfg = BusConfig {
            ring: cfg.ring.max(1),
            queue: cfg.queue.max(2),
            max_queued_bytes: cfg.max_queued_bytes.max(1),
        };
        let skip = retained.len().saturating_sub(cfg.ring);
        Bus {
            session_id,
            ledger,
            inner: Mutex::new(Inner {
                latest,
                ring: retained.into_iter().skip(skip).collect(),
                subs: Vec::new(),
                closed: None,
            }),
            cfg,
            subscribed: Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn session_id(&self) -> &Arc<str> {
        &self.session_id
    }

    /// The highest seq published so far (0: none).
    pub fn latest_seq(&self) -> u64 {
        self.lock().latest
    }

    /// Numbers `event`, persists it, retains it and hands it to every subscriber.
    /// The ledger line is written before any subscriber can see the seq, so a
    /// seq a client has seen is never reused after a crash.
    pub fn publish(&self, event: ClientEvent) -> u64 {
        let mut inner = self.lock();
        inner.latest += 1;
        let frame = Arc::new(Frame::new(inner.latest, self.session_id.clone(), event));
        if let Some(ledger) = &self.ledger {
            if let Err(e) = ledger.append_event(&frame) {
                tracing::error!(session = %self.session_id, seq = frame.seq, "ledger write failed: {e}");
            }
        }
        if inner.ring.len() == self.cfg.ring {
            inner.ring.pop_front();
        }
        inner.ring.push_back(frame.clone());
        inner.subs.retain(|q| q.offer(&frame));
        frame.seq
    }

    /// Subscribes: `after` None means live frames only; Some(n) replays every
    /// retained frame with seq > n first, or a resync plus the whole ring when
    /// n is older than the ring or ahead of the session.
    pub fn subscribe(&self, after: Option<u64>) -> Subscription {
        let mut inner = self.lock();
        let latest = inner.latest;
        let first_retained = inner.ring.front().map_or(latest + 1, |f| f.seq);
        let mut replay = VecDeque::new();
        if let Some(n) = after {
            let resync = if n > latest {
                Some("cursor_ahead")
            } else if n.saturating_add(1) < first_retained {
                Some("cursor_too_old")
            } else {
                None
            };
            if let Some(reason) = resync {
                replay.push_back(Delivery::Resync {
                    reason: reason.to_string(),
                    latest_seq: latest,
                });
            }
            let from = if resync.is_some() { 0 } else { n };
            replay.extend(
                inner
                    .ring
                    .iter()
                    .filter(|f| f.seq > from)
                    .cloned()
                    .map(Delivery::Frame),
            );
        }
        let queue = Arc::new(SubQueue::new(self.cfg.queue, self.cfg.max_queued_bytes));
        match &inner.closed {
            Some(reason) => queue.end(End::Closed(reason.clone())),
            None => inner.subs.push(queue.clone()),
        }
        drop(inner);
        self.subscribed.notify_waiters();
        Subscription {
            latest_seq: latest,
            replay,
            queue,
            done: false,
        }
    }

    /// How many subscriptions are attached right now.
    pub fn subscriber_count(&self) -> usize {
        let mut inner = self.lock();
        inner.subs.retain(|q| q.is_attached());
        inner.subs.len()
    }

    /// Waits up to `timeout` for a first subscriber, returning at once when
    /// somebody is already watching.
    pub async fn wait_for_subscriber(&self, timeout: Duration) {
        let notified = self.subscribed.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if self.subscriber_count() > 0 {
            return;
        }
        let _ = tokio::time::timeout(timeout, notified).await;
    }

    /// Ends every subscription with `End::Closed(reason)`; later subscribers end at once.
    pub fn close(&self, reason: &str) {
        let mut inner = self.lock();
        inner.closed = Some(reason.to_string());
        for q in inner.subs.drain(..) {
            q.end(End::Closed(reason.to_string()));
        }
    }
}

/// A subscriber's bounded queue, shared by the bus (producer) and one `Subscription` (consumer).
struct SubQueue {
    state: Mutex<QueueState>,
    notify: Notify,
    cap: usize,
    budget: usize,
}

struct QueueState {
    frames: VecDeque<Arc<Frame>>,
    /// The summed `Frame::size` of `frames`.
    bytes: usize,
    end: Option<End>,
    detached: bool,
}

impl SubQueue {
    fn new(cap: usize, budget: usize) -> Self {
        SubQueue {
            state: Mutex::new(QueueState {
                frames: VecDeque::new(),
                bytes: 0,
                end: None,
                detached: false,
            }),
            notify: Notify::new(),
            cap,
            budget,
        }
    }

    fn lock(&self) -> MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn is_attached(&self) -> bool {
        let st = self.lock();
        !st.detached && st.end.is_none()
    }

    /// Queues `frame`; false means this subscriber is gone and the bus drops it.
    fn offer(&self, frame: &Arc<Frame>) -> bool {
        let mut guard = self.lock();
        let st = &mut *guard;
        if st.detached || st.end.is_some() {
            return false;
        }
        let fits = st.bytes + frame.size <= self.budget;
        let placed = fits
            && (st.frames.len() < self.cap || merge_into_tail(&mut st.frames, frame) || {
                compact(&mut st.frames);
                st.frames.len() < self.cap || merge_into_tail(&mut st.frames, frame)
            });
        if !placed {
            st.end = Some(End::Lagged);
            drop(guard);
            self.notify.notify_one();
            return false;
        }
        if st.frames.back().is_none_or(|b| b.seq < frame.seq) {
            st.frames.push_back(frame.clone());
        }
        st.bytes += frame.size;
        drop(guard);
        self.notify.notify_one();
        true
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

/// Merges `frame` into `tail` when both are same-kind deltas. A tail that is
/// already this subscriber's own merged frame grows in place; a shared one
/// (still in the ring or other queues) is copied once.
fn merge_into(tail: &mut Arc<Frame>, frame: &Frame) -> bool {
    if tail.event.delta_len().is_none() || frame.event.delta_len().is_none() {
        return false;
    }
    if let Some(own) = Arc::get_mut(tail) {
        return own.absorb(frame);
    }
    let mut copy = Frame::new(tail.seq, tail.session_id.clone(), tail.event.clone());
    let merged = copy.absorb(frame);
    if merged {
        *tail = Arc::new(copy);
    }
    merged
}

/// Merges `frame` into the last queued frame when both are same-kind deltas.
fn merge_into_tail(frames: &mut VecDeque<Arc<Frame>>, frame: &Arc<Frame>) -> bool {
    frames.back_mut().is_some_and(|tail| merge_into(tail, frame))
}

/// Merges every run of consecutive same-kind deltas in the queue. The byte
/// count is left as it was: it over-counts merged frames by their overhead,
/// which only makes the budget stricter until the queue next drains.
fn compact(frames: &mut VecDeque<Arc<Frame>>) {
    let mut out: VecDeque<Arc<Frame>> = VecDeque::with_capacity(frames.len());
    for f in frames.drain(..) {
        if !out.back_mut().is_some_and(|t| merge_into(t, &f)) {
            out.push_back(f);
        }
    }
    *frames = out;
}

/// One subscriber's view of a bus.
pub struct Subscription {
    latest_seq: u64,
    replay: VecDeque<Delivery>,
    queue: Arc<SubQueue>,
    done: bool,
}

impl Subscription {
    /// The session's latest seq when this subscription was made.
    pub fn latest_seq(&self) -> u64 {
        self.latest_seq
    }

    /// The next delivery; None after the end has been delivered.
    pub async fn recv(&mut self) -> Option<Delivery> {
        let mut batch = self.recv_many(1).await;
        batch.pop()
    }

    /// Up to `max` deliveries at once (at least one unless the subscription is
    /// over), so an edge can coalesce what is queued into one write.
    pub async fn recv_many(&mut self, max: usize) -> Vec<Delivery> {
        let max = max.max(1);
        let mut out = Vec::new();
        if self.done {
            return out;
        }
        while out.len() < max {
            match self.replay.pop_front() {
                Some(d) => out.push(d),
                None => break,
            }
        }
        if !out.is_empty() {
            return out;
        }
        loop {
            {
                let mut st = self.queue.lock();
                while out.len() < max {
                    match st.frames.pop_front() {
                        Some(f) => {
                            st.bytes = st.bytes.saturating_sub(f.size);
                            out.push(Delivery::Frame(f));
                        }
                        None => break,
                    }
                }
                if st.frames.is_empty() {
                    // Merged frames were counted part by part: settle the count.
                    st.bytes = 0;
                }
                if out.is_empty() {
                    if let Some(end) = st.end.clone() {
                        self.done = true;
                        return vec![Delivery::End(end)];
                    }
                }
            }
            if !out.is_empty() {
                return out;
            }
            self.queue.notify.notified().await;
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut st = self.queue.lock();
        st.detached = true;
        st.frames.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bus(ring: usize, queue: usize) -> Bus {
        let cfg = BusConfig {
            ring,
            queue,
            max_queued_bytes: 1 << 20,
        };
        Bus::new("s".into(), cfg, None, 0, Vec::new())
    }

    fn text(t: &str) -> ClientEvent {
        ClientEvent::TextDelta { text: t.into() }
    }

    async fn drain(sub: &mut Subscription) -> Vec<Delivery> {
        let mut out = Vec::new();
        loop {
            let batch = tokio::time::timeout(Duration::from_millis(50), sub.recv_many(64)).await;
            match batch {
                Ok(b) if !b.is_empty() => out.extend(b),
                _ => return out,
            }
        }
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
            assert_eq!(b.publish(text(&i.to_string())), i + 1);
        }
        let mut sub = b.subscribe(Some(2));
        assert_eq!(sub.latest_seq(), 5);
        b.publish(text("live"));
        assert_eq!(seqs(&drain(&mut sub).await), vec![3, 4, 5, 6]);
        let mut live = b.subscribe(None);
        b.publish(text("x"));
        assert_eq!(seqs(&drain(&mut live).await), vec![7]);
    }

    #[tokio::test]
    async fn a_cursor_older_than_the_ring_or_ahead_resyncs_then_replays_the_ring() {
        let b = bus(4, 16);
        for _ in 0..10 {
            b.publish(text("x"));
        }
        for (after, reason) in [(2, "cursor_too_old"), (11, "cursor_ahead")] {
            let mut sub = b.subscribe(Some(after));
            let got = drain(&mut sub).await;
            match &got[0] {
                Delivery::Resync {
                    reason: r,
                    latest_seq,
                } => {
                    assert_eq!((r.as_str(), *latest_seq), (reason, 10));
                }
                other => panic!("expected resync, got {other:?}"),
            }
            assert_eq!(seqs(&got), vec![7, 8, 9, 10]);
        }
        // The oldest cursor the ring can still serve exactly: 6 (next is 7).
        let mut sub = b.subscribe(Some(6));
        let got = drain(&mut sub).await;
        assert!(matches!(got[0], Delivery::Frame(_)));
        assert_eq!(seqs(&got), vec![7, 8, 9, 10]);
    }

    #[tokio::test]
    async fn a_full_queue_merges_deltas_losslessly() {
        let b = bus(4, 4);
        let mut sub = b.subscribe(Some(0));
        b.publish(ClientEvent::Status { busy: true });
        let mut expected = String::new();
        for i in 0..1000 {
            let t = format!("t{i} ");
            expected.push_str(&t);
            b.publish(text(&t));
        }
        b.publish(ClientEvent::Status { busy: false });
        let got = drain(&mut sub).await;
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
    async fn a_subscriber_too_far_behind_is_ended_with_what_it_was_given() {
        let b = bus(64, 4);
        let mut sub = b.subscribe(None);
        for i in 0..10 {
            b.publish(ClientEvent::Status { busy: i % 2 == 0 });
        }
        assert_eq!(b.subscriber_count(), 0, "the lagging subscriber was dropped");
        let got = drain(&mut sub).await;
        assert_eq!(seqs(&got), vec![1, 2, 3, 4]);
        assert!(matches!(got.last(), Some(Delivery::End(End::Lagged))));
        // Its cursor resumes exactly.
        let mut again = b.subscribe(Some(4));
        assert_eq!(seqs(&drain(&mut again).await), (5..=10).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn a_stalled_subscriber_holds_at_most_its_byte_budget() {
        let budget = 64 * 1024;
        let cfg = BusConfig {
            ring: 8,
            queue: 16,
            max_queued_bytes: budget,
        };
        let b = Bus::new("s".into(), cfg, None, 0, Vec::new());
        let mut sub = b.subscribe(None);
        let chunk = "x".repeat(1000);
        for _ in 0..1000 {
            b.publish(text(&chunk));
        }
        assert_eq!(b.subscriber_count(), 0, "over budget: dropped, not grown");
        let got = drain(&mut sub).await;
        assert!(matches!(got.last(), Some(Delivery::End(End::Lagged))));
        let held: usize = got
            .iter()
            .map(|d| match d {
                Delivery::Frame(f) => f.event.delta_len().unwrap(),
                _ => 0,
            })
            .sum();
        assert!(held <= budget, "held {held} bytes");
        assert!(held > budget / 2, "the budget is used before lagging ({held})");
    }

    #[tokio::test]
    async fn close_ends_every_subscription() {
        let b = bus(8, 8);
        let mut sub = b.subscribe(None);
        b.publish(text("a"));
        b.close("shutdown");
        let got = drain(&mut sub).await;
        assert_eq!(seqs(&got), vec![1]);
        assert!(matches!(got.last(), Some(Delivery::End(End::Closed(r))) if r == "shutdown"));
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
}
