//! Promoted skills as files: `<workspace>/.vak/skills/<name>.md` and `<home>/skills/<name>.md`, a small front matter (name, description, kind) over the body; read bounded, written atomically and never over an existing one.

use super::{check_name, SkillKind};
use crate::error::{Error, Result};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// The most skills listed from one folder.
pub const MAX_SKILLS: usize = 200;
/// The largest skill file read, in bytes.
const MAX_FILE: u64 = 64 * 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// `<workspace>/.vak/skills/`: this workspace's sessions.
    Workspace,
    /// `<home>/skills/`: every workspace's.
    Global,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Workspace => "workspace",
            Scope::Global => "global",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skill {
    pub name: String,
    pub description: String,
    pub kind: SkillKind,
    pub body: String,
    pub scope: Scope,
    pub path: PathBuf,
}

pub(crate) fn dir(home: &Path, workspace: &Path, scope: Scope) -> PathBuf {
    match scope {
        Scope::Workspace => workspace.join(".vak").join("skills"),
        Scope::Global => home.join("skills"),
    }
}

fn render(s: &Skill) -> String {
    let one_line = |t: &str| t.replace(['\n', '\r'], " ");
    format!(
        "---\nname: {}\ndescription: {}\nkind: {}\n---\n{}\n",
        s.name,
        one_line(&s.description),
        s.kind.as_str(),
        s.body
    )
}

/// A skill file's front matter and body; None when it is not one.
fn parse(text: &str, scope: Scope, path: &Path) -> Option<Skill> {
    let rest = text.strip_prefix("---\n")?;
    let (head, body) = rest.split_once("\n---\n")?;
    let mut name = None;
    let mut description = String::new();
    let mut kind = SkillKind::Prompt;
    for line in head.lines() {
        let (k, v) = line.split_once(':')?;
        let v = v.trim();
        match k.trim() {
            "name" => name = Some(v.to_string()),
            "description" => description = v.to_string(),
            "kind" => {
                kind = match v {
                    "prompt" => SkillKind::Prompt,
                    "script" => SkillKind::Script,
                    _ => return None,
                }
            }
            _ => {}
        }
    }
    let name = name?;
    check_name(&name).ok()?;
    Some(Skill {
        name,
        description,
        kind,
        body: body.trim_end_matches('\n').to_string(),
        scope,
        path: path.to_path_buf(),
    })
}

/// The skill files of one folder, by name; what is not one is skipped
/// with a warning. Symlinks are not followed (a workspace is not trusted).
fn read_dir(dir: &Path, scope: Scope) -> Vec<Skill> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in entries.flatten() {
        let path = e.path();
        let is_md = path.extension().is_some_and(|x| x == "md");
        let regular = e.file_type().is_ok_and(|t| t.is_file());
        if !is_md || !regular {
            continue;
        }
        if out.len() == MAX_SKILLS {
            tracing::warn!(dir = %dir.display(), "more than {MAX_SKILLS} skills: the rest are left out");
            break;
        }
        match read_skill(&path, scope) {
            Ok(Some(s)) => out.push(s),
            Ok(None) => {
                tracing::warn!(path = %path.display(), "not a skill file (front matter with name, description, kind): skipped")
            }
            Err(e) => tracing::warn!(path = %path.display(), "cannot read a skill: {}", e.message),
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// One skill file, at most 64 KiB. Blocking.
pub fn read_skill(path: &Path, scope: Scope) -> Result<Option<Skill>> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| Error::internal(format!("cannot open {}: {e}", path.display())))?;
    let mut text = String::new();
    file.take(MAX_FILE + 1)
        .read_to_string(&mut text)
        .map_err(|e| Error::internal(format!("cannot read {}: {e}", path.display())))?;
    if text.len() as u64 > MAX_FILE {
        return Err(Error::too_large(format!(
            "{} is over {MAX_FILE} bytes",
            path.display()
        )));
    }
    Ok(parse(&text, scope, path))
}

/// Whether `.vak` and `.vak/skills` of `workspace` are plain folders (not
/// symlinks, which a hostile repository could point anywhere).
fn plain_folders(workspace: &Path) -> bool {
    let plain = |p: &Path| std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_dir());
    let vak = workspace.join(".vak");
    plain(&vak) && plain(&vak.join("skills"))
}

/// The skills for `workspace`: its own, then the home's (a name both have is the workspace's). Blocking.
pub fn list(home: &Path, workspace: &Path) -> Result<Vec<Skill>> {
    let own = dir(home, workspace, Scope::Workspace);
    let mut out = if plain_folders(workspace) {
        read_dir(&own, Scope::Workspace)
    } else {
        if std::fs::symlink_metadata(&own).is_ok() {
            tracing::warn!(dir = %own.display(), "the workspace's skills folder (or .vak) is a symlink: its skills are not read");
        }
        Vec::new()
    };
    for s in read_dir(&dir(home, workspace, Scope::Global), Scope::Global) {
        if !out.iter().any(|o| o.name == s.name) {
            out.push(s);
        }
    }
    Ok(out)
}

/// Writes `s` at its path, never over a file already there; in a
/// workspace, confined to it (no symlink leads the write out). Blocking.
pub(crate) fn write(s: &Skill, workspace: &Path) -> Result<()> {
    if s.scope == Scope::Workspace {
        return write_beneath(s, workspace);
    }
    let dir = s
        .path
        .parent()
        .ok_or_else(|| Error::internal("a skill path has a folder"))?;
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::internal(format!("cannot create {}: {e}", dir.display())))?;
    let mut f = match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&s.path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            return Err(Error::conflict(format!(
                "a skill named {} already exists ({}): promote it under another name",
                s.name,
                s.path.display()
            ))
            .with_reason("skill_exists"))
        }
        Err(e) => return Err(Error::internal(format!("cannot write {}: {e}", s.path.display()))),
    };
    f.write_all(render(s).as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(|e| Error::internal(format!("cannot write {}: {e}", s.path.display())))
}

fn write_beneath(s: &Skill, workspace: &Path) -> Result<()> {
    use crate::workspace::{explain, make_dir_beneath, open_beneath, open_root};
    let file = format!("{}.md", s.name);
    let parts = [".vak", "skills", file.as_str()];
    let refused =
        |e: String| Error::invalid(format!("cannot write the skill in {}: {e}", workspace.display()));
    let root = open_root(workspace).map_err(refused)?;
    for depth in 1..=2 {
        make_dir_beneath(&root, &parts[..depth])
            .map_err(|e| refused(explain(&parts[..depth].join("/"), "create", e)))?;
    }
    let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    let fd = match open_beneath(&root, &parts, flags, 0o644) {
        Ok(fd) => fd,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            return Err(Error::conflict(format!(
                "a skill named {} already exists ({}): promote it under another name",
                s.name,
                s.path.display()
            ))
            .with_reason("skill_exists"))
        }
        Err(e) => return Err(refused(explain(&parts.join("/"), "write", e))),
    };
    let mut f = std::fs::File::from(fd);
    f.write_all(render(s).as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(|e| Error::internal(format!("cannot write {}: {e}", s.path.display())))
}
