//! A session's durable record and what it folds into: the ledger, the one writer, repair on load, replay from disk, delta bounds, and the transcript and presentation projections.

pub(crate) mod appender;
pub(crate) mod deltas;
pub(crate) mod folds;
pub mod ledger;
#[cfg(test)]
pub(crate) mod memory;
pub mod plan;
pub mod presentation;
pub mod receipts;
pub(crate) mod repair;
pub(crate) mod replay;
pub mod transcript;
pub mod verify;
pub(crate) mod writer;
