//! Following a session's events across connection loss: the follower keeps the last seq it delivered and reopens the stream after it, so nothing is missed or repeated; on a resync it stops reading that stream, fetches the transcript and opens a new stream after the transcript's seq.

use super::conn::{Failure, Transport};
use futures_util::StreamExt;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use vak_proto::v1 as pb;

/// What the follower hands its consumer, in order.
#[derive(Debug)]
pub(crate) enum Update {
    /// Every frame the server sent, stream-level ones (stream_opened,
    /// session_closed) included, minus any seq already delivered. A `resync`
    /// frame never comes this way: it becomes `Resynced`.
    Event(pb::Event),
    /// The server could not resume the stream exactly. The follower stopped
    /// reading that stream, fetched the transcript, and continues with a new
    /// stream opened after `transcript.seq`: the consumer shows the transcript
    /// in place of what it had, and the events that follow continue it.
    Resynced(Box<Resync>),
    /// The stream broke (or the server is away); the follower is reopening it.
    Reconnecting(String),
    /// Retrying cannot help (unknown session, bad token), or `give_up` passed.
    Fatal(Failure),
}

/// What a resync hands over: everything up to `transcript.seq`, exactly.
#[derive(Debug)]
pub(crate) struct Resync {
    /// The server's `resync` frame (seq 0), as it came.
    pub event: pb::Event,
    /// The session as of `transcript.seq`; the next events have greater seqs.
    pub transcript: pb::Transcript,
    /// Approvals requested at or before `transcript.seq` and still pending when
    /// the follower looked (the presentation timeline's pending approval items):
    /// their `approval_requested` frames are behind the new stream's start.
    pub pending_approvals: Vec<pb::TimelineItem>,
    /// The runs that finished at or before `transcript.seq` (the timeline's
    /// `final_result` items, in seq order: `seq` is the run_finished's,
    /// `status` its outcome, `text` its message): their `run_finished` frames
    /// are behind the new stream's start too.
    pub finished_runs: Vec<pb::TimelineItem>,
    /// Whether a run was in flight when the follower looked, after the transcript.
    pub busy: bool,
}

pub(crate) struct Follower {
    pub updates: mpsc::Receiver<Update>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Follower {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Follows `session_id` from `after` (None: live only). `give_up`: how long
/// the server may stay unreachable before the follower stops trying.
pub(crate) fn follow(
    conn: Arc<dyn Transport>,
    session_id: String,
    after: Option<u64>,
    give_up: Option<Duration>,
) -> Follower {
    let (tx, rx) = mpsc::channel(256);
    let task = tokio::spawn(run(conn, session_id, after, give_up, tx));
    Follower { updates: rx, task }
}

/// The transcript a resync hands over, with the approvals still pending and
/// the runs finished at its seq, and whether a run is going on. The
/// transcript says which seq it is exact as of (`seq`); approvals and run ends
/// come from the presentation timeline, read afterwards, keeping the items of
/// seqs up to the transcript's (later ones arrive on the new stream).
async fn fetch_resync(conn: &Arc<dyn Transport>, sid: &str, event: pb::Event) -> Result<Resync, Failure> {
    let transcript = conn.transcript(sid).await?;
    let timeline = conn.presentation(sid).await?;
    let summary = conn.attach(sid).await?;
    let (mut pending_approvals, mut finished_runs) = (Vec::new(), Vec::new());
    for i in timeline.items.into_iter().filter(|i| i.seq <= transcript.seq) {
        match (i.kind(), i.status()) {
            (pb::ItemKind::Approval, pb::ItemStatus::Pending) => pending_approvals.push(i),
            (pb::ItemKind::FinalResult, _) => finished_runs.push(i),
            _ => {}
        }
    }
    finished_runs.sort_by_key(|i| i.seq);
    Ok(Resync {
        event,
        transcript,
        pending_approvals,
        finished_runs,
        busy: summary.busy,
    })
}

async fn run(
    conn: Arc<dyn Transport>,
    sid: String,
    mut cursor: Option<u64>,
    give_up: Option<Duration>,
    tx: mpsc::Sender<Update>,
) {
    const FIRST_DELAY: Duration = Duration::from_millis(100);
    let mut delay = FIRST_DELAY;
    let mut failing_since: Option<Instant> = None;
    // Frames at or below this seq were delivered already. Seqs only grow, so
    // a replay that overlaps what we saw is cut here. A resync sets it to the
    // transcript's seq (lower than before for a cursor that was ahead).
    let mut floor = cursor.unwrap_or(0);
    // A resync whose transcript is still to be fetched (a failed fetch is retried).
    let mut resync: Option<pb::Event> = None;
    loop {
        let why = match resync.take() {
            Some(event) => match fetch_resync(&conn, &sid, event.clone()).await {
                Ok(r) => {
                    cursor = Some(r.transcript.seq);
                    floor = r.transcript.seq;
                    if tx.send(Update::Resynced(Box::new(r))).await.is_err() {
                        return;
                    }
                    continue;
                }
                Err(f) if !f.is_transient() => {
                    let _ = tx.send(Update::Fatal(f)).await;
                    return;
                }
                Err(f) => {
                    resync = Some(event);
                    f.message
                }
            },
            None => match read(&conn, &sid, &mut cursor, &mut floor, &tx).await {
                Cut::Gone => return,
                Cut::Fatal(f) => {
                    let _ = tx.send(Update::Fatal(f)).await;
                    return;
                }
                Cut::Resync(event) => {
                    // Straight to the transcript: the server is answering.
                    delay = FIRST_DELAY;
                    failing_since = None;
                    resync = Some(event);
                    continue;
                }
                Cut::Opened(why) => {
                    delay = FIRST_DELAY;
                    failing_since = None;
                    why
                }
                Cut::Lost(why) => why,
            },
        };
        let since = *failing_since.get_or_insert_with(Instant::now);
        if let Some(limit) = give_up {
            if since.elapsed() >= limit {
                let msg = format!("the server was unreachable for {}s: {why}", limit.as_secs());
                let _ = tx.send(Update::Fatal(Failure::transient(msg))).await;
                return;
            }
        }
        if tx.send(Update::Reconnecting(why)).await.is_err() {
            return;
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(2));
    }
}

/// How reading one stream ended.
enum Cut {
    /// The consumer is gone.
    Gone,
    Fatal(Failure),
    /// The server sent a resync: nothing more is read from that stream.
    Resync(pb::Event),
    /// The stream opened, then broke (why).
    Opened(String),
    /// It broke, or never opened (why).
    Lost(String),
}

/// Opens the stream after `cursor` and hands its frames over, moving `cursor`
/// and `floor`, until it ends.
async fn read(
    conn: &Arc<dyn Transport>,
    sid: &str,
    cursor: &mut Option<u64>,
    floor: &mut u64,
    tx: &mpsc::Sender<Update>,
) -> Cut {
    let mut events = match conn.subscribe(sid, *cursor).await {
        Err(f) if !f.is_transient() => return Cut::Fatal(f),
        Err(f) => return Cut::Lost(f.message),
        Ok(events) => events,
    };
    let mut opened = false;
    let lost = |opened: bool, why: String| if opened { Cut::Opened(why) } else { Cut::Lost(why) };
    loop {
        let e = match events.next().await {
            None => return lost(opened, "the server ended the stream".to_string()),
            Some(Err(f)) if !f.is_transient() => return Cut::Fatal(f),
            Some(Err(f)) => return lost(opened, f.message),
            Some(Ok(e)) => e,
        };
        match &e.kind {
            Some(pb::event::Kind::StreamOpened(_)) => opened = true,
            // Nothing after a resync is read from this stream: frames merged
            // under backpressure carry only their last seq, so what follows
            // cannot be lined up with a transcript exactly.
            Some(pb::event::Kind::Resync(_)) => return Cut::Resync(e),
            _ => {}
        }
        if e.seq > 0 {
            if e.seq <= *floor {
                continue;
            }
            *floor = e.seq;
            *cursor = Some(e.seq);
        }
        if tx.send(Update::Event(e)).await.is_err() {
            return Cut::Gone;
        }
    }
}
