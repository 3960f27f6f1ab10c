//! A session whose writer stopped (a storage failure, a fence, a lost lease) is loaded again without waiting for a request, so its interrupted run gets its one terminal event at once.
//!
//! When a writer stops, the live run ends with no `run_finished` (nothing
//! of the failed batch may be shown) and the session's streams end with
//! `session_closed`. A reload settles the run as after a crash
//! (`Session::restore_records` / `restore_in`: expired approvals, failed
//! tool results, `run_finished {outcome: failed}`), and with `--bus` it
//! reaches every replica's readers through the stream. So a stopped
//! session is looked up again as a request would (`Hub::find`), a second
//! after it stopped and then with a doubling wait: here while this replica
//! can still write it (it keeps the lease: a fence by a stale writer, a
//! storage failure that passed), or not at all when another replica holds
//! the lease now (that replica settled the run when it took the session).

use crate::error::ErrorKind;
use crate::host::hub::{Hub, Located};
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;

/// The first wait after a stop (`Hub::find` reloads a session stopped by a
/// storage failure once it has been stopped this long).
const FIRST_WAIT: Duration = Duration::from_millis(1100);
/// The longest wait between two attempts.
const MAX_WAIT: Duration = Duration::from_secs(30);

/// Sends `session`'s id to `stopped` when its writer stops (ends quietly
/// when the session is dropped first).
///
/// `stopped` is unbounded on purpose: each loaded session's watcher sends
/// at most one id per stop, and `run` only spawns per id, so the queue
/// drains as fast as it fills; a bound would only park watchers until
/// `housekeep` starts `run` (never, in a hub that does not housekeep).
pub(crate) fn watch(session: &Arc<crate::session::live::Session>, stopped: mpsc::UnboundedSender<String>) {
    let mut rx = session.watch_stopped();
    let id = session.id().to_string();
    tokio::spawn(async move {
        if rx.wait_for(|s| *s).await.is_ok() {
            let _ = stopped.send(id);
        }
    });
}

/// Recovers every session reported on `stopped`, one task per session at a
/// time, until the hub closes.
pub(crate) async fn run(hub: Arc<Hub>, mut stopped: mpsc::UnboundedReceiver<String>) {
    let recovering = Arc::new(Mutex::new(HashSet::<String>::new()));
    loop {
        let id = tokio::select! {
            id = stopped.recv() => id,
            _ = hub.closed() => None,
        };
        let Some(id) = id else { return };
        // A session stopped again while its recovery runs is that task's.
        if !lock(&recovering).insert(id.clone()) {
            continue;
        }
        let (hub, recovering) = (hub.clone(), recovering.clone());
        tokio::spawn(async move {
            recover(&hub, &id).await;
            lock(&recovering).remove(&id);
        });
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Looks `id` up again until it is written here with a working writer,
/// held by another replica, gone, or the hub stops.
async fn recover(hub: &Hub, id: &str) {
    let mut wait = FIRST_WAIT;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = hub.closed() => return,
        }
        // A request may have reloaded it meanwhile, or found it elsewhere.
        if hub.is_stopping() || !hub.stopped_here(id) {
            return;
        }
        match hub.find(id).await {
            Ok(Located::Local(s)) => {
                // The settling events are durable (or the writer failed again).
                let _ = s.flush().await;
                if s.storage_failure().is_none() {
                    tracing::info!(
                        session = id,
                        latest_seq = s.latest_seq(),
                        "a session whose writer stopped is loaded again; its interrupted run is settled"
                    );
                    return;
                }
            }
            Ok(Located::Remote(owner)) => {
                tracing::info!(session = id, writer = %owner.replica, "a session whose writer stopped here is written by another replica now, which settled its run");
                return;
            }
            Err(e) if e.kind == ErrorKind::NotFound => return,
            Err(e) => tracing::warn!(
                session = id,
                "loading a stopped session again later: {}",
                e.message
            ),
        }
        wait = (wait * 2).min(MAX_WAIT);
    }
}
