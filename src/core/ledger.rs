//! The per-session append-only JSONL ledger: the durable record that transcripts, seq numbering and replay are rebuilt from after a restart.
//!
//! Every record is one line written with a single `write` call on a file
//! opened for appending, so a crash can only ever leave a partial *last*
//! line; `open` cuts such a tail off before appending again.

use super::event::{ClientEvent, Frame};
use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

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
    file: Mutex<File>,
}

impl Ledger {
    /// Creates a new ledger at `path` and writes its header; fails if it exists.
    pub fn create(path: &Path, session_id: &str, created_at: &str) -> Result<Ledger> {
        let file = OpenOptions::new()
            .create_new(true)
            .append(true)
            .open(path)
            .map_err(|e| Error::internal(format!("cannot create ledger {}: {e}", path.display())))?;
        let ledger = Ledger {
            path: path.to_path_buf(),
            file: Mutex::new(file),
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
                file: Mutex::new(file),
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
        let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        file.write_all(&line)?;
        Ok(())
    }

    pub fn append_event(&self, frame: &Frame) -> Result<()> {
        self.append(&Record::Event {
            seq: frame.seq,
            event: frame.event.clone(),
        })
    }

    /// Forces what was written to stable storage (shutdown).
    pub fn sync(&self) -> Result<()> {
        let file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        file.sync_data()?;
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
