//! Decoded ledger chunks shared by the subscriptions of one session that replay from disk, so a thousand lagging readers parse each event once, not a thousand times.

use super::event::Frame;
use super::ledger::Log;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::OnceCell;

/// Events per chunk: chunk `i` holds seqs `i * CHUNK + 1 ..= (i + 1) * CHUNK`.
pub const CHUNK: u64 = 512;
/// Chunks kept, most recently used last.
const MAX_CHUNKS: usize = 16;
/// Payload bytes kept across the chunks (the newest chunk is kept whatever its size).
const MAX_BYTES: usize = 32 << 20;

pub type Chunk = Arc<[Arc<Frame>]>;

type Cell = Arc<OnceCell<Chunk>>;

#[derive(Default)]
pub struct ReplayCache {
    entries: Mutex<VecDeque<(u64, Cell)>>,
}

impl ReplayCache {
    fn lock(&self) -> MutexGuard<'_, VecDeque<(u64, Cell)>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The frames of chunk `index`, read from `log` off the runtime once for
    /// every subscription that asks while it is cached (those asking at the
    /// same time wait for the one read).
    pub async fn chunk(
        &self,
        index: u64,
        log: &Arc<dyn Log>,
        session_id: &Arc<str>,
    ) -> Result<Chunk, String> {
        let cell = {
            let mut entries = self.lock();
            match entries.iter().position(|(i, _)| *i == index) {
                Some(pos) => {
                    let entry = entries.remove(pos).expect("position is in range");
                    let cell = entry.1.clone();
                    entries.push_back(entry);
                    cell
                }
                None => {
                    let cell = Cell::default();
                    entries.push_back((index, cell.clone()));
                    if entries.len() > MAX_CHUNKS {
                        entries.pop_front();
                    }
                    cell
                }
            }
        };
        let read = cell
            .get_or_try_init(|| async {
                let (log, sid) = (log.clone(), session_id.clone());
                let events =
                    tokio::task::spawn_blocking(move || log.read_events(index * CHUNK, CHUNK as usize))
                        .await
                        .map_err(|e| e.to_string())?
                        .map_err(|e| e.message)?;
                Ok::<Chunk, String>(
                    events
                        .into_iter()
                        .map(|(seq, event)| Arc::new(Frame::new(seq, sid.clone(), event)))
                        .collect(),
                )
            })
            .await
            .cloned();
        let mut entries = self.lock();
        let keep = matches!(&read, Ok(c) if c.len() == CHUNK as usize);
        if !keep {
            // A failed read, or the tail not all written yet: read it again next time.
            entries.retain(|(_, c)| !Arc::ptr_eq(c, &cell));
        }
        let mut bytes: usize = entries.iter().filter_map(|(_, c)| c.get()).map(size).sum();
        while bytes > MAX_BYTES && entries.len() > 1 {
            if let Some((_, c)) = entries.pop_front() {
                bytes -= c.get().map_or(0, size);
            }
        }
        read
    }
}

fn size(chunk: &Chunk) -> usize {
    chunk.iter().map(|f| f.size).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::event::ClientEvent;
    use crate::core::ledger::{Batch, Log};
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A log of `n` text deltas that counts its reads.
    struct Counted {
        n: u64,
        reads: AtomicUsize,
    }

    impl Log for Counted {
        fn append(&self, _: &Batch) -> std::io::Result<()> {
            unreachable!("replay only reads")
        }
        fn read_events(&self, after: u64, max: usize) -> crate::error::Result<Vec<(u64, ClientEvent)>> {
            self.reads.fetch_add(1, Ordering::SeqCst);
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

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn readers_of_the_same_chunk_share_one_read_and_the_unfinished_tail_is_read_again() {
        let counted = Arc::new(Counted {
            n: 1000,
            reads: AtomicUsize::new(0),
        });
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
