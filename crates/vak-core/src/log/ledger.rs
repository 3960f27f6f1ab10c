//! The per-session append-only JSONL ledger: the durable record that transcripts, seq numbering and replay are rebuilt from after a restart.
//!
//! Only the session's writer appends (`Log::append`, one `write` per batch
//! of records, off the runtime), so a crash can only ever leave a partial
//! *last* line; `open` cuts such a tail off, and a failed append cuts its own
//! partial batch off at once. Readers (replay from disk) open their own
//! descriptor and read only what an append has finished, found through a
//! sparse seq-to-offset index kept in memory.
//!
//! Ledgers are owner-only (0600), and the files held open are bounded
//! process-wide (`fd_budget`): past the budget a ledger opens its file for
//! each append and closes it again, so many sessions never exhaust the fd table.

use crate::error::{Error, Result};
use crate::event::{ClientEvent, Frame};
use crate::provider::TokenUsage;
use crate::Durability;
use serde::{Deserialize, Serialize};
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

/// Ledger files held open now, across the process.
static OPEN: AtomicUsize = AtomicUsize::new(0);

/// How many ledger files may stay open: a quarter of the fd limit (read once,
/// after startup raised it), between 16 and 1024.
fn fd_budget() -> usize {
    static BUDGET: OnceLock<usize> = OnceLock::new();
    *BUDGET.get_or_init(|| {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes into the struct we pass; nothing else is touched.
        let ok = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0;
        let limit = if ok { lim.rlim_cur as usize } else { 1024 };
        (limit / 4).clamp(16, 1024)
    })
}

/// A slot for one more open ledger file, if the budget has room.
fn reserve() -> bool {
    OPEN.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
        (n < fd_budget()).then_some(n + 1)
    })
    .is_ok()
}

fn release() {
    OPEN.fetch_sub(1, Ordering::AcqRel);
}

/// One ledger line.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Record {
    /// Always the first line.
    Header {
        session_id: String,
        created_at: String,
        /// The workspace the session was created in (canonical path), for
        /// search; empty in ledgers written before it was recorded.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        workspace: String,
    },
    /// A client event with the seq it was published under.
    Event { seq: u64, event: ClientEvent },
    /// An input was admitted under this request id (so a retry stays a
    /// duplicate after a restart, even if the input never ran).
    Admitted { request_id: String },
    /// Tokens one provider turn consumed.
    Usage(TokenUsage),
    /// The provider's signature over the thinking published just before.
    Signature { signature: String },
    /// The history up to a seq, summarised for the model.
    Compaction(crate::event::Compaction),
    /// The last exchange, taken back from the model.
    Undo(crate::event::Undo),
    /// The session's folds as of a seq: a reload starts from the last one.
    Snapshot(Box<crate::log::folds::Snapshot>),
    /// Events `from..=to` were issued, but the ledger was found cut short of
    /// them on a load (`repair.rs`): their seqs are never issued again, and a
    /// replay across them says `history_lost`.
    Lost { from: u64, to: u64 },
    /// With `--bus`: replica `replica` took the session's lease (KV
    /// revision `revision`) and writes it from here on. The first thing a
    /// loading holder appends (`JetStreamLog::take_over`), so a stale
    /// holder's later append fails the CAS; nothing folds it.
    Lease { replica: String, revision: u64 },
    /// A background result queued for the session (delivered later by a
    /// `background_result` event whose `upto` covers its number).
    Background(crate::background::Pending),
    /// A model call's or tool call's receipt, under the latest event before
    /// it; nothing folds it (`log/receipts.rs` reads them).
    Receipt(Box<crate::receipt::Receipt>),
}

/// A delta's event line, the most common line by far, in a shape serde
/// decodes straight into fields. `ClientEvent` is internally tagged
/// (`"kind"`), which serde decodes by first buffering the whole object;
/// this shape skips that, and `deny_unknown_fields` keeps it from ever
/// reading a line differently: anything else falls back to `Record`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DeltaLine {
    event: DeltaRecord,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DeltaRecord {
    seq: u64,
    event: DeltaEvent,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DeltaEvent {
    kind: DeltaKind,
    text: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum DeltaKind {
    TextDelta,
    ThinkingDelta,
}

/// A delta line whose text needs no unescaping, read by its bytes: the
/// line `EventRef` writes for a delta, exactly, or None.
fn plain_delta_line(line: &[u8]) -> Option<Record> {
    let rest = line.strip_prefix(EVENT_PREFIX)?;
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    let (number, rest) = rest.split_at(digits);
    // JSON has no empty numbers and no leading zeros.
    if number.is_empty() || (number.len() > 1 && number[0] == b'0') {
        return None;
    }
    let seq = number
        .iter()
        .try_fold(0u64, |n, d| n.checked_mul(10)?.checked_add(u64::from(d - b'0')))?;
    let (thinking, rest) = match rest.strip_prefix(b",\"event\":{\"kind\":\"text_delta\",\"text\":\"") {
        Some(rest) => (false, rest),
        None => (
            true,
            rest.strip_prefix(b",\"event\":{\"kind\":\"thinking_delta\",\"text\":\"")?,
        ),
    };
    let rest = rest.strip_suffix(b"\n").unwrap_or(rest);
    let text = rest.strip_suffix(b"\"}}}")?;
    // A quote, a backslash or a control character: not this shape, or
    // escaped text (the general reader's work).
    if text.iter().any(|&b| b == b'"' || b == b'\\' || b < 0x20) {
        return None;
    }
    let text = std::str::from_utf8(text).ok()?.to_owned();
    let event = if thinking {
        ClientEvent::ThinkingDelta { text }
    } else {
        ClientEvent::TextDelta { text }
    };
    Some(Record::Event { seq, event })
}

/// One ledger line as a `Record` (delta lines by the direct readers above).
pub(crate) fn parse_line(line: &[u8]) -> serde_json::Result<Record> {
    if let Some(record) = plain_delta_line(line) {
        return Ok(record);
    }
    if let Ok(DeltaLine { event: record }) = serde_json::from_slice::<DeltaLine>(line) {
        let text = record.event.text;
        let event = match record.event.kind {
            DeltaKind::TextDelta => ClientEvent::TextDelta { text },
            DeltaKind::ThinkingDelta => ClientEvent::ThinkingDelta { text },
        };
        return Ok(Record::Event {
            seq: record.seq,
            event,
        });
    }
    serde_json::from_slice::<Record>(line)
}

/// `Record::Event` by reference, so a batch encodes frames without copying
/// their events (the same JSON as `Record`).
#[derive(Serialize)]
#[serde(rename_all = "snake_case")]
enum EventRef<'a> {
    Event { seq: u64, event: &'a ClientEvent },
}

/// Records encoded for one append, with where each event line starts.
#[derive(Default, Clone)]
pub struct Batch {
    bytes: Vec<u8>,
    /// (seq, offset of its line in `bytes`) for every event, in order.
    events: Vec<(u64, usize)>,
}

impl Batch {
    pub fn push_frame(&mut self, frame: &Frame) {
        let at = self.bytes.len();
        let line = EventRef::Event {
            seq: frame.seq,
            event: &frame.event,
        };
        // Serializing plain data into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut self.bytes, &line);
        self.bytes.push(b'\n');
        self.events.push((frame.seq, at));
    }

    pub fn push(&mut self, record: &Record) {
        let at = self.bytes.len();
        let _ = serde_json::to_writer(&mut self.bytes, record);
        self.bytes.push(b'\n');
        if let Record::Event { seq, .. } = record {
            self.events.push((*seq, at));
        }
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// Empties the batch and keeps its buffers, unless they hold more than
    /// `keep` bytes (then they are freed).
    pub fn clear_keeping(&mut self, keep: usize) {
        if self.bytes.capacity() > keep {
            *self = Batch::default();
        } else {
            self.bytes.clear();
            self.events.clear();
        }
    }

    /// Every record in order: its seq if it is an event, and its JSON line
    /// without the newline.
    pub fn records(&self) -> impl Iterator<Item = (Option<u64>, &[u8])> + '_ {
        self.lines().map(|(seq, at)| (seq, &self.bytes[at]))
    }

    /// Every record in order: its seq if it is an event, and where its JSON
    /// line lies in `bytes` (without the newline), so a replicated log can
    /// send several lines as one slice.
    pub fn lines(&self) -> impl Iterator<Item = (Option<u64>, std::ops::Range<usize>)> + '_ {
        let mut events = self.events.iter().peekable();
        let mut at = 0;
        std::iter::from_fn(move || {
            let end = at + memchr::memchr(b'\n', self.bytes.get(at..)?)?;
            let seq = events.next_if(|&&(_, o)| o == at).map(|&(seq, _)| seq);
            let line = at..end;
            at = end + 1;
            Some((seq, line))
        })
    }

    /// The batch's lines, each ending in a newline.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    pub fn len(&self) -> usize {
        self.bytes.len()
    }
}

/// Where a session's events are kept: append a batch, read a range, the last
/// durable seq. The JSONL `Ledger` is the one implementation today; a
/// replicated log can take its place without touching sessions or streams.
pub trait Log: Send + Sync + 'static {
    /// Appends `batch` whole, or fails having made none of it readable.
    fn append(&self, batch: &Batch) -> std::io::Result<()>;
    /// Whether an append waits on more than a `write`: a disk flush, a
    /// network round trip. Such appends get a blocking-pool thread each;
    /// the others share the few appender threads (log/appender.rs).
    fn append_waits(&self) -> bool {
        true
    }
    /// Up to `max` events with seq > `after`, in seq order, from what is durable.
    fn read_events(&self, after: u64, max: usize) -> Result<Vec<(u64, ClientEvent)>>;
    /// The highest seq appended so far (0: none).
    fn durable_seq(&self) -> u64;
    /// Forces what was appended to stable storage.
    fn sync(&self) -> std::io::Result<()>;
    /// The length of the file up to the last batch appended whole (a
    /// backup copies no further); None when the log is no file.
    fn committed_len(&self) -> Option<u64> {
        None
    }
}

/// How a snapshot line starts (`Record::Snapshot`, externally tagged).
pub(crate) const SNAPSHOT_PREFIX: &[u8] = b"{\"snapshot\":";
/// How a lost-range line starts (`Record::Lost`).
const LOST_PREFIX: &[u8] = b"{\"lost\":";
/// How an event line starts (`Record::Event`: seq is its first field).
const EVENT_PREFIX: &[u8] = b"{\"event\":{\"seq\":";

/// The seq of an event line, read from its prefix without parsing the rest.
pub(crate) fn event_seq(line: &[u8]) -> Option<u64> {
    let rest = line.strip_prefix(EVENT_PREFIX)?;
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    std::str::from_utf8(&rest[..digits]).ok()?.parse().ok()
}

/// A ledger line is indexed at least every this many bytes, so a read from
/// any seq parses at most this much before its first wanted line.
const MARK_EVERY: u64 = 64 * 1024;

/// What has been appended: the file's good length and the sparse index.
struct Written {
    len: u64,
    durable_seq: u64,
    /// (seq, offset of its line), seqs ascending.
    marks: Vec<(u64, u64)>,
}

impl Written {
    fn note(&mut self, seq: u64, offset: u64) {
        let due = self.marks.last().is_none_or(|&(_, at)| offset >= at + MARK_EVERY);
        if due {
            self.marks.push((seq, offset));
        }
        self.durable_seq = self.durable_seq.max(seq);
    }

    /// Where to start reading for seqs > `after`.
    fn start_for(&self, after: u64) -> u64 {
        let i = self
            .marks
            .partition_point(|&(seq, _)| seq <= after.saturating_add(1));
        if i == 0 {
            0
        } else {
            self.marks[i - 1].1
        }
    }
}

pub struct Ledger {
    path: PathBuf,
    durability: Durability,
    /// Held while the budget allows (`reserve`); None means open per append.
    /// Only the session's writer uses it, one append at a time: an append
    /// takes the file out for its write and fdatasync and puts it back
    /// after, so the lock is held for the take and the put only, never
    /// across the I/O (whoever finds the slot empty writes or syncs through a
    /// descriptor of its own).
    file: Mutex<Option<File>>,
    written: Mutex<Written>,
}

/// Why an existing ledger could not be opened.
#[derive(Debug)]
pub enum OpenError {
    /// It cannot be used at all (empty, or no header line): set it aside.
    Corrupt(String),
    /// Reading it failed (permissions, I/O).
    Io(Error),
}

impl Drop for Ledger {
    fn drop(&mut self) {
        if self.file.get_mut().is_ok_and(|f| f.is_some()) {
            release();
        }
    }
}

/// Keeps `file` if the budget has room, else closes it.
fn held(file: File) -> Option<File> {
    reserve().then_some(file)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A storage failure as clients see it: the session cannot go on.
pub fn storage_error(e: &std::io::Error) -> Error {
    crate::stopped::Stopped::Storage {
        kind: e.kind(),
        message: e.to_string(),
    }
    .into()
}

impl Ledger {
    /// Creates a new ledger at `path` and writes its header; fails if it
    /// exists. A header that cannot be written leaves no file behind.
    pub fn create(path: &Path, session_id: &str, created_at: &str, durability: Durability) -> Result<Ledger> {
        let header = Record::Header {
            session_id: session_id.to_string(),
            created_at: created_at.to_string(),
            workspace: String::new(),
        };
        Self::create_with(path, &header, durability)
    }

    /// `create` with the header given whole.
    pub fn create_with(path: &Path, header: &Record, durability: Durability) -> Result<Ledger> {
        let file = OpenOptions::new()
            .create_new(true)
            .append(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| storage_error(&e))?;
        let ledger = Ledger {
            path: path.to_path_buf(),
            durability,
            file: Mutex::new(held(file)),
            written: Mutex::new(Written {
                len: 0,
                durable_seq: 0,
                marks: Vec::new(),
            }),
        };
        let mut batch = Batch::default();
        batch.push(header);
        if let Err(e) = ledger.append(&batch) {
            drop(ledger);
            let _ = std::fs::remove_file(path);
            return Err(storage_error(&e));
        }
        Ok(ledger)
    }

    /// Opens an existing ledger and hands `visit` its header, then its last
    /// snapshot (if any) and every intact record after it, in order, a line
    /// at a time: the cost of a load follows what came after the last
    /// snapshot, not the whole history (earlier lines are only scanned for
    /// the seq index). A partial last line (a crash mid-write) is cut off; a
    /// corrupt line after the snapshot is reported with its file and line
    /// and left out (a replay across it gets a resync rather than a silent
    /// gap); an empty ledger or one with no header is `Corrupt`. Lost ranges
    /// (`Record::Lost`) are handed over wherever they are in the file.
    pub fn open(
        path: &Path,
        durability: Durability,
        mut visit: impl FnMut(Record),
    ) -> std::result::Result<Ledger, OpenError> {
        let io = |e: std::io::Error| {
            OpenError::Io(Error::internal(format!(
                "cannot read ledger {}: {e}",
                path.display()
            )))
        };
        let corrupt = |n: usize, why: String| OpenError::Corrupt(format!("{}:{n}: {why}", path.display()));
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .open(path)
            .map_err(io)?;
        // Ours, so owner-only, also when an earlier version left it readable.
        file.set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(io)?;
        let mut written = Written {
            len: 0,
            durable_seq: 0,
            marks: Vec::new(),
        };
        // Pass 1: the header, the seq index, and where the last snapshot starts.
        let mut resume = None;
        let mut line = Vec::new();
        let mut n = 0usize;
        {
            let mut reader = BufReader::with_capacity(256 * 1024, &file);
            loop {
                line.clear();
                if reader.read_until(b'\n', &mut line).map_err(io)? == 0 {
                    break;
                }
                if line.last() != Some(&b'\n') {
                    tracing::warn!(path = %path.display(), bytes = line.len(), "cutting a partial last ledger line");
                    file.set_len(written.len).map_err(io)?;
                    break;
                }
                n += 1;
                let at = written.len;
                written.len += line.len() as u64;
                if n == 1 {
                    match serde_json::from_slice::<Record>(&line) {
                        Ok(header @ Record::Header { .. }) => visit(header),
                        Ok(_) => return Err(corrupt(1, "the first line is not a ledger header".into())),
                        Err(e) => return Err(corrupt(1, format!("unreadable ledger header: {e}"))),
                    }
                    resume = Some((written.len, 2));
                } else if line.starts_with(SNAPSHOT_PREFIX) {
                    resume = Some((at, n));
                } else if let Some(seq) = event_seq(&line) {
                    written.note(seq, at);
                } else if line.starts_with(LOST_PREFIX) {
                    // Rare and small: a lost range stays known however many
                    // snapshots came after it (pass 2 may see it again).
                    if let Ok(lost @ Record::Lost { .. }) = serde_json::from_slice::<Record>(&line) {
                        visit(lost);
                    }
                }
            }
        }
        let Some((from, first_line)) = resume else {
            return Err(OpenError::Corrupt(format!(
                "{}: the ledger is empty",
                path.display()
            )));
        };
        // Pass 2: every record from the last snapshot on.
        file.seek(SeekFrom::Start(from)).map_err(io)?;
        {
            let mut reader = BufReader::with_capacity(256 * 1024, (&file).take(written.len - from));
            let mut n = first_line;
            loop {
                line.clear();
                if reader.read_until(b'\n', &mut line).map_err(io)? == 0 {
                    break;
                }
                if line.len() > 1 {
                    match parse_line(&line) {
                        Ok(r) => visit(r),
                        Err(e) => {
                            tracing::error!(path = %path.display(), line = n, "a corrupt ledger line is left out: {e}")
                        }
                    }
                }
                n += 1;
            }
        }
        file.seek(SeekFrom::End(0)).map_err(io)?;
        Ok(Ledger {
            path: path.to_path_buf(),
            durability,
            file: Mutex::new(held(file)),
            written: Mutex::new(written),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one event (a batch of one): tools and tests.
    pub fn append_event(&self, frame: &Frame) -> std::io::Result<()> {
        let mut batch = Batch::default();
        batch.push_frame(frame);
        self.append(&batch)
    }

    fn reopen(&self) -> std::io::Result<File> {
        OpenOptions::new().append(true).open(&self.path)
    }

    fn write_batch(&self, file: &mut File, batch: &Batch) -> std::io::Result<()> {
        file.write_all(&batch.bytes)?;
        if self.durability == Durability::Fsync {
            file.sync_data()?;
        }
        Ok(())
    }
}

impl Log for Ledger {
    fn append_waits(&self) -> bool {
        self.durability == Durability::Fsync
    }

    fn append(&self, batch: &Batch) -> std::io::Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        // Out of the slot for the I/O; put back below whatever happens. An
        // empty slot (no budget, or a sync holding it) means a descriptor
        // of this append's own, closed after it.
        let kept = lock(&self.file).take();
        let was_held = kept.is_some();
        let mut file = match kept {
            Some(f) => f,
            None => self.reopen()?,
        };
        let start = lock(&self.written).len;
        let written = self.write_batch(&mut file, batch);
        if written.is_err() {
            // Part of the batch may be on disk: cut it, so the file ends on
            // a whole line and nothing unseen is ever read back. If even that
            // fails, `open` cuts the partial tail on the next load.
            if let Err(cut) = file.set_len(start) {
                tracing::error!(path = %self.path.display(), "cannot cut a failed append: {cut}");
            }
        }
        if was_held {
            *lock(&self.file) = Some(file);
        }
        written?;
        let mut w = lock(&self.written);
        for &(seq, at) in &batch.events {
            w.note(seq, start + at as u64);
        }
        w.len = start + batch.bytes.len() as u64;
        Ok(())
    }

    fn read_events(&self, after: u64, max: usize) -> Result<Vec<(u64, ClientEvent)>> {
        let (from, len) = {
            let w = lock(&self.written);
            if w.durable_seq <= after {
                return Ok(Vec::new());
            }
            (w.start_for(after), w.len)
        };
        let mut file = File::open(&self.path)?;
        file.seek(SeekFrom::Start(from))?;
        let mut reader = BufReader::with_capacity(64 * 1024, file.take(len - from));
        let mut out = Vec::with_capacity(max.min(1024));
        let mut line = Vec::new();
        while out.len() < max {
            line.clear();
            if reader.read_until(b'\n', &mut line)? == 0 {
                break;
            }
            // Cheap skip of lines that are not events, or events before
            // `after` (a read starts up to `MARK_EVERY` bytes early).
            if !line.starts_with(b"{\"event\":") || event_seq(&line).is_some_and(|seq| seq <= after) {
                continue;
            }
            match parse_line(&line) {
                Ok(Record::Event { seq, event }) if seq > after => out.push((seq, event)),
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(path = %self.path.display(), "a corrupt ledger line is skipped in a replay: {e}")
                }
            }
        }
        Ok(out)
    }

    fn durable_seq(&self) -> u64 {
        lock(&self.written).durable_seq
    }

    fn committed_len(&self) -> Option<u64> {
        Some(lock(&self.written).len)
    }

    fn sync(&self) -> std::io::Result<()> {
        // Out of the slot for the I/O, like an append (an append meanwhile
        // writes through a descriptor of its own).
        let Some(file) = lock(&self.file).take() else {
            // fsync on any descriptor flushes the file's data.
            return self.reopen()?.sync_data();
        };
        let synced = file.sync_data();
        *lock(&self.file) = Some(file);
        synced
    }
}

/// What listing needs from a ledger without loading it: the header, the
/// first prompt and the last seq (read from the file's tail).
pub struct LedgerSummary {
    pub session_id: String,
    pub created_at: String,
    pub title: String,
    pub latest_seq: u64,
    /// The workspace the header names (empty in ledgers older than it).
    pub workspace: String,
}

pub fn summarize(path: &Path) -> Result<LedgerSummary> {
    let mut file = File::open(path)?;
    let mut reader = BufReader::new(&mut file);
    let mut summary = LedgerSummary {
        session_id: String::new(),
        created_at: String::new(),
        title: String::new(),
        latest_seq: 0,
        workspace: String::new(),
    };
    let mut line = String::new();
    for _ in 0..64 {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            break;
        }
        match serde_json::from_str::<Record>(&line) {
            Ok(Record::Header {
                session_id,
                created_at,
                workspace,
                ..
            }) => {
                summary.session_id = session_id;
                summary.created_at = created_at;
                summary.workspace = workspace;
            }
            Ok(Record::Event {
                event: ClientEvent::UserMessage { text, .. },
                ..
            }) => {
                summary.title = text.lines().next().unwrap_or_default().chars().take(80).collect();
                break;
            }
            _ => {}
        }
    }
    if summary.session_id.is_empty() {
        return Err(Error::internal(format!(
            "{} has no ledger header",
            path.display()
        )));
    }
    drop(reader);
    let len = file.seek(SeekFrom::End(0))?;
    let start = len.saturating_sub(256 * 1024);
    file.seek(SeekFrom::Start(start))?;
    let mut tail = Vec::new();
    file.read_to_end(&mut tail)?;
    // The last event line's seq, read from its prefix (a snapshot line in
    // the tail may be large and is never parsed here).
    // Only whole lines: a torn last line (a crash mid-write) is not an event.
    let whole = tail.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    for line in tail[..whole].split(|&b| b == b'\n').rev() {
        if let Some(seq) = event_seq(line) {
            summary.latest_seq = summary.latest_seq.max(seq);
            break;
        }
        // Seqs marked lost after the last event were issued too.
        if line.starts_with(LOST_PREFIX) {
            if let Ok(Record::Lost { to, .. }) = serde_json::from_slice(line) {
                summary.latest_seq = summary.latest_seq.max(to);
            }
        }
    }
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delta_lines_parse_directly_and_every_line_reads_as_record_would() {
        let delta = |event: ClientEvent| {
            serde_json::to_string(&EventRef::Event {
                seq: 7,
                event: &event,
            })
            .unwrap()
        };
        let lines = [
            delta(ClientEvent::TextDelta {
                text: "t1 \"quoted\" \u{e9}\n\u{1f600}".into(),
            }),
            delta(ClientEvent::ThinkingDelta { text: String::new() }),
            delta(ClientEvent::TurnStarted {
                request_id: "r".into(),
            }),
            // Keys in another order, an unknown field, a kind of another event.
            r#"{"event":{"event":{"text":"a","kind":"text_delta"},"seq":9}}"#.to_string(),
            r#"{"event":{"seq":9,"event":{"kind":"text_delta","text":"a","extra":1}}}"#.to_string(),
            r#"{"event":{"seq":9,"event":{"kind":"text_delta"}}}"#.to_string(),
            r#"{"event":{"seq":9,"event":{"kind":"tool_output","text":"a"}}}"#.to_string(),
            r#"{"header":{"session_id":"s","created_at":"t"}}"#.to_string(),
            r#"{"event":{"seq":"nine","event":{"kind":"text_delta","text":"a"}}}"#.to_string(),
            // Read by their bytes, or refused as the general reader refuses them.
            "{\"event\":{\"seq\":12,\"event\":{\"kind\":\"text_delta\",\"text\":\"t12 \u{e9}\"}}}\n"
                .to_string(),
            r#"{"event":{"seq":12,"event":{"kind":"thinking_delta","text":""}}}"#.to_string(),
            r#"{"event":{"seq":012,"event":{"kind":"text_delta","text":"a"}}}"#.to_string(),
            r#"{"event":{"seq":99999999999999999999,"event":{"kind":"text_delta","text":"a"}}}"#.to_string(),
            r#"{"event":{"seq":1,"event":{"kind":"text_delta","text":"a","x":"b"}}}"#.to_string(),
            "{\"event\":{\"seq\":1,\"event\":{\"kind\":\"text_delta\",\"text\":\"a\tb\"}}}".to_string(),
            "{\"event\":{\"seq\":1,\"event\":{\"kind\":\"text_delta\",\"text\":\"a\"}}} ".to_string(),
        ];
        assert!(plain_delta_line(lines[9].as_bytes()).is_some());
        assert!(plain_delta_line(lines[10].as_bytes()).is_some());
        for line in &lines {
            let direct = parse_line(line.as_bytes()).map_err(|e| e.to_string());
            let general = serde_json::from_str::<Record>(line).map_err(|e| e.to_string());
            assert_eq!(direct, general, "{line}");
        }
        assert_eq!(
            parse_line(lines[0].as_bytes()).unwrap(),
            Record::Event {
                seq: 7,
                event: ClientEvent::TextDelta {
                    text: "t1 \"quoted\" \u{e9}\n\u{1f600}".into()
                }
            }
        );
    }

    #[test]
    fn only_fsync_appends_wait_for_more_than_a_write() {
        let dir = tempfile::tempdir().unwrap();
        for (durability, waits) in [(Durability::Process, false), (Durability::Fsync, true)] {
            let path = dir.path().join(format!("{durability:?}.jsonl"));
            let l = Ledger::create(&path, "s", "2026-01-01T00:00:00Z", durability).unwrap();
            assert_eq!(l.append_waits(), waits, "{durability:?}");
        }
        // Any other log is taken to wait: it keeps a thread of its own.
        assert!(crate::log::memory::MemLog::default().append_waits());
    }

    fn open_fds() -> usize {
        std::fs::read_dir("/proc/self/fd").unwrap().count()
    }

    #[test]
    fn open_ledger_files_are_bounded_and_every_ledger_still_appends() {
        let dir = tempfile::tempdir().unwrap();
        let many = fd_budget() + 200;
        let before = open_fds();
        let ledgers: Vec<Ledger> = (0..many)
            .map(|i| {
                Ledger::create(
                    &dir.path().join(format!("{i}.jsonl")),
                    "s",
                    "t",
                    Durability::Process,
                )
                .unwrap()
            })
            .collect();
        // Other tests in this process open files too: allow them some slack.
        let bound = fd_budget() + 32;
        let grown = open_fds().saturating_sub(before);
        assert!(
            grown <= bound,
            "{grown} fds for {many} ledgers (budget {})",
            fd_budget()
        );
        for (i, l) in ledgers.iter().enumerate() {
            let f = Frame::new(1, "s".into(), ClientEvent::TextDelta { text: format!("{i}") });
            l.append_event(&f).unwrap();
            l.sync().unwrap();
        }
        assert!(open_fds().saturating_sub(before) <= bound);
        let last = dir.path().join(format!("{}.jsonl", many - 1));
        let mode = std::fs::metadata(&last).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "ledgers are owner-only");
        drop(ledgers);
        let mut records = Vec::new();
        Ledger::open(&last, Durability::Process, |r| records.push(r)).unwrap();
        assert_eq!(
            records.len(),
            2,
            "the header and the event past the budget: {records:?}"
        );
    }

    #[test]
    fn a_cleared_batch_keeps_no_record_and_frees_a_buffer_over_the_bound() {
        let frame =
            |seq: u64, text: &str| Frame::new(seq, "s".into(), ClientEvent::TextDelta { text: text.into() });
        let mut b = Batch::default();
        b.push_frame(&frame(1, "one"));
        b.push(&Record::Admitted {
            request_id: "r".into(),
        });
        b.clear_keeping(1 << 20);
        assert!(b.is_empty() && b.records().next().is_none());
        assert!(b.bytes.capacity() > 0, "kept for the next batch");
        b.push_frame(&frame(7, "seven"));
        let records: Vec<(Option<u64>, String)> = b
            .records()
            .map(|(seq, line)| (seq, String::from_utf8_lossy(line).into_owned()))
            .collect();
        assert_eq!(records.len(), 1, "{records:?}");
        assert_eq!(records[0].0, Some(7));
        assert!(records[0].1.contains("seven"), "{records:?}");
        b.clear_keeping(4);
        assert_eq!(b.bytes.capacity(), 0, "over the bound: freed");
    }

    #[test]
    fn a_partial_last_line_is_cut_and_earlier_lines_survive() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.jsonl");
        let l = Ledger::create(&path, "s", "2026-01-01T00:00:00Z", Durability::Process).unwrap();
        let f = Frame::new(1, "s".into(), ClientEvent::TextDelta { text: "hi".into() });
        l.append_event(&f).unwrap();
        drop(l);
        // A crash mid-write leaves half a line.
        let mut raw = OpenOptions::new().append(true).open(&path).unwrap();
        raw.write_all(br#"{"event":{"seq":2,"ev"#).unwrap();
        drop(raw);

        let mut records = Vec::new();
        let l = Ledger::open(&path, Durability::Process, |r| records.push(r)).unwrap();
        assert_eq!(records.len(), 2);
        assert_eq!(
            records[1],
            Record::Event {
                seq: 1,
                event: ClientEvent::TextDelta { text: "hi".into() }
            }
        );
        l.append_event(&Frame::new(2, "s".into(), ClientEvent::status(false)))
            .unwrap();
        drop(l);
        let mut records = Vec::new();
        Ledger::open(&path, Durability::Process, |r| records.push(r)).unwrap();
        assert_eq!(records.len(), 3, "the new line starts on a line of its own");
        let s = summarize(&path).unwrap();
        assert_eq!((s.session_id.as_str(), s.latest_seq), ("s", 2));
    }
}
