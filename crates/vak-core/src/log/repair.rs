//! Damaged ledgers on load: a ledger cut short of the seqs it issued gets the missing range marked lost (never reissued), and a damaged header is rebuilt from the file name when the rest of the ledger agrees.
//!
//! A ledger is only ever appended to, so damage comes from outside vak (a
//! disk, a backup tool, a person): a file cut in the middle, or flipped
//! bytes. What a client saw must stay true: a seq once issued is never
//! issued again with other content, so a ledger shorter than the session
//! index recorded gets a `Record::Lost {from, to}` appended and numbers new
//! events after `to`, and readers whose cursor falls in the range get
//! `resync {reason: history_lost, from, to}` (`bus.rs`). A header that
//! fails its check costs the session only when it cannot be rebuilt.

use crate::error::{Error, Result};
use crate::log::ledger::{Batch, Ledger, Log, Record};
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::SystemTime;

/// Lost ranges a session keeps (oldest dropped first): each is one damage
/// found on a load, so more than this many means the disk is the problem.
const MAX_LOST_RANGES: usize = 64;
/// A header line longer than this is not one vak wrote.
const MAX_HEADER_BYTES: u64 = 64 * 1024;
/// How many records after the header must agree before it is rebuilt.
const AGREEING_RECORDS: usize = 16;

/// Adds the lost range `from..=to` to `lost` (kept sorted, overlaps merged,
/// at most `MAX_LOST_RANGES`).
pub(crate) fn note_lost(lost: &mut Vec<(u64, u64)>, from: u64, to: u64) {
    if from > to {
        return;
    }
    lost.push((from, to));
    lost.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(lost.len());
    for &(f, t) in lost.iter() {
        match merged.last_mut() {
            Some(last) if f <= last.1.saturating_add(1) => last.1 = last.1.max(t),
            _ => merged.push((f, t)),
        }
    }
    let excess = merged.len().saturating_sub(MAX_LOST_RANGES);
    merged.drain(..excess);
    *lost = merged;
}

/// If seqs up to `recorded` were issued but the ledger covers only up to
/// `covered` (its last event, snapshot or earlier lost range), appends
/// `Record::Lost` for the difference and returns it, so the caller numbers
/// on after it. Blocking (one append).
pub(crate) fn mark_lost(ledger: &Ledger, covered: u64, recorded: u64) -> Result<Option<Record>> {
    if recorded <= covered {
        return Ok(None);
    }
    let (from, to) = (covered + 1, recorded);
    tracing::error!(
        path = %ledger.path().display(),
        ledger_seq = covered,
        recorded_seq = recorded,
        "the ledger ends before the seq the session index recorded: events {from}..={to} are lost; new events number from {}",
        to + 1
    );
    let lost = Record::Lost { from, to };
    let mut batch = Batch::default();
    batch.push(&lost);
    ledger
        .append(&batch)
        .map_err(|e| crate::log::ledger::storage_error(&e))?;
    Ok(Some(lost))
}

/// What the session index remembers of a session, preferred over what a
/// damaged header still shows.
pub(crate) struct Remembered {
    pub(crate) created_at: String,
    pub(crate) workspace: String,
}

/// The outcome of checking a ledger's header.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum HeaderCheck {
    Sound,
    /// It failed its check and was rewritten from the file name.
    Rebuilt,
}

/// Why a header could not be rebuilt (the ledger is set aside as before).
#[derive(Debug)]
pub(crate) enum Unrepairable {
    /// Reading or rewriting the file failed.
    Io(Error),
    /// The file is no ledger this session can be rebuilt from.
    Damaged(String),
}

/// Checks the header of ledger `path`, whose file name says it is session
/// `id`: a sound header parses and names `id`. One that does not parse, or
/// names an id one byte away from `id` (a flipped byte), is rebuilt when
/// the records after it agree (they parse, and the first event is seq 1):
/// its id from the file name, its time and workspace from `known` (the
/// session index) or else from what the damaged line still shows. A header
/// naming another session entirely is not ours to rename. Blocking.
pub(crate) fn check_header(
    path: &Path,
    id: &str,
    known: Option<&Remembered>,
) -> std::result::Result<HeaderCheck, Unrepairable> {
    let io = |e: std::io::Error| Unrepairable::Io(Error::from(e));
    let damaged = |why: String| Unrepairable::Damaged(format!("{}: {why}", path.display()));
    let file = File::open(path).map_err(io)?;
    let mut reader = BufReader::new(file);
    let mut first = Vec::new();
    (&mut reader)
        .take(MAX_HEADER_BYTES)
        .read_until(b'\n', &mut first)
        .map_err(io)?;
    if first.last() != Some(&b'\n') {
        return Err(damaged("no whole header line".into()));
    }
    let why = match serde_json::from_slice::<Record>(&first) {
        Ok(Record::Header { session_id, .. }) if session_id == id => return Ok(HeaderCheck::Sound),
        Ok(Record::Header { session_id, .. }) if one_byte_apart(&session_id, id) => {
            format!("its header names session {session_id:?}, one byte from its file name")
        }
        Ok(Record::Header { session_id, .. }) => {
            return Err(damaged(format!(
                "its header names another session, {session_id:?}"
            )))
        }
        Ok(_) => "its first line is not a header".to_string(),
        Err(e) => format!("unreadable header: {e}"),
    };
    agree(&mut reader).map_err(|e| damaged(format!("{why}, and {e}")))?;
    let header = Record::Header {
        session_id: id.to_string(),
        created_at: known
            .map(|k| k.created_at.clone())
            .filter(|c| !c.is_empty())
            .or_else(|| salvage(&first, "created_at").filter(|c| humantime::parse_rfc3339(c).is_ok()))
            .unwrap_or_else(|| modified(path)),
        workspace: known
            .map(|k| k.workspace.clone())
            .filter(|w| !w.is_empty())
            .or_else(|| {
                salvage(&first, "workspace").filter(|w| Path::new(w).is_absolute() && Path::new(w).is_dir())
            })
            .unwrap_or_default(),
    };
    rewrite(path, &header, first.len() as u64).map_err(io)?;
    tracing::warn!(
        path = %path.display(),
        damaged = %String::from_utf8_lossy(&first[..first.len().min(512)]).trim_end(),
        "{why}: the header was rebuilt from the file name and the records after it"
    );
    Ok(HeaderCheck::Rebuilt)
}

/// Whether two ids of the same length differ in exactly one byte, and are
/// long enough (vak's ids are 32 characters) for that to mean a flipped
/// byte rather than another name.
fn one_byte_apart(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.len() >= 8 && a.bytes().zip(b.bytes()).filter(|(x, y)| x != y).count() == 1
}

/// The records after the header look like a ledger's: each whole line up to
/// `AGREEING_RECORDS` parses as a record that is no header, and among them
/// is the first event, seq 1.
fn agree(reader: &mut impl BufRead) -> std::result::Result<(), String> {
    let mut line = Vec::new();
    let mut first_event = None;
    for n in 2..2 + AGREEING_RECORDS {
        line.clear();
        reader
            .take(MAX_HEADER_BYTES * 16)
            .read_until(b'\n', &mut line)
            .map_err(|e| e.to_string())?;
        // The end, or a torn last line (a crash mid-write).
        if line.last() != Some(&b'\n') {
            break;
        }
        match serde_json::from_slice::<Record>(&line) {
            Ok(Record::Header { .. }) => return Err(format!("line {n} is a second header")),
            Ok(Record::Event { seq, .. }) if first_event.is_none() => first_event = Some(seq),
            Ok(_) => {}
            Err(e) => return Err(format!("line {n} is unreadable too: {e}")),
        }
    }
    // Nothing after the header is nothing to keep: such a file is set aside.
    match first_event {
        Some(1) => Ok(()),
        Some(seq) => Err(format!("its first event is seq {seq}, not 1")),
        None => Err("no event follows it".to_string()),
    }
}

/// The string value of `"key":"…"` in a damaged line, if it still reads.
fn salvage(line: &[u8], key: &str) -> Option<String> {
    let pattern = format!("\"{key}\":");
    let at = memchr::memmem::find(line, pattern.as_bytes())? + pattern.len();
    serde_json::Deserializer::from_slice(&line[at..])
        .into_iter::<String>()
        .next()?
        .ok()
}

/// The file's modification time as RFC 3339: the best creation time left.
fn modified(path: &Path) -> String {
    let at = std::fs::metadata(path)
        .and_then(|m| m.modified())
        .unwrap_or_else(|_| SystemTime::now());
    humantime::format_rfc3339_seconds(at).to_string()
}

/// Writes `header` and everything after the first `skip` bytes of `path` to
/// a temporary file beside it, syncs it and renames it over `path`.
fn rewrite(path: &Path, header: &Record, skip: u64) -> std::io::Result<()> {
    let tmp = path.with_extension("jsonl.repair");
    let result = (|| {
        let mut out = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        let mut line = serde_json::to_vec(header).map_err(std::io::Error::other)?;
        line.push(b'\n');
        out.write_all(&line)?;
        let mut src = File::open(path)?;
        std::io::copy(&mut (&mut src).take(skip), &mut std::io::sink())?;
        std::io::copy(&mut src, &mut out)?;
        out.sync_all()?;
        std::fs::rename(&tmp, path)?;
        if let Some(dir) = path.parent() {
            File::open(dir)?.sync_all()?;
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{ClientEvent, Frame};
    use crate::Durability;

    fn ledger(dir: &Path, id: &str, events: u64) -> std::path::PathBuf {
        let path = dir.join(format!("{id}.jsonl"));
        let header = Record::Header {
            session_id: id.into(),
            created_at: "2026-12-01T10:00:00Z".into(),
            workspace: dir.display().to_string(),
        };
        let l = Ledger::create_with(&path, &header, Durability::Process).unwrap();
        for seq in 1..=events {
            l.append_event(&Frame::new(
                seq,
                id.into(),
                ClientEvent::TextDelta {
                    text: format!("d{seq}"),
                },
            ))
            .unwrap();
        }
        path
    }

    fn records(path: &Path) -> Vec<Record> {
        let mut out = Vec::new();
        Ledger::open(path, Durability::Process, |r| out.push(r)).unwrap();
        out
    }

    #[test]
    fn lost_ranges_merge_stay_sorted_and_are_bounded() {
        let mut lost = Vec::new();
        note_lost(&mut lost, 10, 20);
        note_lost(&mut lost, 5, 7);
        note_lost(&mut lost, 21, 30);
        note_lost(&mut lost, 10, 20);
        assert_eq!(lost, vec![(5, 7), (10, 30)]);
        note_lost(&mut lost, 9, 3);
        assert_eq!(lost, vec![(5, 7), (10, 30)], "an empty range is nothing");
        for i in 0..100u64 {
            note_lost(&mut lost, 1000 + i * 10, 1000 + i * 10 + 1);
        }
        assert_eq!(lost.len(), MAX_LOST_RANGES);
        assert_eq!(lost.last(), Some(&(1990, 1991)), "the newest are kept");
    }

    #[test]
    fn a_ledger_cut_short_of_the_recorded_seq_gets_the_range_marked_lost_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = ledger(dir.path(), "s1", 3);
        let l = Ledger::open(&path, Durability::Process, |_| {}).unwrap();
        assert!(mark_lost(&l, 3, 3).unwrap().is_none(), "nothing lost");
        let lost = mark_lost(&l, 3, 9).unwrap();
        assert_eq!(lost, Some(Record::Lost { from: 4, to: 9 }));
        drop(l);
        let back = records(&path);
        assert_eq!(
            back.last(),
            Some(&Record::Lost { from: 4, to: 9 }),
            "durable: {back:?}"
        );
        let s = crate::log::ledger::summarize(&path).unwrap();
        assert_eq!(s.latest_seq, 9, "listing counts the lost seqs as issued");
    }

    #[test]
    fn a_header_with_a_flipped_byte_is_rebuilt_and_the_events_survive() {
        let dir = tempfile::tempdir().unwrap();
        let id = "a1b2c3d4e5";
        let path = ledger(dir.path(), id, 20);
        let before = records(&path);
        let mut raw = std::fs::read(&path).unwrap();
        // Break the JSON: the opening brace becomes something else.
        raw[0] ^= 0x20;
        std::fs::write(&path, &raw).unwrap();
        assert!(
            Ledger::open(&path, Durability::Process, |_| {}).is_err(),
            "damaged"
        );
        let known = Remembered {
            created_at: "2026-12-01T10:00:00Z".into(),
            workspace: String::new(),
        };
        assert_eq!(
            check_header(&path, id, Some(&known)).unwrap(),
            HeaderCheck::Rebuilt
        );
        let after = records(&path);
        assert_eq!(after.len(), before.len());
        assert_eq!(after[1..], before[1..], "every event intact");
        match &after[0] {
            Record::Header {
                session_id,
                created_at,
                workspace,
            } => {
                assert_eq!(session_id, id);
                assert_eq!(created_at, "2026-12-01T10:00:00Z");
                assert_eq!(
                    workspace,
                    &dir.path().display().to_string(),
                    "salvaged from the line"
                );
            }
            other => panic!("not a header: {other:?}"),
        }
        assert_eq!(check_header(&path, id, None).unwrap(), HeaderCheck::Sound);

        // A flipped byte inside the id: one byte from the file name.
        let mut raw = std::fs::read(&path).unwrap();
        let at = memchr::memmem::find(&raw, b"a1b2c3d4e5").unwrap();
        raw[at + 2] = b'x';
        std::fs::write(&path, &raw).unwrap();
        assert_eq!(check_header(&path, id, None).unwrap(), HeaderCheck::Rebuilt);
        assert_eq!(records(&path)[1..], before[1..]);
    }

    #[test]
    fn a_header_is_not_rebuilt_when_the_rest_disagrees_or_names_another_session() {
        let dir = tempfile::tempdir().unwrap();
        let path = ledger(dir.path(), "s2", 5);
        let mut raw = std::fs::read(&path).unwrap();
        raw[0] = b'x';
        // The second line is damaged too.
        let nl = raw.iter().position(|&b| b == b'\n').unwrap();
        raw[nl + 1] = b'x';
        std::fs::write(&path, &raw).unwrap();
        assert!(matches!(
            check_header(&path, "s2", None),
            Err(Unrepairable::Damaged(_))
        ));
        assert_eq!(std::fs::read(&path).unwrap(), raw, "left as it was");

        let other = ledger(dir.path(), "other-session", 2);
        let copy = dir.path().join("s3.jsonl");
        std::fs::copy(&other, &copy).unwrap();
        assert!(matches!(
            check_header(&copy, "s3", None),
            Err(Unrepairable::Damaged(_))
        ));
    }
}
