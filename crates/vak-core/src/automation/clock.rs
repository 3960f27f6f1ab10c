//! Where the scheduler reads the time: the system clock, or tokio's (paused in tests).

use jiff::Timestamp;

/// Where the scheduler reads the time.
pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> Timestamp;
}

/// The system's wall clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }
}

/// `start` plus the tokio time elapsed since it was made: tokio's paused
/// time drives it in tests.
#[derive(Clone, Debug)]
pub struct TokioClock {
    start: Timestamp,
    origin: tokio::time::Instant,
}

impl TokioClock {
    pub fn new(start: Timestamp) -> TokioClock {
        TokioClock {
            start,
            origin: tokio::time::Instant::now(),
        }
    }
}

impl Clock for TokioClock {
    fn now(&self) -> Timestamp {
        let elapsed =
            jiff::SignedDuration::try_from(self.origin.elapsed()).unwrap_or(jiff::SignedDuration::MAX);
        self.start.saturating_add(elapsed).unwrap_or(self.start)
    }
}
