//! Writing a backup: every file of the home a backup holds, ledgers cut at their last complete record, then `manifest.json`.

use super::{
    copy_hashing, io_err, outside_home, FileEntry, Manifest, FORMAT, FORMAT_VERSION, MANIFEST, SECRET_FILES,
};
use crate::error::{Error, Result};
use crate::ids::validate_session_id;
use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// What an export wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exported {
    pub dest_dir: PathBuf,
    pub sessions: u32,
    /// Files and bytes, the manifest included.
    pub files: u64,
    pub bytes: u64,
    pub manifest: PathBuf,
}

/// One file to copy.
struct Source {
    rel: String,
    path: PathBuf,
    /// An append-only JSONL file (a session ledger, a cost day file):
    /// copied only up to its last complete line.
    append_only: bool,
}

/// Writes a backup of `home` to `dest_dir` (absolute, outside the home,
/// missing or empty). Safe beside a running server: ledgers are copied up to
/// their last complete record, every other file the home keeps is replaced
/// by rename, so a copy is always one whole version. Blocking.
pub fn export(home: &Path, dest_dir: &str, include_secrets: bool) -> Result<Exported> {
    export_within(home, dest_dir, include_secrets, &HashMap::new())
}

/// `export`, copying the ledger of each session in `committed` no further
/// than that length (what its writer has appended whole).
pub(crate) fn export_within(
    home: &Path,
    dest_dir: &str,
    include_secrets: bool,
    committed: &HashMap<String, u64>,
) -> Result<Exported> {
    let dest = outside_home(home, dest_dir, "dest_dir")?;
    match std::fs::symlink_metadata(&dest) {
        Ok(m) if !m.is_dir() => {
            return Err(
                Error::invalid(format!("dest_dir {} is not a directory", dest.display()))
                    .with_reason("dest_not_empty"),
            )
        }
        Ok(_) => {
            let mut entries = std::fs::read_dir(&dest).map_err(io_err(&dest))?;
            if entries.next().is_some() {
                return Err(Error::invalid(format!(
                    "dest_dir {} is not empty; give a new or empty directory",
                    dest.display()
                ))
                .with_reason("dest_not_empty"));
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            crate::home::create_private_dir(&dest).map_err(io_err(&dest))?
        }
        Err(e) => return Err(io_err(&dest)(e)),
    }
    let sources = sources(home, include_secrets);
    let mut files = Vec::with_capacity(sources.len());
    let mut sessions = Vec::new();
    let mut bytes = 0u64;
    for s in sources {
        let cap = s
            .rel
            .strip_prefix("sessions/")
            .and_then(|n| n.strip_suffix(".jsonl"))
            .and_then(|id| committed.get(id).copied());
        let Some(entry) = copy_one(&s, &dest, cap)? else {
            continue;
        };
        if s.append_only {
            if let Some(id) = s
                .rel
                .strip_prefix("sessions/")
                .and_then(|n| n.strip_suffix(".jsonl"))
            {
                sessions.push(id.to_string());
            }
        }
        bytes += entry.size;
        files.push(entry);
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    sessions.sort();
    let manifest = Manifest {
        format: FORMAT.to_string(),
        version: FORMAT_VERSION,
        vak_version: env!("CARGO_PKG_VERSION").to_string(),
        created_at: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
        include_secrets,
        sessions,
        files,
    };
    let body = serde_json::to_vec_pretty(&manifest).map_err(|e| Error::internal(e.to_string()))?;
    // Last: a directory without a manifest is no backup.
    crate::home::write_private_file(&dest, MANIFEST, &body)?;
    Ok(Exported {
        manifest: dest.join(MANIFEST),
        dest_dir: dest,
        sessions: manifest.sessions.len() as u32,
        files: manifest.files.len() as u64 + 1,
        bytes: bytes + body.len() as u64,
    })
}

/// Copies one source into `dest`; None when it vanished meanwhile (a
/// session deleted, a temporary file renamed) or a ledger has no complete line.
fn copy_one(s: &Source, dest: &Path, cap: Option<u64>) -> Result<Option<FileEntry>> {
    let mut file = match File::open(&s.path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_err(&s.path)(e)),
    };
    let len = file.metadata().map_err(io_err(&s.path))?.len();
    let len = cap.map_or(len, |cap| cap.min(len));
    let len = if s.append_only {
        committed_len(&mut file, len).map_err(io_err(&s.path))?
    } else {
        len
    };
    if s.append_only && len == 0 {
        return Ok(None);
    }
    file.seek(SeekFrom::Start(0)).map_err(io_err(&s.path))?;
    let to = dest.join(&s.rel);
    let sha256 = copy_hashing(&mut file, &to, len).map_err(io_err(&s.path))?;
    Ok(Some(FileEntry {
        path: s.rel.clone(),
        size: len,
        sha256,
    }))
}

/// The length of the ledger up to and including its last newline: the
/// records its writer finished (one `write` per batch, so a reader may see
/// the start of a batch being written; that part is left out).
fn committed_len(file: &mut File, len: u64) -> std::io::Result<u64> {
    const CHUNK: u64 = 64 * 1024;
    let mut end = len;
    let mut buf = vec![0u8; CHUNK as usize];
    while end > 0 {
        let start = end.saturating_sub(CHUNK);
        let n = (end - start) as usize;
        file.seek(SeekFrom::Start(start))?;
        file.read_exact(&mut buf[..n])?;
        if let Some(i) = memchr::memrchr(b'\n', &buf[..n]) {
            return Ok(start + i as u64 + 1);
        }
        end = start;
    }
    Ok(0)
}

/// Every file of `home` a backup holds, in no particular order. Symlinks,
/// temporary files (a leading `.`) and anything not listed here are left out.
fn sources(home: &Path, include_secrets: bool) -> Vec<Source> {
    let mut out = Vec::new();
    let plain = |rel: &str| Source {
        rel: rel.to_string(),
        path: home.join(rel),
        append_only: false,
    };
    for name in super::TOP_FILES {
        if is_file(&home.join(name)) {
            out.push(plain(name));
        }
    }
    // Sessions: ledgers, chosen titles and the index; not `corrupt/`.
    if let Ok(entries) = std::fs::read_dir(home.join("sessions")) {
        for e in entries.flatten() {
            let Some(name) = e.file_name().to_str().map(str::to_string) else {
                continue;
            };
            if !e.file_type().is_ok_and(|t| t.is_file()) {
                continue;
            }
            let ledger_id = name.strip_suffix(".jsonl");
            let title_id = name.strip_suffix(".title");
            let keep = name == "index.json"
                || ledger_id
                    .or(title_id)
                    .is_some_and(|id| validate_session_id(id).is_ok());
            if keep {
                out.push(Source {
                    rel: format!("sessions/{name}"),
                    path: e.path(),
                    append_only: ledger_id.is_some(),
                });
            }
        }
    }
    for dir in ["memory", "permissions", "attachments", "costs"] {
        walk(home, Path::new(dir), 0, &mut out);
    }
    if include_secrets && SECRET_FILES.iter().all(|f| is_file(&home.join(f))) {
        out.extend(SECRET_FILES.iter().map(|f| plain(f)));
    }
    out
}

/// Regular files under `home/rel`, a few levels deep.
fn walk(home: &Path, rel: &Path, depth: usize, out: &mut Vec<Source>) {
    if depth > 4 {
        return;
    }
    let Ok(entries) = std::fs::read_dir(home.join(rel)) else {
        return;
    };
    for e in entries.flatten() {
        let Some(name) = e.file_name().to_str().map(str::to_string) else {
            continue;
        };
        if name.starts_with('.') {
            continue;
        }
        let Ok(t) = e.file_type() else { continue };
        let child = rel.join(&name);
        if t.is_dir() {
            walk(home, &child, depth + 1, out);
        } else if t.is_file() {
            out.push(Source {
                rel: child.display().to_string(),
                path: e.path(),
                append_only: rel.starts_with("costs") && name.ends_with(".jsonl"),
            });
        }
    }
}

fn is_file(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loaded_sessions_ledger_is_copied_no_further_than_its_writer_committed() {
        let home = tempfile::tempdir().unwrap();
        std::fs::create_dir(home.path().join("sessions")).unwrap();
        let header = "{\"header\":{\"session_id\":\"s1\",\"created_at\":\"t\"}}\n";
        // A whole line the writer has not committed (an append that will fail).
        let body = format!("{header}{{\"event\":{{\"seq\":1}}}}\n");
        std::fs::write(home.path().join("sessions/s1.jsonl"), &body).unwrap();
        let out = tempfile::tempdir().unwrap();
        let dest = out.path().join("b");
        let committed = HashMap::from([("s1".to_string(), header.len() as u64)]);
        export_within(home.path(), dest.to_str().unwrap(), false, &committed).unwrap();
        let copy = std::fs::read_to_string(dest.join("sessions/s1.jsonl")).unwrap();
        assert_eq!(copy, header);
    }

    #[test]
    fn a_ledger_is_cut_at_its_last_complete_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("l");
        let mut body = b"{\"header\":1}\n".to_vec();
        body.extend(std::iter::repeat_n(b'x', 200_000));
        body.push(b'\n');
        let whole = body.len() as u64;
        body.extend(b"{\"event\":{\"seq\":3,"); // a batch being written
        std::fs::write(&p, &body).unwrap();
        let mut f = File::open(&p).unwrap();
        assert_eq!(committed_len(&mut f, body.len() as u64).unwrap(), whole);
        std::fs::write(&p, b"no newline at all").unwrap();
        let mut f = File::open(&p).unwrap();
        assert_eq!(committed_len(&mut f, 17).unwrap(), 0);
    }
}
