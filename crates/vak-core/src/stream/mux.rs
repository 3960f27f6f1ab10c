//! The multiplexer behind `/stream` and the `Stream` RPC: many followed sessions on one stream, one cursor vector for all of them, fair interleaving, follow/unfollow while live.
//!
//! Each followed session is a feed: its own bounded, lossless subscription
//! plus the presenter at the subscription point. Feeds are polled through a
//! `StreamMap`, which starts each poll at a random feed, and each feed hands
//! over at most `BATCH` frames per turn, so one session's burst cannot starve
//! the others. A feed whose queue overflows resumes from its own cursor inside
//! its subscription (the bus does that for every consumer), so a slow
//! connection never loses a frame and never holds more than one queue per session.

use crate::error::{Error, ErrorKind, Result};
use crate::event::Frame;
use crate::host::registry::Registry;
use crate::log::presentation::{PresentationEvent, Presenter};
use crate::reasons::{CloseReason, ResyncReason, Surface};
use crate::session::live::{Client, PresenceGuard, Session};
use crate::stream::cursor::{CursorVector, MAX_SESSIONS};
use crate::stream::delivery::{Delivery, End};
use futures_util::stream::{BoxStream, StreamExt};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_stream::StreamMap;
use tokio_util::sync::CancellationToken;

/// Frames one feed hands over per turn.
const BATCH: usize = 32;

/// What a multiplexed stream carries for one session.
#[derive(Clone, Debug)]
pub enum MuxFrame {
    Agent(Arc<Frame>),
    Presentation(PresentationEvent),
    Resync {
        reason: ResyncReason,
        latest_seq: u64,
        lost: Option<(u64, u64)>,
    },
    Coworking {
        clients: Vec<Client>,
        joined: Vec<Client>,
        left: Vec<Client>,
    },
    Closed {
        reason: CloseReason,
    },
}

#[derive(Clone, Debug)]
pub struct MuxItem {
    pub session_id: String,
    pub frame: MuxFrame,
    /// The cursor vector after this frame, on agent and presentation frames.
    pub cursor: Option<String>,
}

/// The live multiplexed streams by stream id, for follow and unfollow by
/// id; the hub's closing ends them.
pub struct Streams {
    live: Mutex<HashMap<String, mpsc::Sender<Control>>>,
    /// Cancelled once the hub has shut down.
    closing: CancellationToken,
}

impl Streams {
    pub(crate) fn new(closing: CancellationToken) -> Streams {
        Streams {
            live: Mutex::new(HashMap::new()),
            closing,
        }
    }

    fn live(&self) -> MutexGuard<'_, HashMap<String, mpsc::Sender<Control>>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn register(&self, stream_id: &str, control: mpsc::Sender<Control>) {
        self.live().insert(stream_id.to_string(), control);
    }

    fn unregister(&self, stream_id: &str) {
        self.live().remove(stream_id);
    }

    fn control(&self, stream_id: &str) -> Option<mpsc::Sender<Control>> {
        self.live().get(stream_id).cloned()
    }

    /// The stream ids of the live multiplexed streams, sorted.
    pub fn ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.live().keys().cloned().collect();
        ids.sort();
        ids
    }
}

pub enum Control {
    Follow {
        session: Arc<Session>,
        after: Option<u64>,
        reply: oneshot::Sender<Result<Vec<String>>>,
    },
    Unfollow {
        session_id: String,
        reply: oneshot::Sender<Result<Vec<String>>>,
    },
}

struct Feed {
    /// Held so the session stays loaded while it is followed.
    _session: Arc<Session>,
    sub: crate::stream::subscription::Subscription,
    presenter: Presenter,
    /// Frames up to this seq are already in the presenter's state.
    presented_through: u64,
    last_seq: u64,
    presence: watch::Receiver<Vec<Client>>,
    seen: Vec<Client>,
    pending: VecDeque<MuxFrame>,
    done: bool,
    _guard: PresenceGuard,
}

impl Feed {
    fn open(session: Arc<Session>, after: Option<u64>, client_id: &str) -> (Feed, u64) {
        let guard = session.join(client_id, Surface::Stream);
        let presented = session.subscribe_presented(after);
        let latest = presented.subscription.latest_seq();
        let mut presence = session.watch_presence();
        let seen = presence.borrow_and_update().clone();
        let start = after.unwrap_or(latest);
        let mut pending = VecDeque::new();
        pending.push_back(MuxFrame::Presentation(PresentationEvent::Snapshot(
            presented.presenter.timeline().clone(),
        )));
        pending.push_back(MuxFrame::Coworking {
            clients: seen.clone(),
            joined: Vec::new(),
            left: Vec::new(),
        });
        let feed = Feed {
            _session: session,
            // Fairness between sessions counts frames: a take that merged a
            // busy session's whole backlog would hand it all over in one turn.
            sub: presented.subscription.frame_by_frame(),
            presenter: presented.presenter,
            presented_through: latest,
            last_seq: start,
            presence,
            seen,
            pending,
            done: false,
            _guard: guard,
        };
        (feed, start)
    }

    /// The next batch of frames; None once the session closed.
    async fn next_batch(&mut self) -> Option<Vec<MuxFrame>> {
        if self.done {
            return None;
        }
        loop {
            if !self.pending.is_empty() {
                return Some(self.pending.drain(..).collect());
            }
            tokio::select! {
                deliveries = self.sub.recv_many(BATCH) => {
                    let mut out = Vec::with_capacity(deliveries.len());
                    for d in deliveries {
                        match d {
                            Delivery::Frame(f) => {
                                self.last_seq = f.seq;
                                let presented = if f.seq > self.presented_through {
                                    self.presented_through = f.seq;
                                    self.presenter.apply(f.seq, &f.event)
                                } else {
                                    Vec::new()
                                };
                                out.push(MuxFrame::Agent(f));
                                out.extend(presented.into_iter().map(MuxFrame::Presentation));
                            }
                            Delivery::Resync {
                                reason,
                                latest_seq,
                                lost,
                            } => out.push(MuxFrame::Resync {
                                reason,
                                latest_seq,
                                lost,
                            }),
                            Delivery::End(End::Closed(reason)) => {
                                self.done = true;
                                out.push(MuxFrame::Closed { reason });
                            }
                        }
                    }
                    if !out.is_empty() {
                        return Some(out);
                    }
                    if self.done {
                        return None;
                    }
                }
                changed = self.presence.changed() => {
                    if changed.is_err() {
                        continue;
                    }
                    let now = self.presence.borrow_and_update().clone();
                    // Set lookups: a change costs O(clients), not O(clients²).
                    let before: HashSet<&Client> = self.seen.iter().collect();
                    let after: HashSet<&Client> = now.iter().collect();
                    let joined: Vec<Client> = now.iter().filter(|c| !before.contains(c)).cloned().collect();
                    let left: Vec<Client> = self.seen.iter().filter(|c| !after.contains(c)).cloned().collect();
                    self.seen = now.clone();
                    if !joined.is_empty() || !left.is_empty() {
                        return Some(vec![MuxFrame::Coworking { clients: now, joined, left }]);
                    }
                }
            }
        }
    }
}

fn feed_stream(feed: Feed) -> BoxStream<'static, Vec<MuxFrame>> {
    futures_util::stream::unfold(feed, |mut feed| async move {
        let batch = feed.next_batch().await?;
        Some((batch, feed))
    })
    .boxed()
}

/// One multiplexed stream.
pub struct Mux {
    streams: Arc<Streams>,
    stream_id: String,
    cursors: CursorVector,
    feeds: StreamMap<String, BoxStream<'static, Vec<MuxFrame>>>,
    control: mpsc::Receiver<Control>,
    /// Frames taken from feeds but not yet handed out. Cursors move only when
    /// a frame is handed out, so an id never runs ahead of what was delivered.
    pending: VecDeque<(String, MuxFrame)>,
}

impl Mux {
    /// Opens a stream following `sessions` (deduplicated, in order), each
    /// resuming from its entry in `cursor` when it has one, else live.
    /// Sessions named only in the cursor are followed too, so a reconnect
    /// keeps what was followed live. Every session must exist.
    pub async fn open(
        registry: &Registry,
        streams: &Arc<Streams>,
        sessions: &[String],
        cursor: &CursorVector,
    ) -> Result<Mux> {
        let mut order: Vec<&str> = Vec::new();
        for s in sessions.iter().map(String::as_str).chain(cursor.sessions()) {
            if !order.contains(&s) {
                order.push(s);
            }
        }
        if order.len() > MAX_SESSIONS {
            return Err(Error::invalid(format!(
                "a stream follows at most {MAX_SESSIONS} sessions; {} were asked for",
                order.len()
            )));
        }
        let mut loaded = Vec::with_capacity(order.len());
        for s in &order {
            loaded.push(registry.get(s).await?);
        }
        let stream_id = format!("st_{}", uuid::Uuid::new_v4().simple());
        let (tx, rx) = mpsc::channel(16);
        streams.register(&stream_id, tx);
        let mut mux = Mux {
            streams: streams.clone(),
            stream_id,
            cursors: CursorVector::default(),
            feeds: StreamMap::new(),
            control: rx,
            pending: VecDeque::new(),
        };
        for session in loaded {
            let after = cursor.get(session.id());
            mux.follow(session, after);
        }
        Ok(mux)
    }

    pub fn stream_id(&self) -> &str {
        &self.stream_id
    }

    /// The cursor vector as of the frames handed out so far.
    pub fn cursor(&self) -> String {
        self.cursors.to_string()
    }

    fn follow(&mut self, session: Arc<Session>, after: Option<u64>) {
        let id = session.id().to_string();
        // A re-follow replaces the old subscription: none of its frames may follow.
        self.pending.retain(|(sid, _)| *sid != id);
        let (feed, start) = Feed::open(session, after, &self.stream_id);
        self.cursors.set(&id, start);
        self.feeds.insert(id, feed_stream(feed));
    }

    fn followed(&self) -> Vec<String> {
        self.cursors.sessions().map(str::to_string).collect()
    }

    fn control(&mut self, c: Control) {
        match c {
            Control::Follow {
                session,
                after,
                reply,
            } => {
                let known = self.cursors.get(session.id()).is_some();
                let result = if !known && self.cursors.len() >= MAX_SESSIONS {
                    Err(Error::invalid(format!(
                        "a stream follows at most {MAX_SESSIONS} sessions"
                    )))
                } else {
                    // Re-following with a cursor resubscribes from it; without one it is a no-op.
                    if !known || after.is_some() {
                        self.follow(session, after);
                    }
                    Ok(self.followed())
                };
                let _ = reply.send(result);
            }
            Control::Unfollow { session_id, reply } => {
                self.feeds.remove(&session_id);
                self.pending.retain(|(sid, _)| *sid != session_id);
                self.cursors.remove(&session_id);
                let _ = reply.send(Ok(self.followed()));
            }
        }
    }

    /// The next item; None when the server shuts down.
    pub async fn next(&mut self) -> Option<MuxItem> {
        loop {
            if let Some((sid, frame)) = self.pending.pop_front() {
                let cursor = match &frame {
                    MuxFrame::Agent(f) => {
                        self.cursors.set(&sid, f.seq);
                        Some(self.cursors.to_string())
                    }
                    MuxFrame::Presentation(_) => Some(self.cursors.to_string()),
                    _ => None,
                };
                return Some(MuxItem {
                    session_id: sid,
                    frame,
                    cursor,
                });
            }
            tokio::select! {
                biased;
                Some(c) = self.control.recv() => self.control(c),
                Some((sid, batch)) = self.feeds.next(), if !self.feeds.is_empty() => {
                    self.pending.extend(batch.into_iter().map(|frame| (sid.clone(), frame)));
                }
                _ = self.streams.closing.cancelled() => {
                    if self.feeds.is_empty() {
                        return None;
                    }
                    // Sessions close before the hub does: drain their last frames.
                    match tokio::time::timeout(Duration::from_millis(200), self.feeds.next()).await {
                        Ok(Some((sid, batch))) => self.pending.extend(batch.into_iter().map(|frame| (sid.clone(), frame))),
                        _ => return None,
                    }
                }
            }
        }
    }
}

impl Drop for Mux {
    fn drop(&mut self) {
        self.streams.unregister(&self.stream_id);
    }
}

/// Follows or unfollows on a live stream, by its id.
pub async fn control(
    streams: &Streams,
    stream_id: &str,
    make: impl FnOnce(oneshot::Sender<Result<Vec<String>>>) -> Control,
) -> Result<Vec<String>> {
    let tx = streams
        .control(stream_id)
        .ok_or_else(|| Error::not_found(format!("no live stream {stream_id}")))?;
    let (reply, rx) = oneshot::channel();
    tx.send(make(reply))
        .await
        .map_err(|_| Error::not_found(format!("no live stream {stream_id}")))?;
    match tokio::time::timeout(Duration::from_secs(10), rx).await {
        Ok(Ok(r)) => r,
        Ok(Err(_)) => Err(Error::not_found(format!("the stream {stream_id} ended"))),
        Err(_) => Err(Error::new(
            ErrorKind::Unavailable,
            format!("the stream {stream_id} is not being read; try again"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::hub::Hub;
    use crate::session::live::Route;
    use crate::CoreConfig;

    #[tokio::test]
    async fn a_stream_is_reachable_by_its_id_while_it_lives_and_ends_when_the_hub_closes() {
        let home = tempfile::tempdir().unwrap();
        let cfg = CoreConfig::new(home.path().to_path_buf(), home.path().to_path_buf());
        let h = Hub::new(cfg, Route::offline()).unwrap();
        let s = h.sessions().create().await.unwrap();
        let ids = [s.id().to_string()];
        let live = CursorVector::default();
        let mux = Mux::open(h.sessions(), h.streams(), &ids, &live).await.unwrap();
        let gone_id = mux.stream_id().to_string();
        assert_eq!(h.streams().ids(), [gone_id.as_str()]);
        drop(mux);
        assert!(h.streams().ids().is_empty(), "a dropped stream leaves");
        let unfollow = |reply| Control::Unfollow {
            session_id: ids[0].clone(),
            reply,
        };
        let gone = control(h.streams(), &gone_id, unfollow).await.unwrap_err();
        assert_eq!(gone.kind, ErrorKind::NotFound);

        let mut mux = Mux::open(h.sessions(), h.streams(), &ids, &live).await.unwrap();
        drop(s);
        h.shutdown(Duration::from_secs(5)).await;
        let ended = async { while mux.next().await.is_some() {} };
        tokio::time::timeout(Duration::from_secs(10), ended)
            .await
            .expect("the stream ends once the hub has closed");
    }
}
