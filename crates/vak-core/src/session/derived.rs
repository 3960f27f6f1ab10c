//! What a commit feeds besides the bus, all queued and never waited for: a finished run's messages to search, a completed run's shape to the skills thread, and a changed plan to the commitments listing.

use crate::event::{ClientEvent, Frame, RunOutcome};
use crate::log::folds::Folds;
use crate::session::runtime::Runtime;
use std::sync::Arc;

/// Called under the session's folds lock with the frames just folded in:
/// everything here only queues or updates memory.
pub(crate) fn feed(rt: &Runtime, id: &str, f: &mut Folds, frames: &[Arc<Frame>]) {
    // The listing of commitments keeps the whole plan.
    if frames
        .iter()
        .any(|fr| matches!(fr.event, ClientEvent::Commitment { .. }))
    {
        rt.portfolio().put(id, rt.workspace(), f.plan.rows().to_vec());
    }
    let Some(finished) = frames
        .iter()
        .rev()
        .find(|fr| matches!(fr.event, ClientEvent::RunFinished { .. }))
    else {
        return;
    };
    let upto = finished.seq;
    let from = std::mem::replace(&mut f.searched, upto);
    let docs = crate::host::search::docs(&f.transcript, from, upto);
    rt.search().index(id, rt.workspace(), from, upto, docs);
    // A completed run is matched against earlier ones.
    if matches!(
        finished.event,
        ClientEvent::RunFinished {
            outcome: RunOutcome::Completed,
            ..
        }
    ) {
        let shape =
            crate::host::skills::RunShape::from_transcript(id, rt.workspace(), &f.transcript, from, upto);
        rt.skills().observe_later(shape);
    }
}
