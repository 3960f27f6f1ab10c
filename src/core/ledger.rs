//! The per-session append-only JSONL ledger: the durable record that transcripts, seq numbering and replay are rebuilt from after a restart.
//!
//! Every record is one line written with a single `write` call on a file
//! opened for appending, so a crash can only ever leave a partial *last*
//! line; `open` cuts such a tail off before appending again.
//!
//! Ledgers are owner-only (0600), and the files held open are bounded
//! process-wide (`fd_budget`): past the budget a ledger opens its file for
//! each append and closes it again, so many sessions never exhaust the fd table.

use super::event::{ClientEvent, Frame};
use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

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
    Header { session_id: String, created_at: String },
    /// A client event with the seq it was published under.
    Event { seq: u64, event: ClientEvent },
    /// An input was admitted under this request id (so a retry stays a
    /// duplicate after a restart, even if the input never ran).
    Admitted { request_id: String },
    /// Tokens one provider turn consumed.
    Usage { input_tokens: u64, output_tokens: u64 },
}

pub struct Ledger {
    path: PathBuf,
    /// Held while the budget allows (`reserve`); None means open per append.
    file: Mutex<Option<File>>,
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

impl Ledger {
    /// Creates a new ledger at `path` and writes its header; fails if it exists.
    pub fn create(path: &Path, session_id: &str, created_at: &str) -> Result<Ledger> {
        let file = OpenOptions::new()
            .create_new(true)
            .append(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| Error::internal(format!("cannot create ledger {}: {e}", path.display())))?;
        let ledger = Ledger {
            path: path.to_path_buf(),
            file: Mutex::new(held(file)),
        };
        ledger.append(&Record::Header {
            session_id: session_id.to_string(),
            created_at: created_at.to_string(),
        })?;
        Ok(ledger)
    }

    /// Opens an existing ledger, returning every intact record. A partial
    /// last line (a crash mid-write) is cut off; a corrupt line in the middle
    /// is skipped with a warning rather than losing what follows it.
    pub fn open(path: &Path) -> Result<(Ledger, Vec<Record>)> {
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .open(path)
            .map_err(|e| Error::internal(format!("cannot open ledger {}: {e}", path.display())))?;
        // Ours, so owner-only, also when an earlier version left it readable.
        file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        let mut data = Vec::new();
        file.read_to_end(&mut data)?;
        let complete = data.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        if complete < data.len() {
            tracing::warn!(path = %path.display(), bytes = data.len() - complete, "cutting a partial last ledger line");
            file.set_len(complete as u64)?;
            file.seek(SeekFrom::End(0))?;
        }
        let mut records = Vec::new();
        for (n, line) in data[..complete].split(|&b| b == b'\n').enumerate() {
            if line.is_empty() {
                continue;
            }
            match serde_json::from_slice::<Record>(line) {
                Ok(r) => records.push(r),
                Err(e) => {
                    tracing::warn!(path = %path.display(), line = n + 1, "skipping a corrupt ledger line: {e}")
                }
            }
        }
        Ok((
            Ledger {
                path: path.to_path_buf(),
                file: Mutex::new(held(file)),
            },
            records,
        ))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn append(&self, record: &Record) -> Result<()> {
        let mut line = serde_json::to_vec(record).map_err(|e| Error::internal(e.to_string()))?;
        line.push(b'\n');
        let mut slot = self.file.lock().unwrap_or_else(|p| p.into_inner());
        match slot.as_mut() {
            Some(file) => file.write_all(&line)?,
            None => {
                let mut file = self.reopen()?;
                file.write_all(&line)?;
                *slot = held(file);
            }
        }
        Ok(())
    }

    fn reopen(&self) -> Result<File> {
        OpenOptions::new()
            .append(true)
            .open(&self.path)
            .map_err(|e| Error::internal(format!("cannot open ledger {}: {e}", self.path.display())))
    }

    pub fn append_event(&self, frame: &Frame) -> Result<()> {
        self.append(&Record::Event {
            seq: frame.seq,
            event: frame.event.clone(),
        })
    }

    /// Forces what was written to stable storage (shutdown).
    pub fn sync(&self) -> Result<()> {
        let slot = self.file.lock().unwrap_or_else(|p| p.into_inner());
        match slot.as_ref() {
            Some(file) => file.sync_data()?,
            // fsync on any descriptor flushes the file's data.
            None => self.reopen()?.sync_data()?,
        }
        Ok(())
    }
}

/// What listing needs from a ledger without loading it: the header, the
/// first prompt and the last seq (read from the file's tail).
pub struct LedgerSummary {
    pub session_id: String,
    pub created_at: String,
    pub title: String,
    pub latest_seq: u64,
}

pub fn summarize(path: &Path) -> Result<LedgerSummary> {
    let mut file = File::open(path)?;
    let mut reader = BufReader::new(&mut file);
    let mut summary = LedgerSummary {
        session_id: String::new(),
        created_at: String::new(),
        title: String::new(),
        latest_seq: 0,
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
            }) => {
                summary.session_id = session_id;
                summary.created_at = created_at;
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
    for line in tail.split(|&b| b == b'\n').rev() {
        if let Ok(Record::Event { seq, .. }) = serde_json::from_slice::<Record>(line) {
            summary.latest_seq = seq;
            break;
        }
    }
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open_fds() -> usize {
        std::fs::read_dir("/proc/self/fd").unwrap().count()
    }

    #[test]
    fn open_ledger_files_are_bounded_and_every_ledger_still_appends() {
        let dir = tempfile::tempdir().unwrap();
        let many = fd_budget() + 200;
        let before = open_fds();
        let ledgers: Vec<Ledger> = (0..many)
            .map(|i| Ledger::create(&dir.path().join(format!("{i}.jsonl")), "s", "t").unwrap())
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
        let (_, records) = Ledger::open(&last).unwrap();
        assert_eq!(
            records.len(),
            2,
            "the header and the event past the budget: {records:?}"
        );
    }

    #[test]
    fn a_partial_last_line_is_cut_and_earlier_lines_survive() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.jsonl");
        let l = Ledger::create(&path, "s", "2026-01-01T00:00:00Z").unwrap();
        let f = Frame::new(1, "s".into(), ClientEvent::TextDelta { text: "hi".into() });
        l.append_event(&f).unwrap();
        drop(l);
        // A crash mid-write leaves half a line.
        let mut raw = OpenOptions::new().append(true).open(&path).unwrap();
        raw.write_all(br#"{"event":{"seq":2,"ev"#).unwrap();
        drop(raw);

        let (l, records) = Ledger::open(&path).unwrap();
        assert_eq!(records.len(), 2);
        assert_eq!(
            records[1],
            Record::Event {
                seq: 1,
                event: ClientEvent::TextDelta { text: "hi".into() }
            }
        );
        l.append_event(&Frame::new(2, "s".into(), ClientEvent::Status { busy: false }))
            .unwrap();
        drop(l);
        let (_, records) = Ledger::open(&path).unwrap();
        assert_eq!(records.len(), 3, "the new line starts on a line of its own");
        let s = summarize(&path).unwrap();
        assert_eq!((s.session_id.as_str(), s.latest_seq), ("s", 2));
    }
}
