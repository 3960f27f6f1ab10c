//! The commitments of every session behind `GET /commitments`: a cache of what the ledgers' `commitment` events say, kept in memory and in `sessions/commitments.json`, so listing reads no ledger.
//!
//! The ledgers stay the truth. A session hands the cache its whole plan
//! whenever it commits a `commitment` event and when it is loaded
//! (`put`); a thread of its own writes the file (atomically, off every
//! lock) after each change, and once more at shutdown. When the server
//! starts, that thread first reads the file back, trusting it for ledgers
//! not written to since (less a margin, like the session index), and reads
//! a ledger written to later (an unclean stop skipped the save) again for
//! its `commitment` lines; listing waits for that (`wait_loaded`), startup
//! does not. Bounded: at most
//! `MAX_ROWS` commitments in all; past it the sessions changed longest ago
//! are left out of the listing (their ledgers still hold them, and
//! `GET /commitments/:id` still reads them from the session).

use crate::commitment::Commitment;
use crate::event::ClientEvent;
use crate::host::index::{list_ledgers, write_replace};
use crate::log::ledger::Record;
use crate::log::plan::Plan;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::io::{BufRead, Read};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

const FILE: &str = "commitments.json";
const TEMP: &str = "commitments.json.tmp";
const VERSION: u64 = 1;
/// The most commitments the listing keeps, every session together.
pub const MAX_ROWS: usize = 20_000;
/// More than one row takes in the file: a larger file is not ours, and is rebuilt.
const MAX_ROW_BYTES: u64 = 8 * 1024;
/// A ledger modified this long before the file was written, or later, may
/// hold a commitment the file missed (see the session index's margin).
const FRESHNESS_MARGIN: Duration = Duration::from_secs(5);

/// One session's plan as the listing keeps it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub session_id: String,
    /// The workspace the session runs in (its canonical path).
    pub workspace: String,
    pub rows: Vec<Commitment>,
    /// Bumped at every put: which session changed longest ago.
    #[serde(default)]
    touched: u64,
}

#[derive(Serialize, Deserialize)]
struct File {
    version: u64,
    sessions: Vec<Entry>,
}

#[derive(Default)]
struct State {
    entries: HashMap<String, Entry>,
    rows: usize,
    clock: u64,
    generation: u64,
    saved: u64,
}

enum Msg {
    Save,
    Stop,
}

/// The handle sessions and the API use.
pub struct Portfolio {
    dir: Option<PathBuf>,
    state: Arc<Mutex<State>>,
    tx: SyncSender<Msg>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// True once the file and the ledgers written since are read (on the
    /// thread, so a large home does not hold up startup).
    loaded: tokio::sync::watch::Sender<bool>,
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Portfolio {
    /// Starts the thread that loads `dir/commitments.json` and reads again
    /// the ledgers in `dir` written since it was saved, then writes the file
    /// after each change; None (the JetStream log, tests): kept in memory
    /// only, fed by the sessions this server loads.
    pub fn open(dir: Option<&Path>) -> Portfolio {
        let state = Arc::new(Mutex::new(State::default()));
        let (tx, rx) = sync_channel(1);
        let loaded = tokio::sync::watch::channel(dir.is_none()).0;
        let thread = dir.and_then(|dir| {
            let (dir, state, done) = (dir.to_path_buf(), state.clone(), loaded.clone());
            std::thread::Builder::new()
                .name("vak-portfolio".into())
                .spawn(move || {
                    let mut read = State::default();
                    load(&dir, &mut read);
                    {
                        // What sessions put meanwhile is newer than any file or scan.
                        let mut st = lock(&state);
                        for (id, e) in read.entries {
                            if !st.entries.contains_key(&id) {
                                upsert(&mut st, &id, &e.workspace, e.rows);
                            }
                        }
                        st.generation += 1;
                    }
                    done.send_replace(true);
                    saver(&dir, &state, rx)
                })
                .map_err(|e| {
                    loaded.send_replace(true);
                    tracing::error!(
                        "commitments are not listed from before this start: cannot start their thread: {e}"
                    )
                })
                .ok()
        });
        Portfolio {
            dir: dir.map(Path::to_path_buf),
            state,
            tx,
            thread: Mutex::new(thread),
            loaded,
        }
    }

    /// Resolves once what was listed before this start is read back.
    pub async fn wait_loaded(&self) {
        let mut rx = self.loaded.subscribe();
        let _ = rx.wait_for(|l| *l).await;
    }

    /// A session's whole plan, as of its latest commit (never waits: the
    /// file is written by the portfolio's thread).
    pub fn put(&self, session_id: &str, workspace: &str, rows: Vec<Commitment>) {
        {
            let mut st = lock(&self.state);
            upsert(&mut st, session_id, workspace, rows);
        }
        if self.dir.is_some() {
            match self.tx.try_send(Msg::Save) {
                // Full: a save is already due and will copy this change.
                Ok(()) | Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {}
            }
        }
    }

    /// A deleted session's rows leave the listing.
    pub fn remove(&self, session_id: &str) {
        let removed = {
            let mut st = lock(&self.state);
            let e = st.entries.remove(session_id);
            if let Some(e) = &e {
                st.rows -= e.rows.len();
                st.generation += 1;
            }
            e.is_some()
        };
        if removed && self.dir.is_some() {
            let _ = self.tx.try_send(Msg::Save);
        }
    }

    /// Every kept commitment, of `workspace` only unless None, in natural
    /// order: by creation time, then session, then position in its plan.
    pub fn list(&self, workspace: Option<&str>) -> Vec<Commitment> {
        let st = lock(&self.state);
        let mut entries: Vec<&Entry> = st
            .entries
            .values()
            .filter(|e| workspace.is_none_or(|w| e.workspace == w))
            .collect();
        entries.sort_by(|a, b| a.session_id.cmp(&b.session_id));
        let mut rows: Vec<(usize, Commitment)> = Vec::new();
        for e in entries {
            rows.extend(e.rows.iter().cloned().enumerate());
        }
        rows.sort_by(|(na, a), (nb, b)| {
            a.created_at
                .cmp(&b.created_at)
                .then_with(|| a.session_id.cmp(&b.session_id))
                .then(na.cmp(nb))
        });
        rows.into_iter().map(|(_, c)| c).collect()
    }

    /// Shutdown: the file written once more (its time says it is current),
    /// and the thread stopped.
    pub async fn close(&self) {
        let Some(thread) = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take() else {
            return;
        };
        let tx = self.tx.clone();
        let _ = tokio::task::spawn_blocking(move || {
            let _ = tx.send(Msg::Stop);
            let _ = thread.join();
        })
        .await;
    }
}

fn upsert(st: &mut State, session_id: &str, workspace: &str, rows: Vec<Commitment>) {
    st.clock += 1;
    let touched = st.clock;
    if let Some(old) = st.entries.remove(session_id) {
        st.rows -= old.rows.len();
    }
    if !rows.is_empty() {
        st.rows += rows.len();
        st.entries.insert(
            session_id.to_string(),
            Entry {
                session_id: session_id.to_string(),
                workspace: workspace.to_string(),
                rows,
                touched,
            },
        );
    }
    while st.rows > MAX_ROWS {
        let Some(oldest) = st
            .entries
            .values()
            .min_by_key(|e| e.touched)
            .map(|e| e.session_id.clone())
        else {
            break;
        };
        if let Some(e) = st.entries.remove(&oldest) {
            tracing::warn!(
                session = %oldest,
                "the commitments listing keeps at most {MAX_ROWS}: this session's are left out of it (its ledger keeps them)"
            );
            st.rows -= e.rows.len();
        }
    }
    st.generation += 1;
}

/// The portfolio's thread: a save after each change (coalesced), and a
/// last one, made even when nothing changed, at `Stop`.
fn saver(dir: &Path, state: &Mutex<State>, rx: Receiver<Msg>) {
    while let Ok(msg) = rx.recv() {
        let stop = matches!(msg, Msg::Stop);
        if let Err(e) = save(dir, state, stop) {
            tracing::warn!("cannot save the commitments listing: {e}");
        }
        if stop {
            return;
        }
    }
}

fn save(dir: &Path, state: &Mutex<State>, force: bool) -> std::io::Result<()> {
    let (mut sessions, generation) = {
        let st = lock(state);
        if st.generation == st.saved && !force {
            return Ok(());
        }
        (st.entries.values().cloned().collect::<Vec<_>>(), st.generation)
    };
    sessions.sort_by(|a, b| a.session_id.cmp(&b.session_id));
    let body = serde_json::to_vec(&File {
        version: VERSION,
        sessions,
    })?;
    let temp = dir.join(TEMP);
    let written = write_replace(&temp, &dir.join(FILE), &body);
    if written.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    written?;
    std::fs::File::open(dir)?.sync_all()?;
    let mut st = lock(state);
    st.saved = st.saved.max(generation);
    Ok(())
}

/// The file's entries, then a fresh read of every ledger written since it
/// was saved (or of every ledger, when it is missing or unreadable).
fn load(dir: &Path, st: &mut State) {
    let ledgers = list_ledgers(dir);
    let cap = (MAX_ROWS as u64 + 1) * MAX_ROW_BYTES;
    let (saved, at) = match read_file(&dir.join(FILE), cap) {
        Ok(Some((file, at))) => (file.sessions, at),
        Ok(None) => (Vec::new(), None),
        Err(why) => {
            tracing::warn!("rebuilding the commitments listing from the ledgers: {why}");
            (Vec::new(), None)
        }
    };
    let mut saved: HashMap<String, Entry> = saved.into_iter().map(|e| (e.session_id.clone(), e)).collect();
    let mut read = 0usize;
    for (id, on_disk) in ledgers {
        let untouched = match (at, on_disk.modified) {
            (Some(saved_at), Some(modified)) => modified
                .checked_add(FRESHNESS_MARGIN)
                .is_some_and(|m| m < saved_at),
            _ => false,
        };
        if untouched {
            if let Some(e) = saved.remove(&id) {
                upsert(st, &id, &e.workspace.clone(), e.rows);
            }
            continue;
        }
        read += 1;
        match scan(&on_disk.path) {
            Ok((workspace, rows)) => upsert(st, &id, &workspace, rows),
            Err(e) => {
                tracing::warn!(path = %on_disk.path.display(), "cannot read a ledger's commitments: {e}");
                if let Some(e) = saved.remove(&id) {
                    upsert(st, &id, &e.workspace.clone(), e.rows);
                }
            }
        }
    }
    // Entries whose ledger is gone stay out; what was read must reach the file.
    st.generation += 1;
    tracing::debug!(
        sessions = st.entries.len(),
        ledgers_read = read,
        "commitments listing loaded"
    );
}

fn read_file(path: &Path, cap: u64) -> Result<Option<(File, Option<SystemTime>)>, String> {
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot open {}: {e}", path.display())),
    };
    let at = file.metadata().and_then(|m| m.modified()).ok();
    let mut body = Vec::new();
    file.take(cap + 1)
        .read_to_end(&mut body)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if body.len() as u64 > cap {
        return Err(format!("{} is larger than {cap} bytes", path.display()));
    }
    let file: File =
        serde_json::from_slice(&body).map_err(|e| format!("{} is corrupt: {e}", path.display()))?;
    if file.version != VERSION {
        return Err(format!(
            "{} has version {}, this server reads {VERSION}",
            path.display(),
            file.version
        ));
    }
    Ok(Some((file, at)))
}

/// A ledger's workspace and its plan, folded from its `commitment` lines
/// alone (every other line is skipped before it is parsed).
fn scan(path: &Path) -> std::io::Result<(String, Vec<Commitment>)> {
    let file = std::fs::File::open(path)?;
    let mut reader = std::io::BufReader::with_capacity(256 * 1024, file);
    let (mut workspace, mut plan) = (String::new(), Plan::default());
    let mut line = Vec::new();
    const KIND: &[u8] = b"\"kind\":\"commitment\"";
    loop {
        line.clear();
        if reader.read_until(b'\n', &mut line)? == 0 {
            break;
        }
        let head = &line[..line.len().min(16)];
        if head.starts_with(b"{\"header\"") {
            if let Ok(Record::Header { workspace: w, .. }) = serde_json::from_slice(&line) {
                workspace = w;
            }
        } else if head.starts_with(b"{\"event\"") && line.windows(KIND.len()).any(|w| w == KIND) {
            if let Ok(Record::Event { seq, event }) = serde_json::from_slice::<Record>(&line) {
                if matches!(event, ClientEvent::Commitment { .. }) {
                    plan.apply(seq, &event);
                }
            }
        }
    }
    Ok((workspace, plan.rows().to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commitment::{Change, PlanStatus, Stakes};

    fn row(session: &str, item: &str, at: &str) -> Commitment {
        Commitment {
            id: format!("{session}.{item}"),
            item: item.into(),
            session_id: session.into(),
            text: item.into(),
            status: PlanStatus::Pending,
            evidence: Vec::new(),
            requires: Vec::new(),
            stakes: Stakes::Medium,
            due: None,
            blocked_by: Vec::new(),
            created_at: at.into(),
            updated_at: at.into(),
            created_seq: 1,
            closed: None,
        }
    }

    #[test]
    fn listing_is_by_workspace_in_creation_order_and_bounded() {
        let p = Portfolio::open(None);
        p.put(
            "b",
            "/w",
            vec![
                row("b", "1", "2026-12-05T10:00:00Z"),
                row("b", "2", "2026-12-05T10:00:00Z"),
            ],
        );
        p.put("a", "/w", vec![row("a", "1", "2026-12-05T11:00:00Z")]);
        p.put("c", "/other", vec![row("c", "1", "2026-12-05T09:00:00Z")]);
        let ids = |rows: Vec<Commitment>| rows.into_iter().map(|c| c.id).collect::<Vec<_>>();
        assert_eq!(ids(p.list(Some("/w"))), ["b.1", "b.2", "a.1"]);
        assert_eq!(ids(p.list(None)), ["c.1", "b.1", "b.2", "a.1"]);
        p.put("a", "/w", Vec::new());
        assert_eq!(ids(p.list(Some("/w"))), ["b.1", "b.2"]);
        p.remove("b");
        assert!(p.list(Some("/w")).is_empty());
        // Past MAX_ROWS the session changed longest ago leaves the listing.
        let many = |s: &str| {
            (0..MAX_ROWS / 2)
                .map(|n| row(s, &n.to_string(), "t"))
                .collect::<Vec<_>>()
        };
        p.put("x", "/w", many("x"));
        p.put("y", "/w", many("y"));
        p.put("z", "/w", vec![row("z", "1", "t")]);
        let kept = p.list(None);
        assert!(kept.len() <= MAX_ROWS);
        assert!(
            !kept.iter().any(|c| c.session_id == "c" || c.session_id == "x"),
            "the oldest went first"
        );
        assert!(kept.iter().any(|c| c.session_id == "z"));
    }

    #[test]
    fn a_ledger_written_after_the_file_is_read_again_and_the_file_is_trusted_otherwise() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = |id: &str, rows: &[Commitment]| {
            let mut text = serde_json::to_string(&Record::Header {
                session_id: id.into(),
                created_at: "t".into(),
                workspace: "/w".into(),
            })
            .unwrap();
            text.push('\n');
            for (n, c) in rows.iter().enumerate() {
                let rec = Record::Event {
                    seq: n as u64 + 1,
                    event: ClientEvent::Commitment {
                        change: Change::Created,
                        commitment: Box::new(c.clone()),
                    },
                };
                text.push_str(&serde_json::to_string(&rec).unwrap());
                text.push('\n');
            }
            std::fs::write(dir.path().join(format!("{id}.jsonl")), text).unwrap();
        };
        ledger("s1", &[row("s1", "1", "t"), row("s1", "2", "t")]);
        ledger("s2", &[]);
        // No file yet: every ledger is read.
        let p = Portfolio::open(Some(dir.path()));
        block_on(p.wait_loaded());
        assert_eq!(p.list(Some("/w")).len(), 2);
        block_on(p.close());
        assert!(dir.path().join(FILE).exists());
        // A file that says otherwise than a ledger written since loses to the ledger.
        let mut file: File = serde_json::from_slice(&std::fs::read(dir.path().join(FILE)).unwrap()).unwrap();
        file.sessions[0].rows.truncate(1);
        std::fs::write(dir.path().join(FILE), serde_json::to_vec(&file).unwrap()).unwrap();
        let p = Portfolio::open(Some(dir.path()));
        block_on(p.wait_loaded());
        assert_eq!(
            p.list(Some("/w")).len(),
            2,
            "s1's ledger is newer than the file's margin"
        );
        // A ledger last written well before the file is not read: the file stands.
        let old = SystemTime::now() - Duration::from_secs(60);
        std::fs::File::options()
            .write(true)
            .open(dir.path().join("s1.jsonl"))
            .unwrap()
            .set_modified(old)
            .unwrap();
        std::fs::write(dir.path().join(FILE), serde_json::to_vec(&file).unwrap()).unwrap();
        let p = Portfolio::open(Some(dir.path()));
        block_on(p.wait_loaded());
        assert_eq!(
            p.list(Some("/w")).len(),
            1,
            "trusted, so s1's ledger was not read"
        );
    }

    fn block_on(f: impl std::future::Future<Output = ()>) {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(f)
    }
}
