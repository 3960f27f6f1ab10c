//! Memory notes: what the user asked vak to remember across sessions, in two tiers (the workspace's notes and the user's global `USER.md` profile), kept in the home and shown to the model in its system prompt.
//!
//! Both tiers are Markdown files a person can read and edit: each note is a
//! block that starts with a provenance header line
//! (`<!-- vak:note id=mem_… kind=… tag=… session_id=… created_at=… updated_at=… -->`)
//! followed by its text. Whatever precedes the first header (a hand-written
//! profile, say) is kept byte for byte on every rewrite and shown to the
//! model with the notes.
//!
//! The workspace tier lives in `<home>/memory/<workspace key>.md`, keyed like
//! the permission rules, never inside the workspace (which may be hostile
//! and is often committed); the user tier is `<home>/USER.md`. Every read
//! runs on a blocking thread and reads the file again (so a hand edit is
//! seen at the next model turn), bounded by `MAX_FILE`. Every change is a
//! read-modify-write of one tier, one change at a time on the memory's
//! owner task (`file_owner.rs`, so no lock is held across the I/O), written whole
//! through a temporary file and a rename (0600), so a crash leaves the old
//! file or the new one, and a hand edit made before the change is kept.

use crate::cluster::shared_memory::SharedMemory;
use crate::error::{Error, ErrorKind, Result};
use crate::file_owner::FileOwner;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The longest note, in bytes of text.
pub const MAX_NOTE: usize = 4096;
/// The most notes one tier keeps.
pub const MAX_NOTES: usize = 200;
/// The most of a tier's file vak reads (a larger, hand-grown file is refused
/// with a clear error rather than read whole).
pub const MAX_FILE: u64 = 1 << 20;
/// The most of one tier the system prompt carries; the newest notes that do
/// not fit are left out with a note saying how many.
pub const MAX_PROMPT: usize = 16 * 1024;
/// The longest `kind` or `tag`.
const MAX_LABEL: usize = 32;

const HEADER: &str = "<!-- vak:note ";
const HEADER_END: &str = " -->";

/// Which tier a note is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// This server's workspace.
    Workspace,
    /// The user's global profile (`USER.md` in the home), for every workspace.
    User,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Workspace => "workspace",
            Scope::User => "user",
        }
    }
}

/// One note as stored and listed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    /// `mem_` and 12 hex digits.
    pub id: String,
    pub scope: Scope,
    pub text: String,
    /// Free labels a client may set (`fact`, `preference`…); empty when unset.
    pub kind: String,
    pub tag: String,
    /// The session the note was taken in, if a client named one.
    pub session_id: String,
    /// RFC 3339, UTC.
    pub created_at: String,
    pub updated_at: String,
}

/// What `add` takes.
#[derive(Clone, Debug, Default)]
pub struct NewNote {
    pub text: String,
    pub kind: String,
    pub tag: String,
    pub scope: Option<Scope>,
    pub session_id: String,
}

/// One tier's file, parsed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Tier {
    /// Everything before the first note header, verbatim.
    preamble: String,
    notes: Vec<Note>,
}

impl Tier {
    fn parse(text: &str, scope: Scope) -> Tier {
        let mut tier = Tier::default();
        let mut current: Option<(Note, String)> = None;
        for line in text.split_inclusive('\n') {
            if let Some(note) = parse_header(line.trim_end_matches(['\n', '\r']), scope) {
                if let Some((n, body)) = current.take() {
                    tier.notes.push(finish(n, &body));
                }
                current = Some((note, String::new()));
            } else if let Some((_, body)) = current.as_mut() {
                body.push_str(line);
            } else {
                tier.preamble.push_str(line);
            }
        }
        if let Some((n, body)) = current {
            tier.notes.push(finish(n, &body));
        }
        tier
    }

    fn render(&self) -> String {
        let mut out = self.preamble.clone();
        if !out.is_empty() && !out.ends_with('\n') {
            out.push('\n');
        }
        for (i, n) in self.notes.iter().enumerate() {
            // A blank line between notes, for people; the preamble is left as it was.
            if i > 0 {
                out.push('\n');
            }
            out.push_str(HEADER);
            out.push_str(&format!("id={}", n.id));
            for (k, v) in [
                ("kind", &n.kind),
                ("tag", &n.tag),
                ("session_id", &n.session_id),
                ("created_at", &n.created_at),
                ("updated_at", &n.updated_at),
            ] {
                if !v.is_empty() {
                    out.push_str(&format!(" {k}={v}"));
                }
            }
            out.push_str(HEADER_END);
            out.push('\n');
            out.push_str(&n.text);
            out.push('\n');
        }
        out
    }
}

fn finish(mut note: Note, body: &str) -> Note {
    note.text = body.trim().to_string();
    note
}

/// A header line's note (with no text yet); None for any other line, also
/// a header without a well-formed id.
fn parse_header(line: &str, scope: Scope) -> Option<Note> {
    let inner = line.strip_prefix(HEADER)?.strip_suffix(HEADER_END)?;
    let mut note = Note {
        id: String::new(),
        scope,
        text: String::new(),
        kind: String::new(),
        tag: String::new(),
        session_id: String::new(),
        created_at: String::new(),
        updated_at: String::new(),
    };
    for field in inner.split_whitespace() {
        let (k, v) = field.split_once('=')?;
        let slot = match k {
            "id" => &mut note.id,
            "kind" => &mut note.kind,
            "tag" => &mut note.tag,
            "session_id" => &mut note.session_id,
            "created_at" => &mut note.created_at,
            "updated_at" => &mut note.updated_at,
            _ => continue,
        };
        *slot = v.to_string();
    }
    valid_id(&note.id).then_some(note)
}

fn valid_id(id: &str) -> bool {
    id.strip_prefix("mem_")
        .is_some_and(|hex| hex.len() == 12 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// A note's text, trimmed: 1 to `MAX_NOTE` bytes, and no line that would
/// read back as a note header.
pub fn validate_text(text: &str) -> Result<String> {
    let text = text.trim();
    if text.is_empty() {
        return Err(Error::invalid("text is required: the note to remember"));
    }
    if text.len() > MAX_NOTE {
        return Err(Error::invalid(format!(
            "the note is {} bytes; a note holds at most {MAX_NOTE}",
            text.len()
        )));
    }
    if text
        .lines()
        .any(|l| l.trim_start().starts_with(HEADER.trim_end()))
    {
        return Err(Error::invalid(format!(
            "a note cannot contain a line starting with {:?}: vak's note header",
            HEADER.trim_end()
        )));
    }
    Ok(text.to_string())
}

/// `kind` and `tag`: empty, or 1 to 32 of A-Z a-z 0-9 - _ . (they sit in
/// the header line, so no spaces and nothing that could end it).
fn validate_label(what: &str, v: &str) -> Result<()> {
    let ok = v.len() <= MAX_LABEL
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "invalid {what} {:?}: at most {MAX_LABEL} of A-Z a-z 0-9 - _ .",
            v.chars().take(80).collect::<String>()
        )))
    }
}

/// A scope named on the wire: `workspace` or `user`.
pub fn parse_scope(s: &str) -> Result<Scope> {
    match s {
        "workspace" => Ok(Scope::Workspace),
        "user" => Ok(Scope::User),
        other => Err(Error::invalid(format!(
            "invalid scope {:?}: workspace or user",
            other.chars().take(80).collect::<String>()
        ))),
    }
}

/// Reads a tier's file (blocking): a missing file is an empty tier.
fn read_tier(path: &Path, scope: Scope) -> Result<(Tier, bool)> {
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((Tier::default(), true)),
        Err(e) => return Err(Error::internal(format!("cannot read {}: {e}", path.display()))),
    };
    let mut buf = Vec::new();
    file.take(MAX_FILE + 1)
        .read_to_end(&mut buf)
        .map_err(|e| Error::internal(format!("cannot read {}: {e}", path.display())))?;
    if buf.len() as u64 > MAX_FILE {
        return Err(Error::new(
            ErrorKind::TooLarge,
            format!(
                "the {} memory file is larger than {MAX_FILE} bytes, the most vak reads: shorten it by hand",
                scope.as_str()
            ),
        ));
    }
    match String::from_utf8(buf) {
        Ok(text) => Ok((Tier::parse(&text, scope), true)),
        // Shown lossily, but never rewritten: that would change bytes nobody asked to change.
        Err(e) => Ok((Tier::parse(&String::from_utf8_lossy(e.as_bytes()), scope), false)),
    }
}

fn now() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
}

/// The memory of this server's workspace and of its user.
pub struct Memory {
    workspace: String,
    /// Where the tiers are kept; reads go there directly.
    tiers: Arc<Tiers>,
    /// Where every change runs, one at a time on this replica, from
    /// reading a tier to writing it back (the I/O on a blocking thread;
    /// reads never wait). Across replicas the bucket's revision check does this.
    file: FileOwner<Arc<Tiers>>,
}

/// Where the two tiers are kept.
struct Tiers {
    /// The folder and file name of each tier.
    workspace_tier: (PathBuf, String),
    user_tier: (PathBuf, String),
    /// With `--bus`: the tiers live in `VAK_MEMORY` (`shared_memory.rs`),
    /// the files only seed a tier the bucket never held.
    shared: Option<Arc<SharedMemory>>,
    /// The workspace tier's key in the bucket.
    workspace_key: String,
}

/// A tier as read to be changed: parsed, and the bucket revision a change
/// must still find (None: in a file, or a key the bucket never held).
struct Read {
    tier: Tier,
    utf8: bool,
    rev: Option<u64>,
}

impl Memory {
    /// Blocking (it resolves the workspace's path): call it at startup.
    /// `shared`: the bucket every replica keeps its notes in (`--bus`).
    pub fn new(home: &Path, workspace: &Path, shared: Option<Arc<SharedMemory>>) -> Memory {
        let (workspace, key) = crate::home::workspace_key(workspace);
        let tiers = Arc::new(Tiers {
            workspace_tier: (home.join("memory"), format!("{key}.md")),
            user_tier: (home.to_path_buf(), "USER.md".into()),
            shared,
            workspace_key: format!("{}{key}", crate::cluster::shared_memory::WORKSPACE_PREFIX),
        });
        Memory {
            workspace,
            tiers: tiers.clone(),
            file: FileOwner::new("the memory files", tiers),
        }
    }

    /// The workspace the workspace tier belongs to (canonical).
    pub fn workspace(&self) -> &str {
        &self.workspace
    }

    /// Every note, the workspace's first, each tier oldest first.
    pub async fn list(&self) -> Result<Vec<Note>> {
        let mut all = self.tiers.read(Scope::Workspace).await?.tier.notes;
        all.extend(self.tiers.read(Scope::User).await?.tier.notes);
        Ok(all)
    }
}

impl Tiers {
    fn tier_file(&self, scope: Scope) -> &(PathBuf, String) {
        match scope {
            Scope::Workspace => &self.workspace_tier,
            Scope::User => &self.user_tier,
        }
    }

    fn bucket_key(&self, scope: Scope) -> &str {
        match scope {
            Scope::Workspace => &self.workspace_key,
            Scope::User => crate::cluster::shared_memory::USER_KEY,
        }
    }

    async fn read_file(&self, scope: Scope) -> Result<(Tier, bool)> {
        let (dir, name) = self.tier_file(scope);
        let path = dir.join(name);
        tokio::task::spawn_blocking(move || read_tier(&path, scope))
            .await
            .map_err(|e| Error::internal(e.to_string()))?
    }

    /// A tier as its store holds it now: its file, or with `--bus` the
    /// bucket's key (imported once from this home's file when the bucket
    /// never held it).
    async fn read(&self, scope: Scope) -> Result<Read> {
        let Some(shared) = &self.shared else {
            let (tier, utf8) = self.read_file(scope).await?;
            return Ok(Read {
                tier,
                utf8,
                rev: None,
            });
        };
        let key = self.bucket_key(scope);
        if let Some((text, rev)) = shared.read(key).await? {
            return Ok(Read {
                tier: Tier::parse(&text, scope),
                utf8: true,
                rev: Some(rev),
            });
        }
        match self.read_file(scope).await {
            Ok((tier, true)) if !tier.notes.is_empty() || !tier.preamble.trim().is_empty() => {
                // Whoever imports first, every replica then reads the
                // bucket's. A file too large for the bucket stays out of
                // it (the next replica's may go in), never failing a read.
                match shared.write(key, scope.as_str(), tier.render(), None).await {
                    Err(e) if e.kind == ErrorKind::TooLarge => tracing::warn!(
                        scope = scope.as_str(),
                        "this home's memory file is not imported into {}: {}",
                        crate::cluster::shared_memory::BUCKET,
                        e.message
                    ),
                    other => {
                        other?;
                    }
                }
                if let Some((text, rev)) = shared.read(key).await? {
                    return Ok(Read {
                        tier: Tier::parse(&text, scope),
                        utf8: true,
                        rev: Some(rev),
                    });
                }
            }
            Ok((_, true)) => {}
            Ok((_, false)) => tracing::warn!(
                scope = scope.as_str(),
                "this home's memory file is not UTF-8: not imported into {}",
                crate::cluster::shared_memory::BUCKET
            ),
            Err(e) => tracing::warn!(
                scope = scope.as_str(),
                "this home's memory file is not imported into {}: {e}",
                crate::cluster::shared_memory::BUCKET
            ),
        }
        Ok(Read {
            tier: Tier::default(),
            utf8: true,
            rev: None,
        })
    }

    /// Writes a tier whole: its file (temporary file, rename, 0600, off the
    /// runtime), or the bucket's key if it is still at `rev`. False when
    /// another replica changed the tier first.
    async fn write(&self, scope: Scope, tier: &Tier, rev: Option<u64>) -> Result<bool> {
        if let Some(shared) = &self.shared {
            let key = self.bucket_key(scope);
            let written = shared.write(key, scope.as_str(), tier.render(), rev).await?;
            return Ok(written.is_some());
        }
        let (dir, name) = self.tier_file(scope).clone();
        let bytes = tier.render().into_bytes();
        tokio::task::spawn_blocking(move || {
            crate::home::create_private_dir(&dir)
                .map_err(|e| Error::internal(format!("cannot create {}: {e}", dir.display())))?;
            crate::home::write_private_file(&dir, &name, &bytes)
        })
        .await
        .map_err(|e| Error::internal(e.to_string()))??;
        Ok(true)
    }

    /// Reads `scope`'s tier, lets `f` change it (None: `f` found nothing to
    /// change, nothing is written) and writes it back; when another replica
    /// changed the tier meanwhile, reads it again and asks `f` again, so a
    /// bound or a missing note is decided on the tier as it is. Refused
    /// when the tier's file is not UTF-8.
    async fn change_tier<T>(
        &self,
        scope: Scope,
        f: &mut impl FnMut(&mut Tier) -> Result<Option<T>>,
    ) -> Result<Option<T>> {
        for _ in 0..crate::cluster::shared_config::CAS_TRIES {
            let Read { mut tier, utf8, rev } = self.read(scope).await?;
            if !utf8 {
                return Err(Error::new(
                    ErrorKind::Conflict,
                    format!(
                        "the {} memory file is not valid UTF-8; vak will not rewrite it: fix it by hand",
                        scope.as_str()
                    ),
                ));
            }
            let Some(out) = f(&mut tier)? else {
                return Ok(None);
            };
            if self.write(scope, &tier, rev).await? {
                return Ok(Some(out));
            }
        }
        Err(Error::new(
            ErrorKind::Unavailable,
            format!(
                "the {} memory keeps changing on other replicas; try again",
                scope.as_str()
            ),
        ))
    }

    /// `Memory::change_note` on the owner's task: `f` on note `id` in the
    /// first of `scopes` that holds it.
    async fn change_note<T>(
        &self,
        id: &str,
        scope: Option<Scope>,
        mut f: impl FnMut(&mut Tier, usize) -> T,
    ) -> Result<T> {
        let scopes = match scope {
            Some(s) => vec![s],
            None => vec![Scope::Workspace, Scope::User],
        };
        for s in scopes {
            let mut find = |tier: &mut Tier| -> Result<Option<T>> {
                Ok(tier.notes.iter().position(|n| n.id == id).map(|at| f(tier, at)))
            };
            if let Some(out) = self.change_tier(s, &mut find).await? {
                return Ok(out);
            }
        }
        let where_ = scope.map_or(String::new(), |s| format!(" in the {} memory", s.as_str()));
        Err(Error::not_found(format!("no memory note {id}{where_}")))
    }
}

impl Memory {
    /// Appends a note to its tier (the workspace's when none is named).
    pub async fn add(&self, new: NewNote) -> Result<Note> {
        let text = validate_text(&new.text)?;
        validate_label("kind", &new.kind)?;
        validate_label("tag", &new.tag)?;
        if !new.session_id.is_empty() {
            crate::ids::validate_session_id(&new.session_id)?;
        }
        let scope = new.scope.unwrap_or(Scope::Workspace);
        let at = now();
        let note = Note {
            id: format!("mem_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]),
            scope,
            text,
            kind: new.kind,
            tag: new.tag,
            session_id: new.session_id,
            created_at: at.clone(),
            updated_at: at,
        };
        let kept = note.clone();
        let added = self
            .file
            .change(move |tiers| {
                Box::pin(async move {
                    tiers
                        .change_tier(scope, &mut |tier| {
                            if tier.notes.len() >= MAX_NOTES {
                                return Err(Error::new(
                                    ErrorKind::ResourceExhausted,
                                    format!(
                                        "the {} memory already has {MAX_NOTES} notes, the most it keeps: delete some first",
                                        scope.as_str()
                                    ),
                                ));
                            }
                            tier.notes.push(kept.clone());
                            Ok(Some(()))
                        })
                        .await
                })
            })
            .await??;
        debug_assert!(added.is_some());
        Ok(note)
    }

    /// Changes note `id` with `f`, in the named tier or in either (the
    /// workspace's first), on the owner's task; what `f` answers. NotFound
    /// for an unknown id.
    async fn change_note<T: Send + 'static>(
        &self,
        id: &str,
        scope: Option<Scope>,
        f: impl FnMut(&mut Tier, usize) -> T + Send + 'static,
    ) -> Result<T> {
        if !valid_id(id) {
            return Err(Error::invalid(format!(
                "invalid note id {:?}: mem_ and 12 hex digits",
                id.chars().take(80).collect::<String>()
            )));
        }
        let id = id.to_string();
        self.file
            .change(move |tiers| Box::pin(async move { tiers.change_note(&id, scope, f).await }))
            .await?
    }

    /// Replaces a note's text; its provenance (kind, tag, session, creation) stays.
    pub async fn update(&self, id: &str, text: &str, scope: Option<Scope>) -> Result<Note> {
        let text = validate_text(text)?;
        let at = now();
        self.change_note(id, scope, move |tier, i| {
            let note = &mut tier.notes[i];
            note.text = text.clone();
            note.updated_at = at.clone();
            note.clone()
        })
        .await
    }

    /// Forgets a note; the note forgotten. NotFound for an unknown id.
    pub async fn delete(&self, id: &str, scope: Option<Scope>) -> Result<Note> {
        self.change_note(id, scope, |tier, i| tier.notes.remove(i)).await
    }

    /// What the system prompt says of memory: the user's profile, then the
    /// workspace's notes, each tier bounded by `MAX_PROMPT`. Empty when there
    /// is none; a tier that cannot be read is left out with a log line (a
    /// model turn never fails over memory).
    pub async fn prompt(&self) -> String {
        let mut out = String::new();
        for (scope, title) in [
            (
                Scope::User,
                "The user's profile (USER.md, kept across every workspace)",
            ),
            (Scope::Workspace, "Notes remembered for this workspace"),
        ] {
            let tier = match self.tiers.read(scope).await {
                Ok(read) => read.tier,
                Err(e) => {
                    tracing::warn!(scope = scope.as_str(), "memory left out of the prompt: {e}");
                    continue;
                }
            };
            let body = prompt_tier(&tier);
            if !body.is_empty() {
                out.push_str(&format!("\n{title}:\n\n{body}"));
            }
        }
        out
    }
}

/// One tier as the model sees it: its preamble and one bullet per note,
/// oldest first, cut at `MAX_PROMPT` bytes with a note of what was left out.
fn prompt_tier(tier: &Tier) -> String {
    let mut out = String::new();
    let preamble = tier.preamble.trim();
    let preamble = preamble.get(..floor(preamble, MAX_PROMPT)).unwrap_or_default();
    if !preamble.is_empty() {
        out.push_str(preamble);
        out.push('\n');
    }
    for (i, n) in tier.notes.iter().enumerate() {
        let line = format!("- {}\n", n.text.replace('\n', "\n  "));
        if out.len() + line.len() > MAX_PROMPT {
            out.push_str(&format!(
                "[{} more notes are not shown: the prompt holds at most {MAX_PROMPT} bytes of them]\n",
                tier.notes.len() - i
            ));
            break;
        }
        out.push_str(&line);
    }
    out
}

/// The largest char boundary of `s` at or below `max` (search cuts its documents with it too).
pub(crate) fn floor(s: &str, max: usize) -> usize {
    (0..=max.min(s.len()))
        .rev()
        .find(|&i| s.is_char_boundary(i))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note(text: &str, scope: Option<Scope>) -> NewNote {
        NewNote {
            text: text.into(),
            scope,
            ..Default::default()
        }
    }

    #[test]
    fn a_tier_round_trips_and_keeps_a_hand_written_preamble_byte_for_byte() {
        let text = "# Me\n\nI like tabs.\r\nNo header here.\n\n\
            <!-- vak:note id=mem_0123456789ab kind=fact tag=x created_at=t1 updated_at=t2 -->\n\
            line one\nline two\n\n\
            <!-- vak:note id=bad -->\nkept as text of the note before\n";
        let tier = Tier::parse(text, Scope::User);
        assert_eq!(tier.preamble, "# Me\n\nI like tabs.\r\nNo header here.\n\n");
        assert_eq!(tier.notes.len(), 1);
        let n = &tier.notes[0];
        assert_eq!((n.kind.as_str(), n.tag.as_str()), ("fact", "x"));
        assert!(n.text.starts_with("line one\nline two") && n.text.ends_with("before"));
        let again = Tier::parse(&tier.render(), Scope::User);
        assert_eq!(again, tier);
        assert!(tier
            .render()
            .starts_with("# Me\n\nI like tabs.\r\nNo header here.\n\n<!-- vak:note"));
        let bare = Tier::parse("just me\n", Scope::User);
        assert_eq!(Tier::parse(&bare.render(), Scope::User), bare);
    }

    #[test]
    fn text_that_would_forge_a_header_or_is_too_long_is_refused() {
        assert!(validate_text("a\n<!-- vak:note id=mem_0123456789ab -->\nb").is_err());
        assert!(validate_text("  \n").is_err());
        assert!(validate_text(&"x".repeat(MAX_NOTE + 1)).is_err());
        assert_eq!(validate_text("  keep  \n").unwrap(), "keep");
        assert!(validate_label("kind", "has space").is_err());
        assert!(validate_label("kind", "a-->").is_err());
        assert!(validate_label("tag", "build.v2").is_ok());
    }

    #[tokio::test]
    async fn notes_persist_per_workspace_are_bounded_and_reach_the_prompt() {
        let (home, ws, other) = (
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
        );
        let m = Memory::new(home.path(), ws.path(), None);
        let a = m.add(note("uses tabs", None)).await.unwrap();
        let u = m.add(note("call me Sam", Some(Scope::User))).await.unwrap();
        assert_eq!((a.scope, u.scope), (Scope::Workspace, Scope::User));
        let prompt = m.prompt().await;
        assert!(
            prompt.contains("- uses tabs") && prompt.contains("- call me Sam"),
            "{prompt}"
        );
        // Another workspace shares the profile, not the notes.
        let o = Memory::new(home.path(), other.path(), None);
        let theirs = o.prompt().await;
        assert!(theirs.contains("call me Sam") && !theirs.contains("uses tabs"));
        use std::os::unix::fs::PermissionsExt;
        for p in [home.path().join("USER.md"), home.path().join("memory")] {
            let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
            assert!(mode == 0o600 || mode == 0o700, "{}: {mode:o}", p.display());
        }

        let changed = m.update(&a.id, "uses four spaces", None).await.unwrap();
        assert_eq!(
            (changed.created_at, changed.scope),
            (a.created_at.clone(), Scope::Workspace)
        );
        let e = m.delete(&a.id, Some(Scope::User)).await.unwrap_err();
        assert_eq!(e.kind, ErrorKind::NotFound);
        assert_eq!(m.delete(&a.id, None).await.unwrap().text, "uses four spaces");
        assert_eq!(m.delete(&a.id, None).await.unwrap_err().kind, ErrorKind::NotFound);
        assert_eq!(m.list().await.unwrap(), vec![u.clone()]);

        for i in 1..MAX_NOTES {
            m.add(note(
                &format!("profile fact {i} {}", "y".repeat(200)),
                Some(Scope::User),
            ))
            .await
            .unwrap();
        }
        let full = m.add(note("one too many", Some(Scope::User))).await.unwrap_err();
        assert_eq!(full.kind, ErrorKind::ResourceExhausted);
        let prompt = m.prompt().await;
        assert!(prompt.len() < 2 * MAX_PROMPT && prompt.contains("more notes are not shown"));
    }

    #[tokio::test]
    async fn a_file_past_the_read_bound_or_not_utf8_is_never_rewritten() {
        let (home, ws) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let m = Memory::new(home.path(), ws.path(), None);
        let user = home.path().join("USER.md");
        std::fs::write(&user, b"caf\xe9\n").unwrap();
        let e = m.add(note("x", Some(Scope::User))).await.unwrap_err();
        assert_eq!(e.kind, ErrorKind::Conflict);
        assert_eq!(std::fs::read(&user).unwrap(), b"caf\xe9\n");
        std::fs::write(&user, vec![b'a'; MAX_FILE as usize + 1]).unwrap();
        assert_eq!(m.list().await.unwrap_err().kind, ErrorKind::TooLarge);
        // The prompt goes on without it.
        m.add(note("still here", None)).await.unwrap();
        assert!(m.prompt().await.contains("still here"));
    }
}
