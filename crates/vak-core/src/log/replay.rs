//! Decoded ledger chunks shared by the subscriptions of one session that replay from disk, so a thousand lagging readers parse each event once, not a thousand times.

use crate::event::Frame;
use crate::log::ledger::Log;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::watch;

/// Events per chunk: chunk `i` holds seqs `i * CHUNK + 1 ..= (i + 1) * CHUNK`.
pub(crate) const CHUNK: u64 = 512;
/// Chunks kept, most recently used last.
const MAX_CHUNKS: usize = 16;
/// Payload bytes kept across the chunks (the newest chunk is kept whatever its size).
const MAX_BYTES: usize = 32 << 20;

pub(crate) type Chunk = Arc<[Arc<Frame>]>;

/// A chunk's read: None while it runs, then its outcome (a chunk with its
/// payload bytes, summed once: every ask weighs the cached chunks).
type Read = Option<Result<(Chunk, usize), String>>;

/// One cached chunk. The read runs in a task of its own, not in the future
/// of the subscription that asked first: that future is polled only while
/// its client's transport has room, so a stalled client (an HTTP/2 stream
/// out of window) would otherwise hold every other reader of the session at
/// this chunk for as long as it stays stalled.
struct Entry {
    index: u64,
    read: watch::Receiver<Read>,
}

#[derive(Default)]
pub(crate) struct ReplayCache {
    entries: Mutex<VecDeque<Entry>>,
}

impl ReplayCache {
    fn lock(&self) -> MutexGuard<'_, VecDeque<Entry>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Chunks cached now.
    #[cfg(test)]
    pub(crate) fn cached_chunks(&self) -> usize {
        self.lock().len()
    }

    /// Forgets every cached chunk (reads under way still answer their waiters).
    pub(crate) fn clear(&self) {
        *self.lock() = VecDeque::new();
    }

    /// The frames of chunk `index`, read from `log` off the runtime once for
    /// every subscription that asks while it is cached (those asking at the
    /// same time wait for the one read).
    pub(crate) async fn chunk(
        &self,
        index: u64,
        log: &Arc<dyn Log>,
        session_id: &Arc<str>,
    ) -> Result<Chunk, String> {
        let mut read = {
            let mut entries = self.lock();
            match entries.iter().position(|e| e.index == index) {
                Some(pos) => {
                    let entry = entries.remove(pos).expect("position is in range");
                    let read = entry.read.clone();
                    entries.push_back(entry);
                    read
                }
                None => {
                    let read = spawn_read(index, log.clone(), session_id.clone());
                    entries.push_back(Entry {
                        index,
                        read: read.clone(),
                    });
                    if entries.len() > MAX_CHUNKS {
                        entries.pop_front();
                    }
                    read
                }
            }
        };
        let done = match read.wait_for(Option::is_some).await {
            Ok(done) => done.clone().expect("waited for Some").map(|(chunk, _)| chunk),
            Err(_) => Err("the ledger read ended without an answer".to_string()),
        };
        let mut entries = self.lock();
        let keep = matches!(&done, Ok(c) if c.len() == CHUNK as usize);
        if !keep {
            // A failed read, or the tail not all written yet: read it again next time.
            entries.retain(|e| !e.read.same_channel(&read));
        }
        let mut bytes: usize = entries.iter().map(|e| size(&e.read.borrow())).sum();
        while bytes > MAX_BYTES && entries.len() > 1 {
            if let Some(e) = entries.pop_front() {
                bytes -= size(&e.read.borrow());
            }
        }
        done
    }
}

/// Starts reading chunk `index` on the blocking pool; the receiver sees the outcome.
fn spawn_read(index: u64, log: Arc<dyn Log>, sid: Arc<str>) -> watch::Receiver<Read> {
    let (tx, rx) = watch::channel(None);
    tokio::spawn(async move {
        let read = tokio::task::spawn_blocking(move || log.read_events(index * CHUNK, CHUNK as usize))
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|e| e.message))
            .map(|events| {
                let chunk = events
                    .into_iter()
                    .map(|(seq, event)| Arc::new(Frame::new(seq, sid.clone(), event)))
                    .collect::<Chunk>();
                let bytes = chunk.iter().map(|f| f.size).sum();
                (chunk, bytes)
            });
        tx.send_replace(Some(read));
    });
    rx
}

fn size(read: &Read) -> usize {
    match read {
        Some(Ok((_, bytes))) => *bytes,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::ClientEvent;
    use crate::log::ledger::{Batch, Log};
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A log of `n` text deltas that counts its reads; a read waits while
    /// the test holds `gate`.
    struct Counted {
        n: u64,
        reads: AtomicUsize,
        gate: std::sync::Mutex<()>,
    }

    impl Counted {
        fn new(n: u64) -> Self {
            Counted {
                n,
                reads: AtomicUsize::new(0),
                gate: std::sync::Mutex::new(()),
            }
        }
    }

    impl Log for Counted {
        fn append(&self, _: &Batch) -> std::io::Result<()> {
            unreachable!("replay only reads")
        }
        fn read_events(&self, after: u64, max: usize) -> crate::error::Result<Vec<(u64, ClientEvent)>> {
            self.reads.fetch_add(1, Ordering::SeqCst);
            drop(self.gate.lock());
            Ok((after + 1..=self.n.min(after + max as u64))
                .map(|s| {
                    (
                        s,
                        ClientEvent::TextDelta {
                            text: format!("t{s} "),
                        },
                    )
                })
                .collect())
        }
        fn durable_seq(&self) -> u64 {
            self.n
        }
        fn sync(&self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// The bench's replay scenario hung here: a stalled gRPC subscriber (its
    /// HTTP/2 stream out of window, so its future is never polled again)
    /// had started the read of a chunk, and its session's other reader
    /// waited for that read forever.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_reader_that_is_never_polled_again_does_not_hold_up_the_others() {
        let counted = Arc::new(Counted::new(2000));
        let log: Arc<dyn Log> = counted.clone();
        let cache = Arc::new(ReplayCache::default());
        let sid: Arc<str> = Arc::from("s");
        let mut stalled = Box::pin(cache.chunk(1, &log, &sid));
        // The read waits at the gate, so the stalled reader's one poll
        // starts it and cannot finish it, whatever the scheduling.
        let held = counted.gate.lock().unwrap();
        assert!(
            futures_util::FutureExt::now_or_never(stalled.as_mut()).is_none(),
            "the read is held at the gate"
        );
        drop(held);
        let other = tokio::time::timeout(std::time::Duration::from_secs(10), cache.chunk(1, &log, &sid))
            .await
            .expect("the other reader is not held up by the stalled one")
            .unwrap();
        assert_eq!((other[0].seq, other.len()), (513, 512));
        drop(stalled);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn readers_of_the_same_chunk_share_one_read_and_the_unfinished_tail_is_read_again() {
        let counted = Arc::new(Counted::new(1000));
        let log: Arc<dyn Log> = counted.clone();
        let cache = Arc::new(ReplayCache::default());
        let sid: Arc<str> = Arc::from("s");
        let readers: Vec<_> = (0..100)
            .map(|_| {
                let (cache, log, sid) = (cache.clone(), log.clone(), sid.clone());
                tokio::spawn(async move { cache.chunk(0, &log, &sid).await.unwrap() })
            })
            .collect();
        for r in readers {
            let chunk = r.await.unwrap();
            assert_eq!(chunk.len(), 512);
            assert_eq!((chunk[0].seq, chunk[511].seq), (1, 512));
        }
        assert_eq!(
            counted.reads.load(Ordering::SeqCst),
            1,
            "one read for 100 readers"
        );
        // Chunk 1 holds 488 of its 512 events so far: not kept.
        assert_eq!(cache.chunk(1, &log, &sid).await.unwrap().len(), 488);
        cache.chunk(1, &log, &sid).await.unwrap();
        assert_eq!(counted.reads.load(Ordering::SeqCst), 3);
    }
}
