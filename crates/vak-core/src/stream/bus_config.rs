//! The bus's sizes and byte budgets: `BusConfig`, the queued and retained totals shared by every bus, and the `Charge` for what a reader holds outside its queue.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// See `BusConfig::flush_window`. Off: at 1 000 events/s to 1000 readers a
/// 2 or 5 ms window left the server's CPU where it was (readers that fall
/// behind already take many frames per wake-up) and p99 within run-to-run
/// noise (BENCHMARKS.md); it stays a measured, explicit choice.
pub const DEFAULT_FLUSH_WINDOW: Duration = Duration::ZERO;
/// See `BusConfig::flush_from`.
pub const DEFAULT_FLUSH_FROM: usize = 32;

/// Queued payload bytes across every subscriber of the process.
#[derive(Clone, Debug, Default)]
pub struct QueuedTotal(pub(super) Arc<AtomicUsize>);

impl QueuedTotal {
    pub fn get(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }

    /// Moves the total from `then` to `now` (one queue's bytes before and after).
    pub(super) fn shift(&self, then: usize, now: usize) {
        if now >= then {
            self.0.fetch_add(now - then, Ordering::Relaxed);
        } else {
            self.0.fetch_sub(then - now, Ordering::Relaxed);
        }
    }
}

/// Bytes every session's replay ring holds together, estimated per frame by
/// `retained_cost`.
#[derive(Clone, Debug, Default)]
pub struct RetainedTotal(pub(super) Arc<AtomicUsize>);

impl RetainedTotal {
    pub fn get(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }

    pub(super) fn add(&self, n: usize) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    pub(super) fn sub(&self, n: usize) {
        self.0.fetch_sub(n, Ordering::Relaxed);
    }
}

/// What a frame kept in a ring pins, estimated: its event, the JSON an edge
/// caches on it (about as large again) and the structures around them
/// (measured: a one-token delta costs about 500 bytes of RSS per ring slot).
pub(crate) fn retained_cost(frame: &crate::event::Frame) -> usize {
    2 * frame.size + 320
}

/// A ring trimmed for the shared budget keeps at least this many frames:
/// a reader a little behind still resumes from memory.
pub const MIN_RING: usize = 64;

/// Bytes a reader holds outside its queue (frames taken ahead of its caller,
/// or encoded and not yet written by the edge), counted in its byte budget
/// and the total until dropped: what `--max-queued-mib` bounds is what
/// stalled readers really pin, not only what is queued.
pub struct Charge {
    pub(super) held: Arc<AtomicUsize>,
    pub(super) total: QueuedTotal,
    pub(super) bytes: usize,
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
    /// The most bytes all sessions' rings together may hold (`retained_cost`
    /// per frame): past it, a session that commits trims its own ring's
    /// oldest frames (down to `MIN_RING`); older cursors replay from disk.
    pub max_total_retained_bytes: usize,
    /// The running total behind `max_total_retained_bytes`, shared by every bus.
    pub retained: RetainedTotal,
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
            max_total_retained_bytes: 256 << 20,
            retained: RetainedTotal::default(),
            queue: 1024,
            max_queued_bytes: 16 << 20,
            max_total_queued_bytes: 512 << 20,
            total: QueuedTotal::default(),
            flush_window: DEFAULT_FLUSH_WINDOW,
            flush_from: DEFAULT_FLUSH_FROM,
        }
    }
}
