//! The files behind a session's lifecycle: a deleted ledger moved to the home's trash, a chosen title kept beside the ledger, a fork's ledger copied from its parent's up to a seq.
//!
//! Every function here blocks: the session registry (`host/registry/lifecycle.rs`) calls them through `spawn_blocking`.

use crate::error::{Error, Result};
use crate::log::ledger::{self, Record};
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// A title is at most this many characters (of the first line of the first prompt).
pub(crate) const TITLE_CHARS: usize = 80;
/// A title is 1 to this many characters (the same cap as a derived title).
pub(crate) const MAX_TITLE_CHARS: usize = TITLE_CHARS;

/// A title a client chose: trimmed, one line, no control characters.
pub(crate) fn validate_title(title: &str) -> Result<String> {
    let t = title.trim();
    let chars = t.chars().count();
    if chars == 0 || chars > MAX_TITLE_CHARS {
        return Err(Error::invalid(format!(
            "title must be 1 to {MAX_TITLE_CHARS} characters (it has {chars})"
        )));
    }
    if t.chars().any(char::is_control) {
        return Err(Error::invalid(
            "title must be one line without control characters",
        ));
    }
    Ok(t.to_string())
}

/// `sessions/<id>.title`: the title a client chose, which wins over the one
/// derived from the first prompt (also when the index is rebuilt).
pub(crate) fn title_path(sessions: &Path, id: &str) -> PathBuf {
    sessions.join(format!("{id}.title"))
}

/// The chosen title of `id`, if any (a damaged file counts as none).
pub(crate) fn read_title(sessions: &Path, id: &str) -> Option<String> {
    let text = std::fs::read(title_path(sessions, id)).ok()?;
    if text.len() > 4 * MAX_TITLE_CHARS + 1 {
        return None;
    }
    validate_title(std::str::from_utf8(&text).ok()?).ok()
}

/// Writes the chosen title atomically (temp file, fsync, rename), owner-only.
pub(crate) fn write_title(sessions: &Path, id: &str, title: &str) -> Result<()> {
    let path = title_path(sessions, id);
    let tmp = sessions.join(format!(".{id}.title.{}.tmp", short_uuid()));
    let written = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(title.as_bytes())?;
        f.sync_data()?;
        std::fs::rename(&tmp, &path)
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(ledger::storage_error(&e));
    }
    Ok(())
}

fn short_uuid() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..12].to_string()
}

/// `home/trash/`: where deleted sessions' ledgers go (owner-only). Nothing
/// reads it; a person can restore a ledger by moving it back to `sessions/`.
pub(crate) fn trash_dir(home: &Path) -> PathBuf {
    home.join("trash")
}

/// Moves the ledger of `id` (and its title file) to the trash as
/// `<id>.<unix seconds>.jsonl`; returns where it went.
pub(crate) fn move_to_trash(home: &Path, sessions: &Path, id: &str) -> Result<PathBuf> {
    let trash = trash_dir(home);
    crate::home::create_private_dir(&trash).map_err(|e| ledger::storage_error(&e))?;
    let stamp = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let to = trash.join(format!("{id}.{stamp}.jsonl"));
    let from = sessions.join(format!("{id}.jsonl"));
    std::fs::rename(&from, &to).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Error::not_found(format!("no session {id}")),
        _ => ledger::storage_error(&e),
    })?;
    let title = title_path(sessions, id);
    if title.exists() {
        let _ = std::fs::rename(&title, trash.join(format!("{id}.{stamp}.title")));
    }
    Ok(to)
}

/// Writes the ledger of a fork `child` of the ledger at `parent`: a header
/// of its own, then every event of the parent with seq <= `at_seq` (same
/// seqs, byte for byte) and the notes the model needs among them (usage,
/// thinking signatures, compactions), up to the first later event.
/// Admissions and snapshots stay with the parent: the fork's folds are
/// rebuilt from its events when it loads. Written to a temp file renamed
/// into place, so a half-made fork never lists or loads. Returns the seq of
/// the last event copied.
pub(crate) fn fork_ledger(
    parent: &Path,
    child: &Path,
    child_id: &str,
    created_at: &str,
    workspace: &str,
    at_seq: u64,
) -> Result<u64> {
    let tmp = child.with_extension(format!("fork.{}.tmp", short_uuid()));
    let result = (|| -> Result<u64> {
        let src = File::open(parent).map_err(|e| ledger::storage_error(&e))?;
        let mut out = std::io::BufWriter::new(
            OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&tmp)
                .map_err(|e| ledger::storage_error(&e))?,
        );
        let io = |e: std::io::Error| ledger::storage_error(&e);
        let header = Record::Header {
            session_id: child_id.to_string(),
            created_at: created_at.to_string(),
            workspace: workspace.to_string(),
        };
        serde_json::to_writer(&mut out, &header).map_err(|e| Error::internal(e.to_string()))?;
        out.write_all(b"\n").map_err(io)?;
        let mut reader = BufReader::with_capacity(256 * 1024, src);
        let mut line = Vec::new();
        let mut last = 0;
        let mut first = true;
        loop {
            line.clear();
            if reader.read_until(b'\n', &mut line).map_err(io)? == 0 {
                break;
            }
            // A torn last line (a crash mid-write) is not history.
            if line.last() != Some(&b'\n') {
                break;
            }
            if std::mem::take(&mut first) {
                continue; // the parent's header
            }
            if let Some(seq) = ledger::event_seq(&line) {
                if seq > at_seq {
                    break;
                }
                last = seq;
                out.write_all(&line).map_err(io)?;
                continue;
            }
            if line.starts_with(ledger::SNAPSHOT_PREFIX) {
                continue;
            }
            let keep = match serde_json::from_slice::<Record>(&line) {
                Ok(Record::Usage(_) | Record::Signature { .. } | Record::Compaction(_) | Record::Undo(_)) => {
                    true
                }
                // A range lost before the fork point stays lost in the fork.
                Ok(Record::Lost { to, .. }) => to <= at_seq,
                _ => false,
            };
            if keep {
                out.write_all(&line).map_err(io)?;
            }
        }
        let file = out.into_inner().map_err(|e| io(e.into_error()))?;
        file.sync_data().map_err(io)?;
        std::fs::rename(&tmp, child).map_err(io)?;
        Ok(last)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn titles_are_one_bounded_line() {
        assert_eq!(validate_title("  hello  ").unwrap(), "hello");
        assert!(validate_title("").is_err());
        assert!(validate_title("a\nb").is_err());
        assert!(validate_title(&"x".repeat(MAX_TITLE_CHARS + 1)).is_err());
        let dir = tempfile::tempdir().unwrap();
        write_title(dir.path(), "s", "named").unwrap();
        assert_eq!(read_title(dir.path(), "s").as_deref(), Some("named"));
        assert_eq!(read_title(dir.path(), "other"), None);
    }
}
