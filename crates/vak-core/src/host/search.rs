//! Transcript search: a full-text index (SQLite FTS5, bm25 ranking and snippets) of every session's user and assistant messages, kept in the home, updated as runs finish, and rebuilt from the ledgers when it is missing or damaged.
//!
//! The index is `<home>/search/index.db` (0600 in a 0700 folder). One
//! message is one row: the session, the seq of its first event, its role,
//! and its text (the first `MAX_DOC` bytes). A `sessions` table says which
//! workspace each session was written in and up to which seq it is indexed
//! (`indexed_seq`): the rows of a session cover every message up to it, with
//! no gap.
//!
//! Writes go through one indexing thread that owns the only writing
//! connection. Sessions hand it work through a bounded queue
//! (`QUEUE` jobs) without ever waiting: when a run finishes, its session
//! queues the messages since its last job (`Search::index`). When the queue
//! is full the job is dropped and the session is marked dirty instead; the
//! thread catches dirty sessions up from their ledgers as soon as it gets to
//! them, so a burst delays hits but never loses them. A job that starts
//! after the session's `indexed_seq` (the server died mid-run, a job was
//! dropped) is also caught up from the ledger rather than leave a gap.
//!
//! At startup the thread reconciles the index with the session index: a
//! session whose ledger is ahead of `indexed_seq` is caught up, one that no
//! longer exists is dropped. A database that cannot be opened or fails its
//! check is set aside and rebuilt this way from every ledger (hits appear
//! as the rebuild proceeds). Queries open a connection of their own on a
//! blocking thread and only read (WAL: readers never wait for the writer).
//! Shutdown lets the thread finish its queue and close the database.
//!
//! A query is bounded (`Limits`): at most `MAX_TERMS` different words, a
//! prefix word needs `MIN_PREFIX` ASCII characters and may stand for at
//! most `MAX_EXPANSIONS` indexed words, at most `Limits::max_running`
//! queries run at once (past it: ResourceExhausted), and each runs until
//! its deadline (`Limits::deadline`, then DeadlineExceeded) or until its
//! caller goes away (the request future dropped): SQLite's progress handler
//! interrupts the statement, and the snippets are checked between hits.
//! FTS5's own `snippet()` is not used: it is quadratic in the matches of a
//! message (a 64 KiB message of one repeated word took seconds), and it runs
//! inside one SQLite step, where no progress handler is called; the snippet
//! is cut here from `highlight()` instead, which is linear.

use crate::error::{Error, ErrorKind, Result};
use crate::event::ClientEvent;
use crate::log::ledger::Record;
use crate::log::transcript::{Message, Role, Transcript};
use rusqlite::{params, Connection, OptionalExtension};
use std::collections::HashSet;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::Instant;

mod query;
pub use query::{fts_query, MAX_EXPANSIONS, MAX_QUERY, MAX_TERMS, MIN_PREFIX};

/// Jobs the indexing queue holds; past it, sessions are marked dirty.
pub const QUEUE: usize = 256;
/// The most of one message that is indexed, in bytes.
pub const MAX_DOC: usize = 64 * 1024;

/// How long one query may run and how many run at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub deadline: std::time::Duration,
    pub max_running: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            deadline: std::time::Duration::from_secs(2),
            max_running: 4,
        }
    }
}
/// The most hits one query returns, and how many when none is asked for.
pub const MAX_LIMIT: usize = 100;
pub const DEFAULT_LIMIT: usize = 20;
/// The schema's version (`PRAGMA user_version`): another one is rebuilt.
const SCHEMA: i64 = 1;

const SCHEMA_SQL: &str = "
CREATE TABLE IF NOT EXISTS sessions(
    session_id TEXT PRIMARY KEY,
    workspace TEXT NOT NULL,
    indexed_seq INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS msgs(
    id INTEGER PRIMARY KEY,
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    role TEXT NOT NULL,
    text TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS msgs_session ON msgs(session_id, seq);
CREATE VIRTUAL TABLE IF NOT EXISTS msgs_fts USING fts5(
    text, content='msgs', content_rowid='id', tokenize='unicode61 remove_diacritics 2'
);
CREATE TRIGGER IF NOT EXISTS msgs_ai AFTER INSERT ON msgs BEGIN
    INSERT INTO msgs_fts(rowid, text) VALUES (new.id, new.text);
END;
CREATE TRIGGER IF NOT EXISTS msgs_ad AFTER DELETE ON msgs BEGIN
    INSERT INTO msgs_fts(msgs_fts, rowid, text) VALUES ('delete', old.id, old.text);
END;
";

/// One message to index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Doc {
    pub seq: u64,
    pub role: &'static str,
    pub text: String,
}

/// One hit, best first.
#[derive(Clone, Debug, PartialEq)]
pub struct Hit {
    pub session_id: String,
    pub seq: u64,
    pub workspace: String,
    pub role: String,
    pub snippet: String,
    /// Higher is better (bm25, negated).
    pub score: f64,
}

enum Job {
    /// A finished run's messages.
    Index(Run),
    /// Read the session's ledger and index what the index lacks (a fork).
    CatchUp(String),
    Delete(String),
    /// The sessions on disk with their latest seq, at startup.
    Reconcile(Vec<(String, u64)>),
    /// Look at the dirty set (sent after marking one when the queue was full).
    Wake,
    /// Shutdown: finish what is queued before it, then close the database.
    Stop,
}

/// The handle sessions and the API use; the indexing thread ends when it drops.
pub struct Search {
    db: PathBuf,
    tx: SyncSender<Job>,
    dirty: Arc<Mutex<HashSet<String>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Jobs dropped for a full queue (their sessions caught up from ledgers).
    overflowed: std::sync::atomic::AtomicU64,
    limits: Limits,
    /// One permit per running query, held until its SQLite work has ended.
    running: Arc<tokio::sync::Semaphore>,
}

/// How long shutdown waits for the indexing thread to finish its queue.
const CLOSE_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// The user and assistant messages of `t` with from < seq <= upto, each cut at `MAX_DOC`.
pub fn docs(t: &Transcript, from: u64, upto: u64) -> Vec<Doc> {
    t.messages
        .iter()
        .filter(|m| m.seq > from && m.seq <= upto)
        .filter_map(doc)
        .collect()
}

fn doc(m: &Message) -> Option<Doc> {
    let role = match m.role {
        Role::User => "user",
        Role::Assistant => "assistant",
        _ => return None,
    };
    let text = m.text.trim();
    if text.is_empty() {
        return None;
    }
    Some(Doc {
        seq: m.seq,
        role,
        text: text[..crate::host::memory::floor(text, MAX_DOC)].to_string(),
    })
}

fn sql_error(e: rusqlite::Error) -> Error {
    Error::internal(format!("search index: {e}"))
}

impl Search {
    /// Opens (or rebuilds) the index in `home` and starts its thread, which
    /// first reconciles it with `sessions` (id and latest seq of each
    /// session on disk). `ledgers` is the folder of the JSONL ledgers (None
    /// with the JetStream log: then nothing is read back from ledgers and
    /// only live runs are indexed). Blocking: call it at startup.
    pub fn open(
        home: &Path,
        workspace: &str,
        ledgers: Option<PathBuf>,
        sessions: Vec<(String, u64)>,
        limits: Limits,
    ) -> Search {
        Self::open_with(home, workspace, ledgers, sessions, limits, QUEUE, None)
    }

    /// `open` with the queue's size, and a gate the thread waits on before
    /// its first job (tests fill the queue deterministically with it).
    fn open_with(
        home: &Path,
        workspace: &str,
        ledgers: Option<PathBuf>,
        sessions: Vec<(String, u64)>,
        limits: Limits,
        queue: usize,
        gate: Option<Receiver<()>>,
    ) -> Search {
        let dir = home.join("search");
        let db = dir.join("index.db");
        let (tx, rx) = sync_channel(queue);
        let dirty = Arc::new(Mutex::new(HashSet::new()));
        let conn = match crate::home::create_private_dir(&dir)
            .map_err(|e| Error::internal(format!("cannot create {}: {e}", dir.display())))
            .and_then(|()| open_writer(&db))
        {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::error!("transcript search is off: {e}");
                None
            }
        };
        let mut thread = None;
        if let Some(conn) = conn {
            let mut indexer = Indexer {
                conn,
                workspace: workspace.to_string(),
                ledgers,
                dirty: dirty.clone(),
            };
            let _ = tx.try_send(Job::Reconcile(sessions));
            let spawned = std::thread::Builder::new()
                .name("vak-search".into())
                .spawn(move || {
                    if let Some(gate) = gate {
                        let _ = gate.recv();
                    }
                    indexer.run(rx)
                });
            match spawned {
                Ok(t) => thread = Some(t),
                Err(e) => tracing::error!("transcript search is off: cannot start its thread: {e}"),
            }
        }
        Search {
            db,
            tx,
            dirty,
            thread: Mutex::new(thread),
            overflowed: std::sync::atomic::AtomicU64::new(0),
            limits,
            running: Arc::new(tokio::sync::Semaphore::new(limits.max_running)),
        }
    }

    /// Shutdown: lets the thread finish the jobs queued so far and close the
    /// database (its WAL checkpointed), waiting at most `CLOSE_GRACE`.
    pub async fn close(&self) {
        let Some(thread) = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take() else {
            return;
        };
        let tx = self.tx.clone();
        let join = tokio::task::spawn_blocking(move || {
            // Waits for room when the queue is full: this is a blocking thread.
            let _ = tx.send(Job::Stop);
            let _ = thread.join();
        });
        if tokio::time::timeout(CLOSE_GRACE, join).await.is_err() {
            tracing::warn!("the search index was still busy at shutdown; its ledgers catch it up next start");
        }
    }

    /// Queues a finished run's messages (never waits: see the module docs).
    pub fn index(&self, session_id: &str, workspace: &str, from_seq: u64, upto_seq: u64, docs: Vec<Doc>) {
        self.send(
            session_id,
            Job::Index(Run {
                session_id: session_id.to_string(),
                workspace: workspace.to_string(),
                from_seq,
                upto_seq,
                docs,
            }),
        );
    }

    /// Queues a catch-up of `session_id` from its ledger.
    pub fn catch_up(&self, session_id: &str) {
        self.send(session_id, Job::CatchUp(session_id.to_string()));
    }

    /// Queues the removal of a deleted session's hits.
    pub fn delete(&self, session_id: &str) {
        self.send(session_id, Job::Delete(session_id.to_string()));
    }

    fn send(&self, session_id: &str, job: Job) {
        match self.tx.try_send(job) {
            Ok(()) | Err(TrySendError::Disconnected(_)) => {}
            Err(TrySendError::Full(_)) => {
                // The catch-up reads the ledger, which has everything (or
                // finds it gone and drops the session's hits).
                let n = self.overflowed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if n.is_power_of_two() || n == 0 {
                    tracing::warn!(
                        dropped = n + 1,
                        "the search queue is full: sessions will be caught up from their ledgers"
                    );
                }
                self.dirty
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(session_id.to_string());
                let _ = self.tx.try_send(Job::Wake);
            }
        }
    }

    /// The best `limit` hits for `q`: in `workspace`'s sessions, or in every
    /// one's when `workspace` is None. Runs on a blocking thread, at most
    /// `Limits::max_running` at once, each until its deadline; dropping the
    /// returned future stops its query.
    pub async fn query(&self, q: &str, limit: usize, workspace: Option<String>) -> Result<Vec<Hit>> {
        let terms = query::terms(q)?;
        if !(1..=MAX_LIMIT).contains(&limit) {
            return Err(Error::invalid(format!("limit {limit}: give 1 to {MAX_LIMIT}")));
        }
        let permit = self.running.clone().try_acquire_owned().map_err(|_| {
            Error::new(
                ErrorKind::ResourceExhausted,
                format!(
                    "{} searches are running, the most at once; try again when one has finished",
                    self.limits.max_running
                ),
            )
        })?;
        let budget = query::Budget {
            deadline: Instant::now() + self.limits.deadline,
            limit: self.limits.deadline,
            stop: Arc::new(AtomicBool::new(false)),
        };
        let _stop = query::StopOnDrop(budget.stop.clone());
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || {
            // Released when the SQLite work has ended, not when the caller left.
            let _permit = permit;
            query::run(&db, &terms, limit, workspace.as_deref(), &budget)
        })
        .await
        .map_err(|e| Error::internal(e.to_string()))?
    }
}

/// Opens the index for writing, setting aside a file that is not a usable
/// index (damaged, or another schema) and starting a new one.
fn open_writer(db: &Path) -> Result<Connection> {
    match try_open(db) {
        Ok(c) => Ok(c),
        Err(e) => {
            tracing::warn!(path = %db.display(), "rebuilding the search index from the ledgers: {e}");
            for suffix in ["", "-wal", "-shm"] {
                let mut p = db.as_os_str().to_owned();
                p.push(suffix);
                let _ = std::fs::remove_file(PathBuf::from(p));
            }
            try_open(db)
        }
    }
}

fn try_open(db: &Path) -> Result<Connection> {
    // Created owner-only before SQLite opens it: its -wal and -shm files
    // take the database file's mode.
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(db)
        .map_err(|e| Error::internal(format!("cannot create {}: {e}", db.display())))?;
    let conn = Connection::open(db).map_err(sql_error)?;
    conn.pragma_update(None, "journal_mode", "WAL")
        .map_err(sql_error)?;
    // Durable enough: a lost tail is caught up from the ledgers at startup.
    conn.pragma_update(None, "synchronous", "NORMAL")
        .map_err(sql_error)?;
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .map_err(sql_error)?;
    let fresh: i64 = conn
        .query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0))
        .map_err(sql_error)?;
    if fresh > 0 && version != SCHEMA {
        return Err(Error::internal(format!("schema version {version}, not {SCHEMA}")));
    }
    let check: String = conn
        .query_row("PRAGMA quick_check", [], |r| r.get(0))
        .map_err(sql_error)?;
    if check != "ok" {
        return Err(Error::internal(format!("quick_check: {check}")));
    }
    conn.execute_batch(SCHEMA_SQL).map_err(sql_error)?;
    conn.pragma_update(None, "user_version", SCHEMA)
        .map_err(sql_error)?;
    if fresh > 0 {
        // The full-text index against its table: catches a damaged index.
        conn.execute(
            "INSERT INTO msgs_fts(msgs_fts, rank) VALUES ('integrity-check', 1)",
            [],
        )
        .map_err(sql_error)?;
    }
    Ok(conn)
}

/// Runs whose docs one transaction takes at most.
const MAX_RUNS_PER_TRANSACTION: usize = 256;

/// A finished run's messages to index: those with from_seq < seq <= upto_seq.
struct Run {
    session_id: String,
    workspace: String,
    from_seq: u64,
    upto_seq: u64,
    docs: Vec<Doc>,
}

/// The seq up to which the session's messages are indexed (0: none).
fn indexed_in(conn: &Connection, id: &str) -> Result<u64> {
    let seq: Option<i64> = conn
        .query_row(
            "SELECT indexed_seq FROM sessions WHERE session_id = ?1",
            [id],
            |r| r.get(0),
        )
        .optional()
        .map_err(sql_error)?;
    Ok(seq.unwrap_or(0) as u64)
}

/// Adds the run's docs after `have` and moves its session's mark to the run's end.
fn store_in(conn: &Connection, run: &Run, have: u64) -> Result<()> {
    let mut insert = conn
        .prepare_cached("INSERT INTO msgs(session_id, seq, role, text) VALUES (?1, ?2, ?3, ?4)")
        .map_err(sql_error)?;
    for d in run.docs.iter().filter(|d| d.seq > have && d.seq <= run.upto_seq) {
        insert
            .execute(params![run.session_id, d.seq as i64, d.role, d.text])
            .map_err(sql_error)?;
    }
    conn.execute(
        "INSERT INTO sessions(session_id, workspace, indexed_seq) VALUES (?1, ?2, ?3)
         ON CONFLICT(session_id) DO UPDATE SET indexed_seq = excluded.indexed_seq",
        params![run.session_id, run.workspace, run.upto_seq as i64],
    )
    .map_err(sql_error)?;
    Ok(())
}

struct Indexer {
    conn: Connection,
    workspace: String,
    ledgers: Option<PathBuf>,
    dirty: Arc<Mutex<HashSet<String>>>,
}

impl Indexer {
    fn run(&mut self, rx: Receiver<Job>) {
        let mut next = None;
        while let Some(job) = next.take().or_else(|| rx.recv().ok()) {
            if matches!(job, Job::Stop) {
                return;
            }
            // Finished runs queued together go into one transaction: with
            // 10 000 sessions finishing 100-delta runs at once, a transaction
            // (and a full-text flush) per run was a fifth of the server's CPU.
            let result = match job {
                Job::Index(run) => {
                    let mut runs = vec![run];
                    while runs.len() < MAX_RUNS_PER_TRANSACTION {
                        match rx.try_recv() {
                            Ok(Job::Index(run)) => runs.push(run),
                            Ok(other) => {
                                next = Some(other);
                                break;
                            }
                            Err(_) => break,
                        }
                    }
                    self.index_runs(runs)
                }
                job => self.job(job),
            };
            if let Err(e) = result {
                tracing::error!("search index: {e}");
            }
            let dirty: Vec<String> = self
                .dirty
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .drain()
                .collect();
            for id in dirty {
                if let Err(e) = self.catch_up(&id) {
                    tracing::error!(session = %id, "search index: {e}");
                }
            }
        }
    }

    fn job(&mut self, job: Job) -> Result<()> {
        match job {
            Job::Index(run) => self.index_runs(vec![run]),
            Job::CatchUp(id) => self.catch_up(&id),
            Job::Delete(id) => self.delete(&id),
            Job::Reconcile(sessions) => self.reconcile(sessions),
            Job::Wake | Job::Stop => Ok(()),
        }
    }

    fn indexed(&self, id: &str) -> Result<u64> {
        indexed_in(&self.conn, id)
    }

    /// Adds each run's docs after its session's mark and moves the mark to
    /// the run's end, all in one transaction; a run with a gap before it
    /// (the session's mark short of its start) is caught up from the ledger
    /// after the commit instead.
    fn index_runs(&mut self, runs: Vec<Run>) -> Result<()> {
        let mut gaps = Vec::new();
        let tx = self.conn.transaction().map_err(sql_error)?;
        for run in &runs {
            let have = indexed_in(&tx, &run.session_id)?;
            if have >= run.upto_seq {
                continue;
            }
            if have < run.from_seq {
                if !gaps.contains(&run.session_id) {
                    gaps.push(run.session_id.clone());
                }
                continue;
            }
            store_in(&tx, run, have)?;
        }
        tx.commit().map_err(sql_error)?;
        for id in gaps {
            self.catch_up(&id)?;
        }
        Ok(())
    }

    fn delete(&mut self, id: &str) -> Result<()> {
        let tx = self.conn.transaction().map_err(sql_error)?;
        tx.execute("DELETE FROM msgs WHERE session_id = ?1", [id])
            .map_err(sql_error)?;
        tx.execute("DELETE FROM sessions WHERE session_id = ?1", [id])
            .map_err(sql_error)?;
        tx.commit().map_err(sql_error)
    }

    /// Indexes what the session's ledger has past the session's mark; a
    /// ledger that is gone drops the session's hits.
    fn catch_up(&mut self, id: &str) -> Result<()> {
        let Some(dir) = &self.ledgers else {
            return Ok(());
        };
        crate::ids::validate_session_id(id)?;
        let path = dir.join(format!("{id}.jsonl"));
        let have = self.indexed(id)?;
        match read_ledger(&path) {
            Ok(Some((workspace, latest, transcript))) => {
                if latest <= have {
                    return Ok(());
                }
                let workspace = workspace.unwrap_or_else(|| self.workspace.clone());
                let run = Run {
                    session_id: id.to_string(),
                    workspace,
                    from_seq: have,
                    upto_seq: latest,
                    docs: docs(&transcript, have, latest),
                };
                let tx = self.conn.transaction().map_err(sql_error)?;
                store_in(&tx, &run, have)?;
                tx.commit().map_err(sql_error)
            }
            Ok(None) => self.delete(id),
            Err(e) => Err(Error::internal(format!("cannot read {}: {e}", path.display()))),
        }
    }

    fn reconcile(&mut self, sessions: Vec<(String, u64)>) -> Result<()> {
        if self.ledgers.is_none() {
            return Ok(());
        }
        let known: HashSet<&str> = sessions.iter().map(|(id, _)| id.as_str()).collect();
        let indexed: Vec<(String, u64)> = {
            let mut stmt = self
                .conn
                .prepare("SELECT session_id, indexed_seq FROM sessions")
                .map_err(sql_error)?;
            let rows = stmt
                .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)? as u64)))
                .map_err(sql_error)?;
            rows.collect::<rusqlite::Result<_>>().map_err(sql_error)?
        };
        for (id, _) in indexed.iter().filter(|(id, _)| !known.contains(id.as_str())) {
            self.delete(id)?;
        }
        let marks: std::collections::HashMap<&str, u64> =
            indexed.iter().map(|(id, s)| (id.as_str(), *s)).collect();
        for (id, latest) in &sessions {
            if marks.get(id.as_str()).copied().unwrap_or(0) < *latest {
                if let Err(e) = self.catch_up(id) {
                    tracing::error!(session = %id, "search index: {e}");
                }
            }
        }
        Ok(())
    }
}

/// A ledger's workspace (from its header), latest seq and transcript,
/// folded from its events (snapshots are skipped: every event is still in
/// the file). None when the file does not exist.
fn read_ledger(path: &Path) -> std::io::Result<Option<(Option<String>, u64, Transcript)>> {
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut reader = std::io::BufReader::with_capacity(256 * 1024, file);
    let (mut workspace, mut latest, mut t) = (None, 0, Transcript::default());
    let mut line = Vec::new();
    loop {
        line.clear();
        if reader.read_until(b'\n', &mut line)? == 0 {
            break;
        }
        // Cheap test before parsing: snapshots and notes are skipped.
        let head = &line[..line.len().min(16)];
        if head.starts_with(b"{\"header\"") {
            if let Ok(Record::Header { workspace: w, .. }) = serde_json::from_slice(&line) {
                workspace = (!w.is_empty()).then_some(w);
            }
        } else if head.starts_with(b"{\"event\"") {
            if let Ok(Record::Event { seq, event }) = serde_json::from_slice::<Record>(&line) {
                if seq > latest {
                    latest = seq;
                    if !matches!(event, ClientEvent::ToolOutput { .. }) {
                        t.apply(seq, &event);
                    }
                }
            }
        }
    }
    Ok(Some((workspace, latest, t)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(seq: u64, text: &str) -> (u64, ClientEvent) {
        (
            seq,
            ClientEvent::UserMessage {
                text: text.into(),
                request_id: format!("r{seq}"),
                attachments: Vec::new(),
            },
        )
    }

    async fn wait_for(s: &Search, q: &str, want: usize) -> Vec<Hit> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            let hits = s.query(q, 10, None).await.unwrap();
            if hits.len() == want || std::time::Instant::now() > deadline {
                return hits;
            }
            tokio::task::yield_now().await;
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }

    /// Writes a ledger of one user message per (seq, text).
    fn ledger(dir: &Path, id: &str, messages: &[(u64, &str)]) {
        let mut file = serde_json::to_string(&Record::Header {
            session_id: id.into(),
            created_at: "t".into(),
            workspace: "/w/one".into(),
        })
        .unwrap();
        file.push('\n');
        for (seq, text) in messages {
            file.push_str(
                &serde_json::to_string(&Record::Event {
                    seq: *seq,
                    event: user(*seq, text).1,
                })
                .unwrap(),
            );
            file.push('\n');
        }
        std::fs::write(dir.join(format!("{id}.jsonl")), &file).unwrap();
    }

    /// An index over `home`'s `sessions` ledgers with a queue of `queue`
    /// jobs, whose thread waits until the returned sender sends.
    fn gated(home: &Path, queue: usize) -> (Search, PathBuf, std::sync::mpsc::Sender<()>) {
        let ledgers = home.join("sessions");
        std::fs::create_dir(&ledgers).unwrap();
        let (open, gate) = std::sync::mpsc::channel();
        let s = Search::open_with(
            home,
            "/w/one",
            Some(ledgers.clone()),
            Vec::new(),
            Limits::default(),
            queue,
            Some(gate),
        );
        (s, ledgers, open)
    }

    #[tokio::test]
    async fn a_full_queue_never_blocks_and_loses_nothing_the_ledgers_have() {
        let home = tempfile::tempdir().unwrap();
        // Room for the startup reconcile and one more job; the thread waits at the gate.
        let (s, ledgers, open) = gated(home.path(), 2);
        for i in 0..10u64 {
            let id = format!("s{i}");
            let text = format!("the ocelot number{i}");
            ledger(&ledgers, &id, &[(1, &text)]);
            let doc = Doc {
                seq: 1,
                role: "user",
                text,
            };
            // Returns at once, queued or not.
            s.index(&id, "/w/one", 0, 1, vec![doc]);
        }
        assert_eq!(s.overflowed.load(std::sync::atomic::Ordering::Relaxed), 9);
        open.send(()).unwrap();
        let hits = wait_for(&s, "ocelot", 10).await;
        assert_eq!(hits.len(), 10, "{hits:?}");
        for i in 0..10 {
            assert_eq!(
                wait_for(&s, &format!("number{i}"), 1).await[0].session_id,
                format!("s{i}")
            );
        }
        s.close().await;
    }

    /// Runs queued together are indexed in one transaction: every one of
    /// them, a session's second run after its first, a run with a gap
    /// before it from the ledger, and a delete queued behind them last.
    #[tokio::test]
    async fn runs_queued_together_are_all_indexed_and_jobs_keep_their_order() {
        let home = tempfile::tempdir().unwrap();
        let (s, ledgers, open) = gated(home.path(), 64);
        let doc = |seq: u64, text: &str| Doc {
            seq,
            role: "user",
            text: text.to_string(),
        };
        for i in 0..20u64 {
            s.index(
                &format!("s{i}"),
                "/w/one",
                0,
                1,
                vec![doc(1, &format!("the lynx first{i}"))],
            );
        }
        s.index("s0", "/w/one", 1, 2, vec![doc(2, "the lynx second0")]);
        // s20's first run was never queued: its ledger has it.
        ledger(&ledgers, "s20", &[(1, "the lynx gapped"), (2, "the lynx after")]);
        s.index("s20", "/w/one", 1, 2, vec![doc(2, "the lynx after")]);
        s.delete("s19");
        open.send(()).unwrap();
        assert_eq!(wait_for(&s, "second0", 1).await[0].seq, 2);
        for i in 0..19 {
            let hits = wait_for(&s, &format!("first{i}"), 1).await;
            assert_eq!(hits.len(), 1, "s{i}'s run: {hits:?}");
            assert_eq!(hits[0].session_id, format!("s{i}"));
        }
        assert_eq!(wait_for(&s, "gapped", 1).await[0].session_id, "s20");
        assert!(
            wait_for(&s, "first19", 0).await.is_empty(),
            "deleted after its run was indexed"
        );
        s.close().await;
    }

    #[tokio::test]
    async fn a_damaged_index_is_rebuilt_from_the_ledgers() {
        let home = tempfile::tempdir().unwrap();
        let ledgers = home.path().join("sessions");
        std::fs::create_dir(&ledgers).unwrap();
        ledger(&ledgers, "s1", &[(1, "the zebra crossed")]);
        let sessions = vec![("s1".to_string(), 1)];
        let open = || {
            Search::open(
                home.path(),
                "/w/two",
                Some(ledgers.clone()),
                sessions.clone(),
                Limits::default(),
            )
        };
        let s = open();
        let hits = wait_for(&s, "zebra", 1).await;
        assert_eq!((hits[0].seq, hits[0].workspace.as_str()), (1, "/w/one"));
        assert_eq!(hits[0].snippet, "the **zebra** crossed");
        s.close().await;
        std::fs::write(home.path().join("search/index.db"), b"garbage, not a database").unwrap();
        let s = open();
        assert_eq!(wait_for(&s, "zebra", 1).await.len(), 1);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(home.path().join("search/index.db"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
