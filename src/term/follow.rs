//! Following a session's events across connection loss: the follower keeps the last seq it delivered and reopens the stream after it, so nothing is missed or repeated.

use super::conn::{Failure, Transport};
use crate::proto::v1 as pb;
use futures_util::StreamExt;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// What the follower hands its consumer, in order.
#[derive(Debug)]
pub enum Update {
    /// Every frame the server sent, stream-level ones (stream_opened, resync,
    /// session_closed) included, minus any seq already delivered.
    Event(pb::Event),
    /// The stream broke (or the server is away); the follower is reopening it.
    Reconnecting(String),
    /// Retrying cannot help (unknown session, bad token), or `give_up` passed.
    Fatal(Failure),
}

pub struct Follower {
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
pub fn follow(
    conn: Arc<dyn Transport>,
    session_id: String,
    after: Option<u64>,
    give_up: Option<Duration>,
) -> Follower {
    let (tx, rx) = mpsc::channel(256);
    let task = tokio::spawn(run(conn, session_id, after, give_up, tx));
    Follower { updates: rx, task }
}

/// The transcript after a resync, with the seq it reflects: frames up to that
/// seq are in it, later frames are not. The transcript does not say which seq
/// it reflects, so it is read between two looks at the session's latest seq;
/// when both agree nothing was published in between and the answer is exact.
/// A session that keeps publishing gets a few tries, then the later look,
/// which errs towards skipping a frame rather than showing one twice.
/// Also returns the session summary of the later look (is a run in flight?).
pub async fn transcript_at(
    conn: &Arc<dyn Transport>,
    sid: &str,
) -> Result<(pb::Transcript, pb::SessionSummary), Failure> {
    let mut before = conn.attach(sid).await?.latest_seq;
    for _ in 0..5 {
        let t = conn.transcript(sid).await?;
        let after = conn.attach(sid).await?;
        if after.latest_seq == before {
            return Ok((t, after));
        }
        before = after.latest_seq;
    }
    let t = conn.transcript(sid).await?;
    let after = conn.attach(sid).await?;
    Ok((t, after))
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
    // a replay that overlaps what we saw is cut here. Only a resync resets it:
    // the frames after a resync follow the server's numbering, whatever ours was.
    let mut floor = cursor.unwrap_or(0);
    loop {
        let why = match conn.subscribe(&sid, cursor).await {
            Err(f) if !f.is_transient() => {
                let _ = tx.send(Update::Fatal(f)).await;
                return;
            }
            Err(f) => f.message,
            Ok(mut events) => loop {
                match events.next().await {
                    None => break "the server ended the stream".to_string(),
                    Some(Err(f)) if !f.is_transient() => {
                        let _ = tx.send(Update::Fatal(f)).await;
                        return;
                    }
                    Some(Err(f)) => break f.message,
                    Some(Ok(e)) => {
                        match &e.kind {
                            Some(pb::event::Kind::StreamOpened(_)) => {
                                delay = FIRST_DELAY;
                                failing_since = None;
                            }
                            Some(pb::event::Kind::Resync(_)) => floor = 0,
                            _ => {}
                        }
                        if e.seq > 0 {
                            if e.seq <= floor {
                                continue;
                            }
                            floor = e.seq;
                            cursor = Some(e.seq);
                        }
                        if tx.send(Update::Event(e)).await.is_err() {
                            return;
                        }
                    }
                }
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
