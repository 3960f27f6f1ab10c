//! A session whose writer stopped (a storage failure, a fence, a lost lease) is loaded again without waiting for a request, so its interrupted run gets its one terminal event at once.
//!
//! When a writer stops, the live run ends with no `run_finished` (nothing
//! of the failed batch may be shown) and the session's streams end with
//! `session_closed`. A reload settles the run as after a crash
//! (`Session::restore_records` / `restore_in`: expired approvals, failed
//! tool results, `run_finished {outcome: failed}`), and with `--bus` it
//! reaches every replica's readers through the stream. So a stopped
//! session is looked up again as a request would (`Registry::find`), a second
//! after it stopped and then with a doubling wait: here while this replica
//! can still write it (it keeps the lease: a fence by a stale writer, a
//! storage failure that passed), or not at all when another replica holds
//! the lease now (that replica settled the run when it took the session).

use crate::error::ErrorKind;
use crate::host::registry::{Located, Registry};
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;

/// The first wait after a stop (`Registry::find` reloads a session stopped by a
/// storage failure once it has been stopped this long).
const FIRST_WAIT: Duration = Duration::from_millis(1100);
/// The longest wait between two attempts.
const MAX_WAIT: Duration = Duration::from_secs(30);

/// Recovers every session reported on `stopped` (the registry reports
/// each session whose writer stops), one task per session at a time, until
/// the hub closes.
pub(crate) async fn run(sessions: Arc<Registry>, mut stopped: mpsc::UnboundedReceiver<String>) {
    let recovering = Arc::new(Mutex::new(HashSet::<String>::new()));
    loop {
        let id = tokio::select! {
            id = stopped.recv() => id,
            _ = sessions.closed() => None,
        };
        let Some(id) = id else { return };
        // A session stopped again while its recovery runs is that task's.
        if !lock(&recovering).insert(id.clone()) {
            continue;
        }
        let (sessions, recovering) = (sessions.clone(), recovering.clone());
        tokio::spawn(async move {
            recover(&sessions, &id).await;
            lock(&recovering).remove(&id);
        });
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Looks `id` up again until it is written here with a working writer,
/// held by another replica, gone, or the hub stops.
async fn recover(sessions: &Registry, id: &str) {
    let mut wait = FIRST_WAIT;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = sessions.closed() => return,
        }
        // A request may have reloaded it meanwhile, or found it elsewhere.
        if sessions.is_stopping() || !sessions.stopped_here(id) {
            return;
        }
        match sessions.find(id).await {
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
