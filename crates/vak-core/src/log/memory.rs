//! A `Log` in memory, for unit tests: it keeps its lines in append order and can be told to fail its appends.

use crate::event::ClientEvent;
use crate::log::ledger::{Batch, Log};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

/// A log in memory: its lines in append order (events as their seq, other
/// records as their JSON). Reads find nothing (what is visible is in the
/// bus's ring); an append fails, making nothing readable, once `fail` is set.
#[derive(Default)]
pub(crate) struct MemLog {
    lines: Mutex<Vec<String>>,
    durable: AtomicU64,
    failing: AtomicBool,
}

impl MemLog {
    /// Every append from now on fails as a full disk would.
    pub(crate) fn fail(&self) {
        self.failing.store(true, Ordering::SeqCst);
    }

    /// The lines appended so far.
    pub(crate) fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Log for MemLog {
    fn append(&self, batch: &Batch) -> std::io::Result<()> {
        if self.failing.load(Ordering::SeqCst) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::StorageFull,
                "No space left on device (os error 28)",
            ));
        }
        let mut lines = self.lines.lock().unwrap_or_else(|p| p.into_inner());
        for (seq, line) in batch.records() {
            match seq {
                Some(seq) => {
                    lines.push(format!("event {seq}"));
                    self.durable.store(seq, Ordering::SeqCst);
                }
                None => lines.push(String::from_utf8_lossy(line).into_owned()),
            }
        }
        Ok(())
    }
    fn read_events(&self, _: u64, _: usize) -> crate::error::Result<Vec<(u64, ClientEvent)>> {
        Ok(Vec::new())
    }
    fn durable_seq(&self) -> u64 {
        self.durable.load(Ordering::SeqCst)
    }
    fn sync(&self) -> std::io::Result<()> {
        Ok(())
    }
}
