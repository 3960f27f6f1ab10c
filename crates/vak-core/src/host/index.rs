//! The session index behind `GET /sessions`: one small entry per ledger, kept in memory and in `sessions/index.json`, so listing reads no ledger.
//!
//! The ledgers stay the truth; the index is a cache of what listing shows
//! (id, creation time, title, latest seq). At startup `Index::load` trusts
//! `index.json` for the ledgers it names and reads only what it cannot trust:
//! ledgers it does not name, and ledgers written to since it was saved (so
//! an unclean stop, which skips the final save, leaves no stale title or
//! seq behind). A missing or damaged `index.json` costs one rebuild from the
//! ledgers, never a failed startup. While the server runs, the session code
//! keeps the entries current (`upsert`, `set_latest`, `set_title_if_empty`,
//! `remove`) and `save` writes the file back when something changed.

use crate::ids::validate_session_id;
use crate::log::ledger;
use crate::provider::TokenUsage;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

/// The index file, beside the ledgers.
const FILE: &str = "index.json";
/// Where `save` writes before the rename; only one save runs at a time.
const TEMP: &str = "index.json.tmp";
const VERSION: u64 = 1;
pub(crate) use crate::session::lifecycle::TITLE_CHARS;
/// Longer than any RFC 3339 time we write: a longer `created_at` in
/// index.json is not ours, so that entry is rebuilt from its ledger.
const MAX_CREATED_AT: usize = 64;
/// More than one entry can take in index.json (64-byte id and time and 80
/// characters of title, about 1 KiB even if every byte needs a \u escape,
/// a u64, the keys). A file longer than this per ledger on disk is not read
/// into memory but rebuilt: always correct, only slower when it was ours
/// and many ledgers have been deleted since.
const MAX_ENTRY_BYTES: u64 = 2048;
/// A ledger modified this long before index.json was written, or later, may
/// hold events the saved entry missed (a ledger line is written before the
/// session reports its seq to the index), so load reads it again.
const FRESHNESS_MARGIN: Duration = Duration::from_secs(5);

/// What listing shows of one session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub session_id: String,
    pub created_at: String,
    pub title: String,
    pub latest_seq: u64,
    /// As of the last time the session was live on this server (a session
    /// indexed from its ledger alone shows 0 until it is loaded).
    #[serde(default)]
    pub usage: TokenUsage,
    /// The workspace the session runs in (absolute; empty in an index
    /// written before it was kept, until the session is loaded).
    #[serde(default)]
    pub workspace: String,
}

/// A session's title: the first line of its first user message, at most
/// `TITLE_CHARS` characters. Applying it to a title changes nothing.
pub(crate) fn title_of(text: &str) -> String {
    text.lines()
        .next()
        .unwrap_or_default()
        .chars()
        .take(TITLE_CHARS)
        .collect()
}

#[derive(Serialize)]
struct FileRef<'a> {
    version: u64,
    sessions: &'a [Entry],
}

#[derive(Deserialize)]
struct FileVersion {
    version: u64,
}

#[derive(Deserialize)]
struct FileOwned {
    sessions: Vec<Entry>,
}

struct State {
    entries: HashMap<String, Entry>,
    /// Bumped by every change. `save` writes when it differs from `saved`;
    /// a counter rather than a flag, so a change made while a save is
    /// writing its snapshot is not marked saved by it.
    generation: u64,
    saved: u64,
}

pub(crate) struct Index {
    dir: PathBuf,
    state: Mutex<State>,
}

/// One `<id>.jsonl` in the directory.
pub(crate) struct OnDisk {
    pub(crate) path: PathBuf,
    pub(crate) modified: Option<SystemTime>,
}

impl Index {
    /// Reads `dir/index.json` if present, then reconciles with the directory
    /// listing: ledgers (`<id>.jsonl`, id charset A-Z a-z 0-9 - _, 1..=64)
    /// missing from the index, or written to since it was saved, are
    /// summarized with `ledger::summarize`; entries whose ledger is gone are
    /// dropped. A missing, unreadable or corrupt index.json is rebuilt (one
    /// warning, never a failed startup). Blocking: the caller runs it off the
    /// runtime.
    pub(crate) fn load(dir: &Path) -> Index {
        let ledgers = list_ledgers(dir);
        let file = dir.join(FILE);
        let cap = (ledgers.len() as u64 + 1) * MAX_ENTRY_BYTES;
        let saved = match read_file(&file, cap) {
            Ok(Some(saved)) => saved,
            Ok(None) => {
                tracing::debug!(path = %file.display(), "no session index yet: building it from the ledgers");
                Saved::default()
            }
            Err(why) => {
                tracing::warn!(path = %file.display(), "rebuilding the session index from the ledgers: {why}");
                Saved::default()
            }
        };
        let Saved {
            entries: mut stored,
            at: saved_at,
            whole,
        } = saved;
        // Whatever differs from the file must reach it at the next save.
        let mut changed = !whole;
        let mut entries = HashMap::with_capacity(ledgers.len());
        let mut read = 0usize;
        for (id, on_disk) in ledgers {
            let untouched = match (saved_at, on_disk.modified) {
                (Some(saved), Some(modified)) => {
                    modified.checked_add(FRESHNESS_MARGIN).is_some_and(|m| m < saved)
                }
                _ => false,
            };
            let known = match stored.remove(&id) {
                Some(e) if untouched => {
                    entries.insert(id, e);
                    continue;
                }
                other => other,
            };
            read += 1;
            // Even when the entry comes out the same, the next save gives
            // index.json a newer mtime, so this ledger (touched by a line
            // without a seq, say) is not read again at every startup.
            changed = true;
            match summarize_repairing(&id, &on_disk.path, known.as_ref()) {
                Ok(mut e) => {
                    // The ledger's head and tail do not say how many tokens
                    // its turns used: keep what the index last knew.
                    if let Some(k) = &known {
                        e.usage = k.usage;
                        // Seqs are never reused: a ledger cut short of what
                        // the index recorded keeps the recorded high mark,
                        // and its load marks the rest lost (`repair.rs`).
                        if k.latest_seq > e.latest_seq {
                            tracing::error!(
                                path = %on_disk.path.display(),
                                ledger_seq = e.latest_seq,
                                recorded_seq = k.latest_seq,
                                "the ledger ends before the seq the session index recorded: events {}..={} are lost",
                                e.latest_seq + 1,
                                k.latest_seq
                            );
                            e.latest_seq = k.latest_seq;
                        }
                    }
                    entries.insert(id, e);
                }
                // A ledger we cannot read now still had what the index
                // says when it was saved: better listed than lost.
                Err(why) => match known {
                    Some(e) => {
                        tracing::warn!(path = %on_disk.path.display(), "keeping the indexed entry of an unreadable ledger: {why}");
                        entries.insert(id, e);
                    }
                    None => {
                        tracing::warn!(path = %on_disk.path.display(), "leaving an unreadable ledger out of the session index: {why}");
                    }
                },
            }
        }
        // Entries whose ledger is gone.
        changed |= !stored.is_empty();
        tracing::debug!(
            sessions = entries.len(),
            ledgers_read = read,
            "session index loaded"
        );
        Index {
            dir: dir.to_path_buf(),
            state: Mutex::new(State {
                entries,
                generation: u64::from(changed),
                saved: 0,
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Creates or updates the entry of `e.session_id`: a session was
    /// created, got its title or advanced its seq. The title is capped with
    /// `title_of`; the seq never moves back (seqs are never reused) and a
    /// title once set is not cleared by an empty one.
    pub(crate) fn upsert(&self, mut e: Entry) {
        e.title = title_of(&e.title);
        let mut st = self.state();
        let merged = match st.entries.get(&e.session_id) {
            Some(old) => Entry {
                latest_seq: e.latest_seq.max(old.latest_seq),
                usage: if e.usage == TokenUsage::default() {
                    old.usage
                } else {
                    e.usage
                },
                title: if e.title.is_empty() {
                    old.title.clone()
                } else {
                    e.title
                },
                workspace: if e.workspace.is_empty() {
                    old.workspace.clone()
                } else {
                    e.workspace
                },
                ..e
            },
            None => e,
        };
        if st.entries.get(&merged.session_id) != Some(&merged) {
            st.entries.insert(merged.session_id.clone(), merged);
            st.generation += 1;
        }
    }

    // Nothing but the tests drives the index this way (found when the core
    // went `pub(crate)`); kept for the tests that pin the index's rules.
    #[cfg(test)]
    /// Advances the latest seq of `id` (never back); unknown ids are ignored.
    pub(crate) fn set_latest(&self, id: &str, seq: u64) {
        let mut st = self.state();
        if let Some(e) = st.entries.get_mut(id) {
            if seq > e.latest_seq {
                e.latest_seq = seq;
                st.generation += 1;
            }
        }
    }

    // Nothing but the tests drives the index this way (found when the core
    // went `pub(crate)`); kept for the tests that pin the index's rules.
    #[cfg(test)]
    /// Sets the title of `id` (capped with `title_of`) unless it has one;
    /// unknown ids are ignored.
    pub(crate) fn set_title_if_empty(&self, id: &str, title: &str) {
        let mut st = self.state();
        if let Some(e) = st.entries.get_mut(id) {
            if e.title.is_empty() {
                let title = title_of(title);
                if !title.is_empty() {
                    e.title = title;
                    st.generation += 1;
                }
            }
        }
    }

    pub(crate) fn remove(&self, id: &str) {
        let mut st = self.state();
        if st.entries.remove(id).is_some() {
            st.generation += 1;
        }
    }

    pub(crate) fn get(&self, id: &str) -> Option<Entry> {
        self.state().entries.get(id).cloned()
    }

    /// Newest first (created_at desc, then id asc).
    pub(crate) fn list(&self) -> Vec<Entry> {
        let mut out: Vec<Entry> = self.state().entries.values().cloned().collect();
        sort(&mut out);
        out
    }

    // Nothing but the tests drives the index this way (found when the core
    // went `pub(crate)`); kept for the tests that pin the index's rules.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.state().entries.len()
    }

    // Nothing but the tests drives the index this way (found when the core
    // went `pub(crate)`); kept for the tests that pin the index's rules.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.state().entries.is_empty()
    }

    /// Writes index.json atomically (temp file 0600 in the same dir, fsync,
    /// rename, fsync of the dir) if anything changed since the last save.
    /// The entries are copied under the lock and written outside it. A
    /// failed save leaves the previous file whole and the changes unsaved,
    /// so the next save tries again. Blocking.
    ///
    /// One save at a time, so renames land in snapshot order and two never
    /// share the temp file: the registry saves only from the index file's owner
    /// task (`file_owner.rs`), which holds no lock across this I/O; readers
    /// and writers of entries never wait on the disk.
    pub(crate) fn save(&self) -> std::io::Result<()> {
        let (mut snapshot, generation) = {
            let st = self.state();
            if st.generation == st.saved {
                return Ok(());
            }
            (st.entries.values().cloned().collect::<Vec<_>>(), st.generation)
        };
        // Listing order, so the file reads like GET /sessions.
        sort(&mut snapshot);
        let body = serde_json::to_vec(&FileRef {
            version: VERSION,
            sessions: &snapshot,
        })?;
        let temp = self.dir.join(TEMP);
        let written = write_replace(&temp, &self.dir.join(FILE), &body);
        if written.is_err() {
            let _ = std::fs::remove_file(&temp);
        }
        written?;
        // Fsync of the directory makes the rename itself durable.
        std::fs::File::open(&self.dir)?.sync_all()?;
        let mut st = self.state();
        st.saved = st.saved.max(generation);
        Ok(())
    }
}

fn sort(entries: &mut [Entry]) {
    entries.sort_by(|a, b| {
        b.created_at
            .cmp(&a.created_at)
            .then_with(|| a.session_id.cmp(&b.session_id))
    });
}

/// Writes `body` to `temp` (owner-only whatever the umask, synced) and renames it over `path`.
pub(crate) fn write_replace(temp: &Path, path: &Path, body: &[u8]) -> std::io::Result<()> {
    // A temp file a crash left behind: create_new below refuses to reuse
    // (or follow) anything already there.
    match std::fs::remove_file(temp) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(temp)?;
    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    f.write_all(body)?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(temp, path)
}

/// Every `<id>.jsonl` with a valid session id, by id.
pub(crate) fn list_ledgers(dir: &Path) -> HashMap<String, OnDisk> {
    let mut out = HashMap::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) => {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(path = %dir.display(), "cannot list the ledgers: {e}");
            }
            return out;
        }
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(id) = name.to_str().and_then(|n| n.strip_suffix(".jsonl")) else {
            continue;
        };
        if validate_session_id(id).is_err() {
            continue;
        }
        let modified = entry.metadata().and_then(|m| m.modified()).ok();
        out.insert(
            id.to_string(),
            OnDisk {
                path: entry.path(),
                modified,
            },
        );
    }
    out
}

/// What index.json holds.
#[derive(Default)]
struct Saved {
    entries: HashMap<String, Entry>,
    /// When it was written (its mtime).
    at: Option<SystemTime>,
    /// Every entry in it was taken; false also when there is no file.
    whole: bool,
}

/// index.json, `None` when there is none, or why it cannot be used.
fn read_file(path: &Path, cap: u64) -> Result<Option<Saved>, String> {
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot open it: {e}")),
    };
    let at = file.metadata().and_then(|m| m.modified()).ok();
    let mut body = Vec::new();
    file.take(cap + 1)
        .read_to_end(&mut body)
        .map_err(|e| format!("cannot read it: {e}"))?;
    if body.len() as u64 > cap {
        return Err(format!(
            "it is larger than {cap} bytes, more than the ledgers here need"
        ));
    }
    let version = serde_json::from_slice::<FileVersion>(&body)
        .map_err(|e| format!("it is corrupt: {e}"))?
        .version;
    if version != VERSION {
        return Err(format!("it has version {version}, this server reads {VERSION}"));
    }
    let file: FileOwned = serde_json::from_slice(&body).map_err(|e| format!("it is corrupt: {e}"))?;
    let mut saved = Saved {
        entries: HashMap::with_capacity(file.sessions.len()),
        at,
        whole: true,
    };
    for e in file.sessions {
        // An entry we would not have written is left out, so its ledger is
        // read again; the rest of the file is still good.
        let ours = validate_session_id(&e.session_id).is_ok()
            && e.created_at.len() <= MAX_CREATED_AT
            && e.title == title_of(&e.title)
            && !saved.entries.contains_key(&e.session_id);
        if ours {
            saved.entries.insert(e.session_id.clone(), e);
        } else {
            saved.whole = false;
        }
    }
    Ok(Some(saved))
}

/// `summarize`, after rebuilding a damaged header (`repair.rs`), so a
/// flipped byte there leaves the session listed.
fn summarize_repairing(id: &str, path: &Path, known: Option<&Entry>) -> Result<Entry, String> {
    let remembered = known.map(|k| crate::log::repair::Remembered {
        created_at: k.created_at.clone(),
        workspace: k.workspace.clone(),
    });
    match crate::log::repair::check_header(path, id, remembered.as_ref()) {
        Ok(_) => summarize(id, path),
        Err(crate::log::repair::Unrepairable::Io(e)) => Err(e.message),
        Err(crate::log::repair::Unrepairable::Damaged(why)) => Err(why),
    }
}

/// The entry of ledger `id` read from its file.
fn summarize(id: &str, path: &Path) -> Result<Entry, String> {
    let s = ledger::summarize(path).map_err(|e| e.message)?;
    // Sessions are found by file name: a header naming another session
    // would list an id that cannot be opened.
    if s.session_id != id {
        return Err(format!("its header names session {:?}", title_of(&s.session_id)));
    }
    if s.created_at.len() > MAX_CREATED_AT {
        return Err("its header has an overlong created_at".to_string());
    }
    // A title a client chose wins over the first prompt's.
    let chosen = path
        .parent()
        .and_then(|dir| crate::session::lifecycle::read_title(dir, id));
    Ok(Entry {
        session_id: s.session_id,
        created_at: s.created_at,
        title: title_of(&chosen.unwrap_or(s.title)),
        latest_seq: s.latest_seq,
        usage: TokenUsage::default(),
        workspace: s.workspace,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{ClientEvent, Frame};
    use crate::log::ledger::Ledger;
    use crate::log::ledger::Log;
    use crate::Durability;
    use std::os::unix::fs::MetadataExt;

    /// A real ledger `<id>.jsonl` with a first prompt and `events` events in all.
    fn make_ledger(dir: &Path, id: &str, created_at: &str, prompt: &str, events: u64) -> PathBuf {
        let path = dir.join(format!("{id}.jsonl"));
        let l = Ledger::create(&path, id, created_at, Durability::Process).unwrap();
        for seq in 1..=events {
            let event = if seq == 1 {
                ClientEvent::UserMessage {
                    text: prompt.to_string(),
                    request_id: format!("r{seq}"),
                    attachments: Vec::new(),
                }
            } else {
                ClientEvent::TextDelta {
                    text: format!("word {seq}"),
                }
            };
            l.append_event(&Frame::new(seq, id.into(), event)).unwrap();
        }
        l.sync().unwrap();
        path
    }

    fn entry(id: &str, created_at: &str, title: &str, latest_seq: u64) -> Entry {
        Entry {
            session_id: id.to_string(),
            created_at: created_at.to_string(),
            title: title.to_string(),
            latest_seq,
            usage: TokenUsage::default(),
            workspace: String::new(),
        }
    }

    /// Makes a ledger look last written an hour ago, well before any save in the test.
    fn age(path: &Path) {
        let f = OpenOptions::new().write(true).open(path).unwrap();
        f.set_modified(SystemTime::now() - Duration::from_secs(3600))
            .unwrap();
    }

    fn ids(index: &Index) -> Vec<String> {
        index.list().into_iter().map(|e| e.session_id).collect()
    }

    #[test]
    fn without_index_json_the_index_is_built_from_the_ledgers() {
        let dir = tempfile::tempdir().unwrap();
        make_ledger(
            dir.path(),
            "a",
            "2026-01-01T00:00:00Z",
            "fix the build\nthen test",
            3,
        );
        make_ledger(dir.path(), "b", "2026-01-02T00:00:00Z", &"x".repeat(200), 1);
        // Header only: no prompt yet.
        make_ledger(dir.path(), "c", "2026-01-03T00:00:00Z", "", 0);
        // Not ledgers: another extension, an id outside the charset, a temp file.
        std::fs::write(dir.path().join("notes.txt"), "x").unwrap();
        std::fs::write(dir.path().join("bad id.jsonl"), "x").unwrap();
        std::fs::write(dir.path().join(TEMP), "x").unwrap();

        let index = Index::load(dir.path());
        assert_eq!(
            index.list(),
            vec![
                entry("c", "2026-01-03T00:00:00Z", "", 0),
                entry("b", "2026-01-02T00:00:00Z", &"x".repeat(80), 1),
                entry("a", "2026-01-01T00:00:00Z", "fix the build", 3),
            ]
        );
        assert_eq!(index.len(), 3);
        index.save().unwrap();
        let v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.path().join(FILE)).unwrap()).unwrap();
        assert_eq!(v["version"], 1);
        assert_eq!(v["sessions"].as_array().unwrap().len(), 3);
        assert_eq!(v["sessions"][2]["title"], "fix the build");
    }

    #[test]
    fn a_saved_index_is_used_without_reading_the_ledgers() {
        let dir = tempfile::tempdir().unwrap();
        let a = make_ledger(dir.path(), "a", "2026-01-01T00:00:00Z", "first", 2);
        let b = make_ledger(dir.path(), "b", "2026-01-02T00:00:00Z", "second", 4);
        age(&a);
        age(&b);
        let index = Index::load(dir.path());
        index.save().unwrap();
        let before = index.list();
        drop(index);

        // Replace a with a valid ledger that says something else, and b
        // with garbage, both with their old mtimes: if load read either,
        // the listing would change (or lose b).
        std::fs::remove_file(&a).unwrap();
        make_ledger(dir.path(), "a", "2030-01-01T00:00:00Z", "rewritten", 9);
        age(&a);
        std::fs::write(&b, b"\0\0 not a ledger \xff\n").unwrap();
        age(&b);
        assert!(ledger::summarize(&b).is_err(), "b cannot be summarized");

        let inode = || std::fs::metadata(dir.path().join(FILE)).unwrap().ino();
        let saved = inode();
        let index = Index::load(dir.path());
        assert_eq!(index.list(), before);
        index.save().unwrap();
        assert_eq!(
            inode(),
            saved,
            "nothing was read, nothing changed, nothing written"
        );
        assert_eq!(
            index.get("a"),
            Some(entry("a", "2026-01-01T00:00:00Z", "first", 2))
        );
    }

    #[test]
    fn a_ledger_written_after_the_save_is_read_again() {
        let dir = tempfile::tempdir().unwrap();
        let a = make_ledger(dir.path(), "a", "2026-01-01T00:00:00Z", "", 0);
        let index = Index::load(dir.path());
        index.save().unwrap();
        drop(index);
        // An unclean stop: the session went on after the last save.
        let l = Ledger::open(&a, Durability::Process, |_| {}).unwrap();
        let prompt = ClientEvent::UserMessage {
            text: "late prompt".into(),
            request_id: "r".into(),
            attachments: Vec::new(),
        };
        l.append_event(&Frame::new(1, "a".into(), prompt)).unwrap();
        l.append_event(&Frame::new(2, "a".into(), ClientEvent::status(false)))
            .unwrap();
        drop(l);

        let index = Index::load(dir.path());
        assert_eq!(
            index.get("a"),
            Some(entry("a", "2026-01-01T00:00:00Z", "late prompt", 2))
        );
    }

    #[test]
    fn a_corrupt_or_unknown_index_json_is_rebuilt() {
        let dir = tempfile::tempdir().unwrap();
        make_ledger(dir.path(), "a", "2026-01-01T00:00:00Z", "one", 1);
        make_ledger(dir.path(), "b", "2026-01-02T00:00:00Z", "two", 2);
        let want = vec![
            entry("b", "2026-01-02T00:00:00Z", "two", 2),
            entry("a", "2026-01-01T00:00:00Z", "one", 1),
        ];
        let huge = format!(
            r#"{{"version":1,"sessions":[{{"session_id":"a","created_at":"t","title":"{}","latest_seq":1}}]}}"#,
            "x".repeat(10_000)
        );
        let bad = [
            "{not json".to_string(),
            String::new(),
            r#"{"version":2,"sessions":[]}"#.to_string(),
            r#"{"sessions":[]}"#.to_string(),
            r#"{"version":1,"sessions":[{"session_id":"a"}]}"#.to_string(),
            // Larger than two ledgers' entries can be.
            huge,
        ];
        for body in bad {
            std::fs::write(dir.path().join(FILE), &body).unwrap();
            let index = Index::load(dir.path());
            assert_eq!(index.list(), want, "after {:.40}", body);
            index.save().unwrap();
            // The rebuilt index replaced the bad file.
            let again = Index::load(dir.path());
            assert_eq!(again.list(), want);
            again.save().unwrap();
            assert!(std::fs::read_to_string(dir.path().join(FILE))
                .unwrap()
                .starts_with(r#"{"version":1,"#));
        }
        // Entries we would not write are read again from their ledgers, the rest kept.
        let odd = r#"{"version":1,"sessions":[
            {"session_id":"a","created_at":"2026-01-01T00:00:00Z","title":"one","latest_seq":1},
            {"session_id":"b/../x","created_at":"t","title":"t","latest_seq":1},
            {"session_id":"b","created_at":"2026-01-02T00:00:00Z","title":"two","latest_seq":2,"extra":1}]}"#;
        std::fs::write(dir.path().join(FILE), odd).unwrap();
        assert_eq!(Index::load(dir.path()).list(), want);
    }

    #[test]
    fn a_deleted_ledger_disappears_and_a_new_one_is_added() {
        let dir = tempfile::tempdir().unwrap();
        let a = make_ledger(dir.path(), "a", "2026-01-01T00:00:00Z", "one", 1);
        make_ledger(dir.path(), "b", "2026-01-02T00:00:00Z", "two", 1);
        let index = Index::load(dir.path());
        index.save().unwrap();
        drop(index);

        std::fs::remove_file(&a).unwrap();
        make_ledger(dir.path(), "c", "2026-01-03T00:00:00Z", "three", 5);
        let index = Index::load(dir.path());
        assert_eq!(ids(&index), ["c", "b"]);
        assert_eq!(
            index.get("c"),
            Some(entry("c", "2026-01-03T00:00:00Z", "three", 5))
        );
        assert_eq!(index.get("a"), None);
        // The reconciled index is dirty, so it reaches the file.
        index.save().unwrap();
        let text = std::fs::read_to_string(dir.path().join(FILE)).unwrap();
        assert!(text.contains(r#""session_id":"c""#) && !text.contains(r#""session_id":"a""#));
    }

    #[test]
    fn save_replaces_the_file_atomically_owner_only_and_only_when_changed() {
        let dir = tempfile::tempdir().unwrap();
        let a = make_ledger(dir.path(), "a", "2026-01-01T00:00:00Z", "one", 1);
        // Old, so reloads take the seqs set below from the index, not the ledger.
        age(&a);
        let file = dir.path().join(FILE);
        let index = Index::load(dir.path());
        index.save().unwrap();
        let first = std::fs::read(&file).unwrap();
        let meta = std::fs::metadata(&file).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert!(!dir.path().join(TEMP).exists(), "no temp file is left behind");

        // Nothing changed: the file is not rewritten.
        index.save().unwrap();
        assert_eq!(std::fs::metadata(&file).unwrap().ino(), meta.ino());

        // A reader holding the old file (here a hard link) still sees it
        // whole: save renames a new file over it rather than rewriting it.
        let held = dir.path().join("held");
        std::fs::hard_link(&file, &held).unwrap();
        // A temp file a crash left behind, readable by others.
        std::fs::write(dir.path().join(TEMP), "stale").unwrap();
        std::fs::set_permissions(dir.path().join(TEMP), std::fs::Permissions::from_mode(0o644)).unwrap();
        index.set_latest("a", 7);
        index.save().unwrap();
        assert_eq!(std::fs::read(&held).unwrap(), first);
        let meta = std::fs::metadata(&file).unwrap();
        assert_ne!(meta.ino(), std::fs::metadata(&held).unwrap().ino());
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert!(!dir.path().join(TEMP).exists());
        assert_eq!(Index::load(dir.path()).get("a").unwrap().latest_seq, 7);

        // A save that fails keeps the old file and the change, and the next save writes it.
        index.set_latest("a", 8);
        std::fs::create_dir(dir.path().join(TEMP)).unwrap();
        assert!(index.save().is_err());
        assert_eq!(Index::load(dir.path()).get("a").unwrap().latest_seq, 7);
        std::fs::remove_dir(dir.path().join(TEMP)).unwrap();
        index.save().unwrap();
        assert_eq!(Index::load(dir.path()).get("a").unwrap().latest_seq, 8);
    }

    #[test]
    fn list_is_newest_first_then_by_id() {
        let dir = tempfile::tempdir().unwrap();
        let index = Index::load(dir.path());
        assert!(index.is_empty());
        for (id, at) in [
            ("m", "2026-01-02T00:00:00Z"),
            ("z", "2026-01-03T00:00:00Z"),
            ("b", "2026-01-02T00:00:00Z"),
            ("a", "2026-01-01T00:00:00Z"),
            ("k", "2026-01-02T00:00:00Z"),
        ] {
            index.upsert(entry(id, at, "", 0));
        }
        assert_eq!(ids(&index), ["z", "b", "k", "m", "a"]);
    }

    #[test]
    fn updates_cap_titles_never_move_seqs_back_and_mark_only_real_changes() {
        let dir = tempfile::tempdir().unwrap();
        let index = Index::load(dir.path());
        let at = "2026-01-01T00:00:00Z";
        index.upsert(entry("a", at, "", 0));
        index.save().unwrap();
        let saved = || std::fs::read_to_string(dir.path().join(FILE)).unwrap();
        let before = saved();

        // No-ops: an unknown id, a lower seq, the same entry again.
        index.set_latest("nope", 3);
        index.set_title_if_empty("nope", "t");
        index.remove("nope");
        index.set_latest("a", 0);
        index.upsert(entry("a", at, "", 0));
        std::fs::remove_file(dir.path().join(FILE)).unwrap();
        index.save().unwrap();
        assert!(
            !dir.path().join(FILE).exists(),
            "nothing changed, nothing written"
        );
        std::fs::write(dir.path().join(FILE), &before).unwrap();

        index.set_title_if_empty("a", &format!("{}\nsecond line", "é".repeat(100)));
        assert_eq!(index.get("a").unwrap().title, "é".repeat(80));
        index.set_title_if_empty("a", "other");
        assert_eq!(index.get("a").unwrap().title, "é".repeat(80));
        index.set_latest("a", 5);
        index.upsert(entry("a", at, "", 2));
        assert_eq!(index.get("a"), Some(entry("a", at, &"é".repeat(80), 5)));
        index.upsert(entry("a", at, "new title\nmore", 6));
        assert_eq!(index.get("a"), Some(entry("a", at, "new title", 6)));
        index.save().unwrap();
        assert_ne!(saved(), before);

        index.remove("a");
        assert_eq!(index.len(), 0);
        index.save().unwrap();
        assert!(saved().contains(r#""sessions":[]"#));
    }

    #[test]
    fn title_of_takes_the_first_line_capped_and_is_idempotent() {
        assert_eq!(title_of(""), "");
        assert_eq!(title_of("one\ntwo"), "one");
        assert_eq!(title_of("one\r\ntwo"), "one");
        assert_eq!(title_of("\nlater"), "");
        let long = "ü".repeat(81);
        assert_eq!(title_of(&long).chars().count(), 80);
        for s in ["one\ntwo", &long, "a\rb", ""] {
            assert_eq!(title_of(&title_of(s)), title_of(s));
        }
    }

    #[test]
    fn a_ledger_naming_another_session_is_left_out() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.jsonl");
        Ledger::create(&path, "b", "2026-01-01T00:00:00Z", Durability::Process).unwrap();
        make_ledger(dir.path(), "c", "2026-01-01T00:00:00Z", "", 0);
        assert_eq!(ids(&Index::load(dir.path())), ["c"]);
        assert_eq!(
            ids(&Index::load(&dir.path().join("missing"))),
            Vec::<String>::new()
        );
    }
}
