//! The ledger appends of every session on a few long-lived threads fed by one queue: while they are busy a new append waits in the queue without waking a thread, where a blocking-pool task per append woke one (or started one) for every batch of every session.
//!
//! Only appends that finish in a `write` go here (`Log::append_waits`
//! says which): an append that waits on a disk flush or a network round
//! trip would hold a thread of this small pool and stall every other
//! session's, so those keep a blocking-pool thread each.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, LazyLock, Mutex, PoisonError};

/// The threads. Two cores' worth of `write`s at a delta per batch keep two
/// busy at most; four leave room for a slow disk without a thread per session.
const THREADS: usize = 4;

type Job = Box<dyn FnOnce() + Send>;

struct Queue {
    jobs: Mutex<VecDeque<Job>>,
    ready: Condvar,
}

static QUEUE: LazyLock<Arc<Queue>> = LazyLock::new(|| {
    let q = Arc::new(Queue {
        jobs: Mutex::new(VecDeque::new()),
        ready: Condvar::new(),
    });
    for i in 0..THREADS {
        let q = q.clone();
        std::thread::Builder::new()
            .name(format!("vak-append-{i}"))
            .spawn(move || loop {
                let job = next(&q);
                job();
            })
            .expect("the appender threads start");
    }
    q
});

/// Waits for the next job; the queue is held only to take it.
fn next(q: &Queue) -> Job {
    let mut jobs = q.jobs.lock().unwrap_or_else(PoisonError::into_inner);
    loop {
        if let Some(job) = jobs.pop_front() {
            return job;
        }
        jobs = q.ready.wait(jobs).unwrap_or_else(PoisonError::into_inner);
    }
}

/// Queues `f` for an appender thread now; its result comes through the
/// returned receiver (an error if `f` panicked).
pub(crate) fn submit<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> tokio::sync::oneshot::Receiver<Result<T, Panicked>> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let job: Job = Box::new(move || {
        // A panic is caught here so the thread lives on; the caller sees it.
        let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        let _ = tx.send(out.map_err(|_| Panicked));
    });
    let q = &*QUEUE;
    q.jobs
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push_back(job);
    q.ready.notify_one();
    rx
}

#[cfg(test)]
async fn run<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, Panicked> {
    submit(f).await.unwrap_or(Err(Panicked))
}

/// An append job panicked.
#[derive(Debug)]
pub(crate) struct Panicked;

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn jobs_run_and_a_panic_is_an_error_not_a_lost_thread() {
        assert_eq!(run(|| 41 + 1).await.unwrap(), 42);
        assert!(run(|| -> u32 { panic!("boom") }).await.is_err());
        // More panics than threads: the threads survive and still serve.
        for _ in 0..THREADS + 1 {
            assert!(run(|| -> u32 { panic!("boom") }).await.is_err());
        }
        let all = futures_util::future::join_all((0..100u32).map(|i| run(move || i * 2))).await;
        let got: Vec<u32> = all.into_iter().map(Result::unwrap).collect();
        assert_eq!(got, (0..100u32).map(|i| i * 2).collect::<Vec<_>>());
    }
}
