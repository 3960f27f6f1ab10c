//! Reading a backup back in: the manifest checked and every file copied into a staging folder in the home while its sha256 is checked, then sessions placed under their id (skip, overwrite) or a fresh one (rename), through the registry when a server runs.

use super::{
    allowed_path, copy_hashing, io_err, outside_home, Manifest, FORMAT, FORMAT_VERSION, MANIFEST, MAX_FILES,
    MAX_MANIFEST_BYTES, MAX_TOTAL_BYTES, SECRET_FILES,
};
use crate::error::{Error, Result};
use crate::host::hub::Hub;
use crate::ids::validate_session_id;
use crate::log::ledger::Record;
use std::collections::HashSet;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};

/// What to do with a session id the home already has.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Conflict {
    /// Keep the home's session; leave the backup's out.
    #[default]
    Skip,
    /// Replace the home's session (refused while it is loaded).
    Overwrite,
    /// Bring the backup's in under a fresh id.
    Rename,
}

/// What became of one session of the backup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Imported,
    Skipped,
    Overwritten,
    Renamed,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImportedSession {
    /// Its id in the backup.
    pub session_id: String,
    /// Its id in this home.
    pub imported_as: String,
    pub action: Action,
}

/// What an import did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Imported {
    pub sessions: Vec<ImportedSession>,
    /// Other files brought in (paths as in the backup).
    pub restored: Vec<String>,
    /// Other files left out because the home has its own.
    pub kept: Vec<String>,
}

/// A verified backup, copied into a folder of the home (removed when dropped).
struct Staged {
    dir: PathBuf,
    manifest: Manifest,
}

impl Drop for Staged {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Staged {
    fn ledger(&self, id: &str) -> PathBuf {
        self.dir.join("sessions").join(format!("{id}.jsonl"))
    }

    fn title(&self, id: &str) -> Option<PathBuf> {
        let p = self.dir.join("sessions").join(format!("{id}.title"));
        p.is_file().then_some(p)
    }

    /// Gives the staged session `id` the id `to`: its ledger's header says
    /// `to`, every other line is kept byte for byte.
    fn rename(&self, id: &str, to: &str) -> Result<()> {
        let from = self.ledger(id);
        let dest = self.ledger(to);
        let src = File::open(&from).map_err(io_err(&from))?;
        let mut reader = BufReader::new(src);
        let mut first = Vec::new();
        reader.read_until(b'\n', &mut first).map_err(io_err(&from))?;
        let header = match serde_json::from_slice::<Record>(&first) {
            Ok(Record::Header {
                created_at,
                workspace,
                ..
            }) => Record::Header {
                session_id: to.to_string(),
                created_at,
                workspace,
            },
            _ => {
                return Err(Error::invalid(format!(
                    "sessions/{id}.jsonl has no ledger header"
                )))
            }
        };
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&dest)
            .map_err(io_err(&dest))?;
        let mut line = serde_json::to_vec(&header).map_err(|e| Error::internal(e.to_string()))?;
        line.push(b'\n');
        out.write_all(&line).map_err(io_err(&dest))?;
        std::io::copy(&mut reader, &mut out).map_err(io_err(&dest))?;
        out.sync_all().map_err(io_err(&dest))?;
        std::fs::remove_file(&from).map_err(io_err(&from))?;
        if let Some(t) = self.title(id) {
            let tt = t.with_file_name(format!("{to}.title"));
            std::fs::rename(&t, &tt).map_err(io_err(&t))?;
        }
        Ok(())
    }
}

/// A manifest that does not verify: 400 naming what is wrong.
fn mismatch(what: String) -> Error {
    Error::invalid(format!("the backup does not match its manifest: {what}")).with_reason("manifest_mismatch")
}

fn bad_manifest(what: String) -> Error {
    Error::invalid(format!("manifest.json is not a vak backup manifest: {what}")).with_reason("bad_manifest")
}

/// Reads and checks `src_dir`'s manifest, then copies every file it lists
/// into a new staging folder in `home`, checking each one's size and
/// sha256 on the way. Blocking.
fn stage(home: &Path, src_dir: &str) -> Result<Staged> {
    let src = outside_home(home, src_dir, "src_dir")?;
    let manifest = read_manifest(&src)?;
    let dir = home.join(format!(".import-{}", uuid::Uuid::new_v4().simple()));
    crate::home::create_private_dir(&dir).map_err(io_err(&dir))?;
    let staged = Staged { dir, manifest };
    for f in &staged.manifest.files {
        let mut file = open_inside(&src, &f.path)?;
        let size = file.metadata().map_err(io_err(&src.join(&f.path)))?.len();
        if size != f.size {
            return Err(mismatch(format!(
                "{} is {size} bytes, the manifest says {}",
                f.path, f.size
            )));
        }
        let to = staged.dir.join(&f.path);
        let sha = copy_hashing(&mut file, &to, f.size).map_err(|e| mismatch(format!("{}: {e}", f.path)))?;
        if sha != f.sha256 {
            return Err(mismatch(format!(
                "{}: sha256 {sha}, the manifest says {}",
                f.path, f.sha256
            )));
        }
    }
    for id in &staged.manifest.sessions {
        check_header(&staged.ledger(id), id)?;
    }
    Ok(staged)
}

/// The longest ledger header line read (a real one is a few hundred bytes).
const MAX_HEADER_BYTES: u64 = 64 * 1024;

/// 400 unless the staged ledger of `id` starts with a ledger header naming
/// `id` (sessions are found by file name: any other would not load).
fn check_header(path: &Path, id: &str) -> Result<()> {
    let file = File::open(path).map_err(io_err(path))?;
    let mut first = Vec::new();
    BufReader::new(file.take(MAX_HEADER_BYTES))
        .read_until(b'\n', &mut first)
        .map_err(io_err(path))?;
    match serde_json::from_slice::<Record>(&first) {
        Ok(Record::Header { session_id, .. }) if session_id == id => Ok(()),
        _ => Err(Error::invalid(format!(
            "sessions/{id}.jsonl does not start with a ledger header naming session {id}"
        ))
        .with_reason("bad_ledger")),
    }
}

/// `src/manifest.json`, bounded and checked: 404 when there is none.
fn read_manifest(src: &Path) -> Result<Manifest> {
    let path = src.join(MANIFEST);
    let no_backup = || {
        Error::not_found(format!("no backup in {}: it has no {MANIFEST}", src.display()))
            .with_reason("no_manifest")
    };
    match std::fs::symlink_metadata(&path) {
        Ok(m) if m.is_file() => {}
        Ok(_) => return Err(no_backup()),
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
            ) =>
        {
            return Err(no_backup())
        }
        Err(e) => return Err(io_err(&path)(e)),
    }
    let mut body = Vec::new();
    File::open(&path)
        .and_then(|f| f.take(MAX_MANIFEST_BYTES + 1).read_to_end(&mut body))
        .map_err(io_err(&path))?;
    if body.len() as u64 > MAX_MANIFEST_BYTES {
        return Err(bad_manifest(format!(
            "it is longer than {MAX_MANIFEST_BYTES} bytes"
        )));
    }
    let m: Manifest = serde_json::from_slice(&body).map_err(|e| bad_manifest(e.to_string()))?;
    if m.format != FORMAT || m.version != FORMAT_VERSION {
        return Err(bad_manifest(format!(
            "format {:?} version {}; this vak reads {FORMAT:?} version {FORMAT_VERSION}",
            m.format.chars().take(40).collect::<String>(),
            m.version
        )));
    }
    if m.files.len() > MAX_FILES {
        return Err(bad_manifest(format!("it lists more than {MAX_FILES} files")));
    }
    let mut total = 0u64;
    let mut seen = HashSet::with_capacity(m.files.len());
    for f in &m.files {
        if !allowed_path(&f.path) {
            return Err(bad_manifest(format!(
                "{:?} is not a path a backup holds",
                f.path.chars().take(200).collect::<String>()
            )));
        }
        if !seen.insert(f.path.as_str()) {
            return Err(bad_manifest(format!("{} is listed twice", f.path)));
        }
        if f.sha256.len() != 64 || !f.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad_manifest(format!("{} has no sha256", f.path)));
        }
        total = total.saturating_add(f.size);
    }
    if total > MAX_TOTAL_BYTES {
        return Err(bad_manifest(format!(
            "its files hold more than {MAX_TOTAL_BYTES} bytes"
        )));
    }
    let mut ids = HashSet::with_capacity(m.sessions.len());
    for id in &m.sessions {
        validate_session_id(id).map_err(|e| bad_manifest(e.message))?;
        if !ids.insert(id.as_str()) || !seen.contains(format!("sessions/{id}.jsonl").as_str()) {
            return Err(bad_manifest(format!(
                "session {id} is listed twice or has no ledger"
            )));
        }
    }
    Ok(m)
}

/// Opens `src/rel` for reading without following a symlink anywhere below
/// `src`: every folder on the way must be a real folder and the file a
/// regular file.
fn open_inside(src: &Path, rel: &str) -> Result<File> {
    let missing = |why: &str| mismatch(format!("{rel} {why}"));
    let mut at = src.to_path_buf();
    let parts: Vec<_> = Path::new(rel).components().collect();
    for (i, c) in parts.iter().enumerate() {
        let Component::Normal(name) = c else {
            return Err(missing("is not a plain path"));
        };
        at.push(name);
        let meta = match std::fs::symlink_metadata(&at) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(missing("is missing")),
            Err(e) => return Err(io_err(&at)(e)),
        };
        let last = i + 1 == parts.len();
        let ok = if last { meta.is_file() } else { meta.is_dir() };
        if !ok {
            return Err(missing("is a symlink or not a regular file"));
        }
    }
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&at)
        .map_err(io_err(&at))
}

/// Whether the home's files hold session `id`.
fn on_disk(sessions: &Path, id: &str) -> bool {
    std::fs::symlink_metadata(sessions.join(format!("{id}.jsonl"))).is_ok()
}

fn fresh_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// Imports the backup in `src_dir` into `home`, which no server runs on
/// (the caller holds its lock): sessions as `conflict` says, and every other
/// file the home does not have yet (the key store only whole: both its
/// files or neither). `sessions/index.json` is not copied: the next start
/// indexes the new ledgers. Blocking.
pub fn import_offline(home: &Path, src_dir: &str, conflict: Conflict) -> Result<Imported> {
    let staged = stage(home, src_dir)?;
    let sessions = home.join("sessions");
    crate::home::create_private_dir(&sessions).map_err(io_err(&sessions))?;
    let mut out = Imported::default();
    for id in staged.manifest.sessions.clone() {
        let exists = on_disk(&sessions, &id);
        let (target, action) = match (exists, conflict) {
            (false, _) => (id.clone(), Action::Imported),
            (true, Conflict::Skip) => (id.clone(), Action::Skipped),
            (true, Conflict::Overwrite) => (id.clone(), Action::Overwritten),
            (true, Conflict::Rename) => (fresh_id(), Action::Renamed),
        };
        if action != Action::Skipped {
            if target != id {
                staged.rename(&id, &target)?;
            }
            place(
                &sessions,
                &target,
                &staged.ledger(&target),
                staged.title(&target).as_deref(),
            )
            .map_err(io_err(&sessions))?;
        }
        out.sessions.push(ImportedSession {
            session_id: id,
            imported_as: target,
            action,
        });
    }
    let others: Vec<String> = staged
        .manifest
        .files
        .iter()
        .map(|f| f.path.clone())
        .filter(|p| !p.starts_with("sessions/"))
        .collect();
    let secrets_free = SECRET_FILES
        .iter()
        .all(|f| std::fs::symlink_metadata(home.join(f)).is_err());
    for rel in others {
        let to = home.join(&rel);
        let secret = SECRET_FILES.contains(&rel.as_str());
        let free = if secret {
            secrets_free
        } else {
            std::fs::symlink_metadata(&to).is_err()
        };
        if !free {
            out.kept.push(rel);
            continue;
        }
        if let Some(parent) = to.parent() {
            crate::home::create_private_dir(parent).map_err(io_err(parent))?;
        }
        std::fs::rename(staged.dir.join(&rel), &to).map_err(io_err(&to))?;
        out.restored.push(rel);
    }
    Ok(out)
}

/// Puts the ledger staged at `ledger` (and its chosen title, if any) in
/// place as session `id`, each by one rename (an existing one is replaced
/// whole; a title it had and the backup has not is removed).
pub(crate) fn place(sessions: &Path, id: &str, ledger: &Path, title: Option<&Path>) -> std::io::Result<()> {
    crate::home::create_private_dir(sessions)?;
    std::fs::rename(ledger, sessions.join(format!("{id}.jsonl")))?;
    let title_to = crate::session::lifecycle::title_path(sessions, id);
    match title {
        Some(t) => std::fs::rename(t, title_to),
        None => match std::fs::remove_file(title_to) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        },
    }
}

/// Imports the backup in `src_dir` into the home `hub` serves: every file
/// verified first, then each session placed and loaded through the registry
/// (`Registry::adopt`), so it is listed and replays at once. Overwrite is
/// refused (409) when a session it would replace is loaded; then nothing is
/// imported. Only sessions and attachments the home lacks are brought in
/// while a server runs: config, memory, rules, tasks and secrets have live
/// owners, so only `vak backup import` on a stopped home restores them.
pub async fn import(hub: &Hub, src_dir: &str, conflict: Conflict) -> Result<Imported> {
    let cfg = hub.control().config().clone();
    if cfg.nats.is_some() {
        return Err(Error::invalid(
            "with --bus, sessions live in NATS JetStream: backup import reads ledger files only",
        ));
    }
    let home = cfg.home.clone();
    let src = src_dir.to_string();
    let staged = blocking(move || stage(&home, &src)).await?;
    let staged = std::sync::Arc::new(staged);
    let placed = place_all(hub, &staged, conflict).await;
    // The staging folder goes off the runtime, whatever happened.
    let _ = tokio::task::spawn_blocking(move || drop(staged)).await;
    placed
}

/// `import`'s second half: the verified sessions placed one by one.
async fn place_all(hub: &Hub, staged: &std::sync::Arc<Staged>, conflict: Conflict) -> Result<Imported> {
    let cfg = hub.control().config().clone();
    let registry = hub.sessions();
    let sessions_dir = cfg.sessions_dir();
    if conflict == Conflict::Overwrite {
        if let Some(id) = staged
            .manifest
            .sessions
            .iter()
            .find(|id| registry.loaded_session(id).is_some())
        {
            return Err(live(id));
        }
    }
    let mut out = Imported::default();
    for id in staged.manifest.sessions.clone() {
        let (dir, sid) = (sessions_dir.clone(), id.clone());
        let exists = registry.known(&id) || blocking(move || Ok(on_disk(&dir, &sid))).await?;
        let (target, action) = match (exists, conflict) {
            (false, _) => (id.clone(), Action::Imported),
            (true, Conflict::Skip) => (id.clone(), Action::Skipped),
            (true, Conflict::Overwrite) => (id.clone(), Action::Overwritten),
            (true, Conflict::Rename) => (fresh_id(), Action::Renamed),
        };
        let mut action = action;
        if action != Action::Skipped {
            if target != id {
                let (s, from, to) = (staged.clone(), id.clone(), target.clone());
                blocking(move || s.rename(&from, &to)).await?;
            }
            let ledger = staged.ledger(&target);
            let (s, t) = (staged.clone(), target.clone());
            let title = blocking(move || Ok(s.title(&t))).await?;
            let placed = registry
                .adopt(&target, ledger, title, action == Action::Overwritten)
                .await?;
            if !placed {
                action = Action::Skipped;
            }
        }
        out.sessions.push(ImportedSession {
            session_id: id,
            imported_as: target,
            action,
        });
    }
    let (s, h) = (staged.clone(), cfg.home.clone());
    out.restored = blocking(move || attachments(&s, &h)).await?;
    registry.save_index().await;
    Ok(out)
}

/// 409: a session an overwrite would replace is in memory.
fn live(id: &str) -> Error {
    Error::conflict(format!(
        "session {id} is loaded on this server: overwrite replaces only sessions that are not loaded (stop the server and use `vak backup import`, or import with conflict \"rename\")"
    ))
    .with_reason("session_live")
}

/// The backup's attachments the home lacks (they are named by their
/// sha256, so one the home has is the same file).
fn attachments(staged: &Staged, home: &Path) -> Result<Vec<String>> {
    let mut restored = Vec::new();
    for f in &staged.manifest.files {
        if !f.path.starts_with("attachments/") {
            continue;
        }
        let to = home.join(&f.path);
        if std::fs::symlink_metadata(&to).is_ok() {
            continue;
        }
        if let Some(parent) = to.parent() {
            crate::home::create_private_dir(parent).map_err(io_err(parent))?;
        }
        std::fs::rename(staged.dir.join(&f.path), &to).map_err(io_err(&to))?;
        restored.push(f.path.clone());
    }
    Ok(restored)
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::internal(format!("the backup task stopped: {e}")))?
}

/// For the tests: the sha256 of `bytes` as the manifest writes it.
#[cfg(test)]
fn sha(bytes: &[u8]) -> String {
    super::hex(ring::digest::digest(&ring::digest::SHA256, bytes).as_ref())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A home with one session ledger and a memory note.
    fn home_with_session(id: &str) -> tempfile::TempDir {
        let home = tempfile::tempdir().unwrap();
        let s = home.path().join("sessions");
        std::fs::create_dir_all(&s).unwrap();
        let header =
            format!("{{\"header\":{{\"session_id\":\"{id}\",\"created_at\":\"2026-01-01T00:00:00Z\"}}}}\n");
        std::fs::write(s.join(format!("{id}.jsonl")), header).unwrap();
        std::fs::create_dir_all(home.path().join("memory")).unwrap();
        std::fs::write(home.path().join("memory/k.md"), "note").unwrap();
        home
    }

    #[test]
    fn export_then_import_offline_round_trips_and_renames_with_a_fresh_header() {
        let from = home_with_session("s1");
        let out = tempfile::tempdir().unwrap();
        let dest = out.path().join("b");
        let e = super::super::export(from.path(), dest.to_str().unwrap(), false).unwrap();
        assert_eq!(e.sessions, 1);
        let to = home_with_session("s1");
        std::fs::remove_file(to.path().join("memory/k.md")).unwrap();
        let got = import_offline(to.path(), dest.to_str().unwrap(), Conflict::Rename).unwrap();
        assert_eq!(got.sessions[0].action, Action::Renamed);
        let new = &got.sessions[0].imported_as;
        let text = std::fs::read_to_string(to.path().join(format!("sessions/{new}.jsonl"))).unwrap();
        assert!(text.contains(&format!("\"session_id\":\"{new}\"")), "{text}");
        assert_eq!(got.restored, vec!["memory/k.md".to_string()]);
        // No staging folder is left behind.
        let left: Vec<_> = std::fs::read_dir(to.path())
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(".import-"))
            .collect();
        assert!(left.is_empty());
    }

    #[test]
    fn a_ledger_naming_another_session_is_refused_before_anything_is_placed() {
        let from = home_with_session("s1");
        let out = tempfile::tempdir().unwrap();
        let dest = out.path().join("b");
        let ledger = from.path().join("sessions/s1.jsonl");
        let text = std::fs::read_to_string(&ledger)
            .unwrap()
            .replace("\"s1\"", "\"other\"");
        std::fs::write(&ledger, text).unwrap();
        super::super::export(from.path(), dest.to_str().unwrap(), false).unwrap();
        let to = tempfile::tempdir().unwrap();
        let e = import_offline(to.path(), dest.to_str().unwrap(), Conflict::Skip).unwrap_err();
        assert_eq!(e.reason, Some("bad_ledger"), "{}", e.message);
        assert!(!to.path().join("sessions/s1.jsonl").exists());
    }

    #[test]
    fn a_hostile_manifest_is_refused_before_anything_is_read() {
        let home = tempfile::tempdir().unwrap();
        let src = tempfile::tempdir().unwrap();
        let write = |files: &str| {
            let m = format!(
                "{{\"format\":\"vak-backup\",\"version\":1,\"vak_version\":\"x\",\"created_at\":\"x\",\"include_secrets\":false,\"sessions\":[],\"files\":{files}}}"
            );
            std::fs::write(src.path().join(MANIFEST), m).unwrap();
        };
        let s = sha(b"x");
        write(&format!(
            "[{{\"path\":\"../etc/passwd\",\"size\":1,\"sha256\":\"{s}\"}}]"
        ));
        let e = import_offline(home.path(), src.path().to_str().unwrap(), Conflict::Skip).unwrap_err();
        assert_eq!(e.reason, Some("bad_manifest"));
        // A symlink out of the backup is not followed.
        std::fs::create_dir_all(src.path().join("memory")).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", src.path().join("memory/x")).unwrap();
        write(&format!(
            "[{{\"path\":\"memory/x\",\"size\":1,\"sha256\":\"{s}\"}}]"
        ));
        let e = import_offline(home.path(), src.path().to_str().unwrap(), Conflict::Skip).unwrap_err();
        assert_eq!(e.reason, Some("manifest_mismatch"));
        assert!(e.message.contains("memory/x"), "{}", e.message);
    }
}
