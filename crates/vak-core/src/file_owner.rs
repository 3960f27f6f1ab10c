//! One owner task for each file (or shared value) the server rewrites, in tokio-console's aggregator style: changes arrive on a bounded queue, each with a reply, and the task alone applies them, one at a time, to the state it holds, so no lock is held across the I/O.
//!
//! A change is a closure over the owner's state that returns a future; the
//! task runs it to completion before it takes the next, which is what makes
//! a read-modify-write of the file safe without a lock: nothing else changes
//! it meanwhile. A caller that stops waiting (its client went away) does not
//! stop its change halfway: the task finishes it and the reply is dropped.
//! When the task is gone (a change panicked, or the runtime is shutting
//! down) every caller gets `OwnerGone` at once, never a hang.

use futures_util::future::BoxFuture;
use std::sync::Mutex;
use tokio::sync::{mpsc, oneshot};

/// Changes queued for one owner beyond which callers wait for room.
pub(crate) const QUEUE: usize = 64;

/// A change as the task runs it (the caller's closure and its reply).
type Job<S> = Box<dyn for<'a> FnOnce(&'a mut S) -> BoxFuture<'a, ()> + Send>;

/// Why a change was not made: its owner's task has stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OwnerGone {
    /// What the owner owns (`FileOwner::new`'s name).
    pub owner: &'static str,
}

impl std::fmt::Display for OwnerGone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the owner of {} has stopped", self.owner)
    }
}

impl From<OwnerGone> for crate::error::Error {
    fn from(g: OwnerGone) -> Self {
        crate::error::Error::internal(g.to_string())
    }
}

/// The handle callers hold; the task holds the state.
pub struct FileOwner<S> {
    name: &'static str,
    tx: mpsc::Sender<Job<S>>,
    /// The task's queue and state until the first change starts it: an
    /// owner may be made at startup, outside the runtime. Taken once, never
    /// held across anything but the take.
    idle: Mutex<Option<(mpsc::Receiver<Job<S>>, S)>>,
}

/// Boxes `f` with the higher-ranked signature a job needs.
fn job<S, F>(f: F) -> Job<S>
where
    F: for<'a> FnOnce(&'a mut S) -> BoxFuture<'a, ()> + Send + 'static,
{
    Box::new(f)
}

impl<S: Send + 'static> FileOwner<S> {
    /// An owner of `state`, named `name` in errors; its task starts with its first change.
    pub fn new(name: &'static str, state: S) -> FileOwner<S> {
        let (tx, rx) = mpsc::channel(QUEUE);
        FileOwner {
            name,
            tx,
            idle: Mutex::new(Some((rx, state))),
        }
    }

    /// Runs `f` on the owner's task with its state, after every change
    /// queued before it; what `f` answers.
    pub async fn change<R, F>(&self, f: F) -> Result<R, OwnerGone>
    where
        R: Send + 'static,
        F: for<'a> FnOnce(&'a mut S) -> BoxFuture<'a, R> + Send + 'static,
    {
        self.start();
        let gone = OwnerGone { owner: self.name };
        let (reply, answer) = oneshot::channel();
        let j = job(move |state: &mut S| {
            Box::pin(async move {
                let _ = reply.send(f(state).await);
            })
        });
        self.tx.send(j).await.map_err(|_| gone)?;
        answer.await.map_err(|_| gone)
    }

    fn start(&self) {
        let idle = self.idle.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some((rx, state)) = idle {
            tokio::spawn(serve(rx, state));
        }
    }
}

/// The owner's task: each change in arrival order, to completion; ends
/// when every handle is dropped.
async fn serve<S>(mut rx: mpsc::Receiver<Job<S>>, mut state: S) {
    while let Some(j) = rx.recv().await {
        j(&mut state).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// A file of one number per line, rewritten whole on every change.
    struct Lines {
        dir: std::path::PathBuf,
    }

    impl Lines {
        async fn add(&mut self, n: u32) -> std::io::Result<()> {
            let dir = self.dir.clone();
            tokio::task::spawn_blocking(move || {
                let mut text = std::fs::read_to_string(dir.join("f")).unwrap_or_default();
                // A slow rewrite: a racing writer would read the old file now.
                std::thread::yield_now();
                text.push_str(&format!("{n}\n"));
                crate::home::write_private_file(&dir, "f", text.as_bytes())
                    .map_err(|e| std::io::Error::other(e.message))
            })
            .await
            .unwrap()
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_changes_are_all_in_the_final_file() {
        let home = tempfile::tempdir().unwrap();
        let owner = Arc::new(FileOwner::new(
            "the test file",
            Lines {
                dir: home.path().to_path_buf(),
            },
        ));
        const N: u32 = 200;
        let tasks: Vec<_> = (0..N)
            .map(|n| {
                let owner = owner.clone();
                tokio::spawn(async move { owner.change(move |f| Box::pin(f.add(n))).await })
            })
            .collect();
        for t in tasks {
            t.await.unwrap().unwrap().unwrap();
        }
        let text = std::fs::read_to_string(home.path().join("f")).unwrap();
        let mut got: Vec<u32> = text.lines().map(|l| l.parse().unwrap()).collect();
        got.sort_unstable();
        assert_eq!(got, (0..N).collect::<Vec<_>>(), "no change is lost");
    }

    #[tokio::test]
    async fn a_caller_of_a_stopped_owner_gets_an_error_not_a_hang() {
        let owner = FileOwner::new("the test state", 0u32);
        // A change that panics ends the task (its reply is dropped).
        let panicked = owner
            .change(|_: &mut u32| -> BoxFuture<'_, ()> { Box::pin(async { panic!("a broken change") }) })
            .await;
        assert_eq!(
            panicked,
            Err(OwnerGone {
                owner: "the test state"
            })
        );
        let after = owner
            .change(|n: &mut u32| {
                Box::pin(async move {
                    *n += 1;
                    *n
                })
            })
            .await;
        assert_eq!(
            after,
            Err(OwnerGone {
                owner: "the test state"
            })
        );
    }

    #[tokio::test]
    async fn changes_run_in_order_on_the_state_the_task_holds() {
        let owner = FileOwner::new("a counter", Vec::<u32>::new());
        for n in 0..5 {
            let seen = owner
                .change(move |v: &mut Vec<u32>| {
                    Box::pin(async move {
                        v.push(n);
                        v.clone()
                    })
                })
                .await
                .unwrap();
            assert_eq!(seen, (0..=n).collect::<Vec<_>>());
        }
    }
}
