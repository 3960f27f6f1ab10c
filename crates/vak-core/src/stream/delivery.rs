//! What a subscription yields: frames, resyncs and its end.

use crate::event::Frame;
use crate::reasons::{CloseReason, ResyncReason};
use std::sync::Arc;

/// Why a subscription ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum End {
    /// The session was closed (server shutdown, storage failure); the reason says why.
    Closed(CloseReason),
}

/// One item a subscription yields, in order: replayed frames, live frames,
/// and finally at most one end. A resync comes first when the cursor is
/// ahead of the session, or wherever history the cursor needs is missing.
#[derive(Clone, Debug)]
pub enum Delivery {
    /// `lost`: the range of seqs the ledger lost (`Record::Lost`) that the
    /// cursor falls in, with reason `history_lost`.
    Resync {
        reason: ResyncReason,
        latest_seq: u64,
        lost: Option<(u64, u64)>,
    },
    Frame(Arc<Frame>),
    End(End),
}
