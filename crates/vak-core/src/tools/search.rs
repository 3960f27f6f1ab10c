//! list_dir, glob and grep: looking around the workspace without leaving it.
//!
//! A folder a tool names is first opened beneath the workspace (the same
//! openat2 `RESOLVE_BENEATH` as read_file, so `..`, absolute paths and
//! symlinks leading out are refused with clear messages). glob and grep then
//! walk from a descriptor of the workspace (`/proc/self/fd/N`, pinned even if
//! the workspace path is swapped) with the `ignore` crate: .gitignore,
//! .ignore and .git/info/exclude are respected (in a git repository or not),
//! `.git` itself is skipped, hidden files are included, and no symlink is
//! followed. Only the named folder's branch is walked, so the .gitignore
//! files of the folders above it inside the workspace still apply. grep opens
//! each file it searches beneath the workspace descriptor again, so a file
//! swapped for a symlink mid-walk is refused rather than read.
//!
//! These functions block: call them from `spawn_blocking`. They check
//! `cancel` as they go and stop when it fires.

use crate::workspace;
use serde_json::Value;
use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use tokio_util::sync::CancellationToken;

/// The most entries list_dir shows.
pub(crate) const MAX_LIST: usize = 1000;
/// The most paths glob returns.
pub(crate) const MAX_GLOB: usize = 1000;
/// The most matching lines grep returns, and the most bytes they take.
pub(crate) const MAX_GREP_LINES: usize = 1000;
pub(crate) const MAX_GREP_BYTES: usize = 256 * 1024;
/// A matching line longer than this is cut with `…`.
pub(crate) const MAX_GREP_LINE: usize = 500;
/// The most files and folders one glob or grep walks.
pub(crate) const MAX_WALK: usize = 200_000;
/// The longest pattern glob or grep accepts.
pub(crate) const MAX_PATTERN: usize = 4096;

const CANCELLED: &str = "cancelled";

/// Runs list_dir, glob or grep with its JSON input.
pub(crate) fn run(
    workspace: &Path,
    tool: &str,
    input: &Value,
    cancel: &CancellationToken,
) -> Result<String, String> {
    let string = |k: &str| -> Result<Option<&str>, String> {
        match input.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(format!("{tool}: `{k}` must be a string")),
        }
    };
    let path = string("path")?;
    if tool == "list_dir" {
        return list_dir(workspace, path);
    }
    let Some(pattern) = string("pattern")? else {
        return Err(format!("{tool} needs a string `pattern`"));
    };
    if tool == "glob" {
        return glob(workspace, pattern, path, cancel);
    }
    let case_insensitive = match input.get("case_insensitive") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err("grep: `case_insensitive` must be true or false".into()),
    };
    let args = GrepArgs {
        pattern,
        path,
        glob: string("glob")?,
        case_insensitive,
    };
    grep(workspace, &args, cancel)
}

/// Checks a pattern argument: not empty, no NUL, bounded.
pub(crate) fn check_pattern(tool: &str, what: &str, p: &str) -> Result<(), String> {
    if p.is_empty() {
        return Err(format!("{tool}: `{what}` is empty"));
    }
    if p.contains('\0') {
        return Err(format!("{tool}: `{what}` contains a NUL byte"));
    }
    if p.len() > MAX_PATTERN {
        return Err(format!(
            "{tool}: `{what}` is {} bytes long; the limit is {MAX_PATTERN}",
            p.len()
        ));
    }
    Ok(())
}

/// The components of an optional folder argument (`.` or absent is the root).
fn parts(path: Option<&str>) -> Result<Vec<&str>, String> {
    match path {
        None | Some("") | Some(".") => Ok(Vec::new()),
        Some(p) => workspace::components(p),
    }
}

/// Opens `parts` beneath `root` (following only symlinks that stay inside).
fn open_in(root: &OwnedFd, parts: &[&str], shown: &str, dir: bool) -> Result<OwnedFd, String> {
    let mut flags = libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC;
    if dir {
        flags |= libc::O_DIRECTORY;
    }
    workspace::open_beneath(root, parts, flags, 0).map_err(|e| match e.raw_os_error() {
        Some(libc::ENOTDIR) => format!("{shown}: not a folder"),
        Some(libc::ENOENT) => format!("{shown}: no such file or folder"),
        _ => workspace::explain(shown, "open", e),
    })
}

/// `list_dir`: the entries of a folder, sorted by name, folders with a
/// trailing `/`, symlinks as `name -> target` (never followed).
pub(crate) fn list_dir(workspace: &Path, path: Option<&str>) -> Result<String, String> {
    let parts = parts(path)?;
    let shown = path.unwrap_or(".");
    let root = workspace::open_root(workspace)?;
    let dir = open_in(&root, &parts, shown, true)?;
    let (names, total, complete) = read_dir(&dir).map_err(|e| format!("cannot list {shown}: {e}"))?;
    let mut out = String::new();
    for (name, kind) in names {
        out.push_str(&name);
        match kind {
            Kind::Dir => out.push('/'),
            Kind::Link => {
                let target = readlinkat(&dir, &name).unwrap_or_else(|_| "?".into());
                out.push_str(" -> ");
                out.push_str(&target);
            }
            Kind::Other => {}
        }
        out.push('\n');
    }
    if total == 0 {
        return Ok(format!("{shown}: an empty folder"));
    }
    if !complete {
        out.push_str(&format!(
            "[more entries not shown; the folder has over {MAX_WALK}: these are the first {MAX_LIST} by name of the first {MAX_WALK} read]"
        ));
    } else if total > MAX_LIST {
        out.push_str(&format!(
            "[{} more entries not shown; {total} in all, this is the first {MAX_LIST}]",
            total - MAX_LIST
        ));
    } else {
        out.pop();
    }
    Ok(out)
}

/// Adds `k` to `map`, keeping only the `cap` smallest keys, so a long
/// listing costs its shown part only.
fn keep_first<K: Ord, V>(map: &mut BTreeMap<K, V>, k: K, v: V, cap: usize) {
    map.insert(k, v);
    if map.len() > cap {
        map.pop_last();
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Dir,
    Link,
    Other,
}

/// The names in the open folder `dir` (without `.` and `..`) and their kinds,
/// from readdir, falling back to fstatat without following links. At most
/// MAX_WALK names are read, of which the MAX_LIST first by name are kept.
/// Returns those, how many were read, and whether that was all of them.
fn read_dir(dir: &OwnedFd) -> std::io::Result<(BTreeMap<String, Kind>, usize, bool)> {
    // SAFETY: dup returns a new descriptor or -1; fdopendir owns it on success.
    let fd = unsafe { libc::dup(dir.as_raw_fd()) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd is a valid directory descriptor we own.
    let d = unsafe { libc::fdopendir(fd) };
    if d.is_null() {
        let e = std::io::Error::last_os_error();
        // SAFETY: fdopendir failed, so fd is still ours to close.
        unsafe { libc::close(fd) };
        return Err(e);
    }
    let mut out = BTreeMap::new();
    let (mut total, mut complete) = (0usize, true);
    loop {
        // SAFETY: d is an open DIR stream, used by this thread only.
        let ent = unsafe { libc::readdir(d) };
        if ent.is_null() {
            break;
        }
        if total == MAX_WALK {
            complete = false;
            break;
        }
        // SAFETY: readdir returned a valid dirent whose d_name is NUL-terminated.
        let (name, ty) = unsafe {
            (
                std::ffi::CStr::from_ptr((*ent).d_name.as_ptr())
                    .to_bytes()
                    .to_vec(),
                (*ent).d_type,
            )
        };
        if name == b"." || name == b".." {
            continue;
        }
        let kind = match ty {
            libc::DT_DIR => Kind::Dir,
            libc::DT_LNK => Kind::Link,
            libc::DT_UNKNOWN => stat_kind(dir, &name),
            _ => Kind::Other,
        };
        total += 1;
        keep_first(
            &mut out,
            String::from_utf8_lossy(&name).into_owned(),
            kind,
            MAX_LIST,
        );
    }
    // SAFETY: d is an open DIR stream; closedir also closes fd.
    unsafe { libc::closedir(d) };
    Ok((out, total, complete))
}

fn stat_kind(dir: &OwnedFd, name: &[u8]) -> Kind {
    let Ok(c) = std::ffi::CString::new(name) else {
        return Kind::Other;
    };
    // SAFETY: st is plain old data filled by fstatat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: dir is an open directory, c a NUL-terminated name, st valid.
    if unsafe { libc::fstatat(dir.as_raw_fd(), c.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) } < 0 {
        return Kind::Other;
    }
    match st.st_mode & libc::S_IFMT {
        libc::S_IFDIR => Kind::Dir,
        libc::S_IFLNK => Kind::Link,
        _ => Kind::Other,
    }
}

fn readlinkat(dir: &OwnedFd, name: &str) -> std::io::Result<String> {
    let c = workspace::cstr(name)?;
    let mut buf = vec![0u8; workspace::MAX_PATH_BYTES];
    // SAFETY: dir is an open directory, c a NUL-terminated name, buf writable for its length.
    let n = unsafe { libc::readlinkat(dir.as_raw_fd(), c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// A walk over one branch of the workspace.
pub(crate) struct Branch {
    root: OwnedFd,
    /// Where the walk starts: `/proc/self/fd/N` of `root`, or the workspace path.
    base: PathBuf,
    /// The named folder's components below the workspace.
    target: Vec<String>,
}

impl Branch {
    pub(crate) fn open(workspace: &Path, path: Option<&str>) -> Result<Branch, String> {
        let parts = parts(path)?;
        let root = workspace::open_root(workspace)?;
        // Refuses escapes and non-folders with the usual messages.
        open_in(&root, &parts, path.unwrap_or("."), true)?;
        let proc = PathBuf::from(format!("/proc/self/fd/{}", root.as_raw_fd()));
        let base = if proc.is_dir() {
            proc
        } else {
            workspace.to_path_buf()
        };
        Ok(Branch {
            root,
            base,
            target: parts.iter().map(|s| s.to_string()).collect(),
        })
    }

    /// Walks the branch, calling `f` with each file's path relative to the
    /// workspace and to the named folder; stops when `f` says so. Returns
    /// whether the walk hit MAX_WALK.
    pub(crate) fn files(
        &self,
        shown: &str,
        cancel: &CancellationToken,
        mut f: impl FnMut(&[String], usize) -> bool,
    ) -> Result<bool, String> {
        let base = self.base.clone();
        let target = self.target.clone();
        let rel = move |p: &Path| -> Vec<String> {
            p.strip_prefix(&base)
                .map(|r| {
                    r.components()
                        .map(|c| c.as_os_str().to_string_lossy().into_owned())
                        .collect()
                })
                .unwrap_or_default()
        };
        let rel_filter = rel.clone();
        let walk = ignore::WalkBuilder::new(&self.base)
            .follow_links(false)
            .hidden(false)
            .parents(false)
            .require_git(false)
            .git_global(false)
            .filter_entry(move |e| {
                if e.file_name() == ".git" {
                    return false;
                }
                let r = rel_filter(e.path());
                let n = r.len().min(target.len());
                r[..n] == target[..n]
            })
            .build();
        let (mut seen, mut reached) = (0usize, self.target.is_empty());
        for entry in walk {
            if cancel.is_cancelled() {
                return Err(CANCELLED.into());
            }
            seen += 1;
            if seen > MAX_WALK {
                return Ok(true);
            }
            let Ok(entry) = entry else { continue };
            let r = rel(entry.path());
            // The named folder itself, as a folder (a symlink to it is not followed).
            if r.len() == self.target.len() && entry.file_type().is_some_and(|t| t.is_dir()) {
                reached = true;
            }
            if r.len() <= self.target.len() || !entry.file_type().is_some_and(|t| t.is_file()) {
                continue;
            }
            if !f(&r, self.target.len()) {
                break;
            }
        }
        if !reached {
            return Err(format!(
                "{shown}: is reached through a symlink; name the folder it points to"
            ));
        }
        Ok(false)
    }
}

fn walk_note(hit: bool) -> &'static str {
    if hit {
        "\n[the walk stopped after 200000 files and folders; name a narrower path]"
    } else {
        ""
    }
}

/// `glob`: the files under `path` (default the workspace) whose path
/// relative to it matches `pattern` (`*` does not cross `/`, `**` does),
/// sorted, as paths relative to the workspace.
pub(crate) fn glob(
    workspace: &Path,
    pattern: &str,
    path: Option<&str>,
    cancel: &CancellationToken,
) -> Result<String, String> {
    let matcher = glob_matcher("glob", "pattern", pattern)?;
    let branch = Branch::open(workspace, path)?;
    let (mut found, mut total) = (BTreeMap::new(), 0usize);
    let hit = branch.files(path.unwrap_or("."), cancel, |r, below| {
        if matcher.is_match(r[below..].join("/")) {
            total += 1;
            keep_first(&mut found, r.join("/"), (), MAX_GLOB);
        }
        true
    })?;
    if total == 0 {
        return Ok(format!("no files match {pattern}{}", walk_note(hit)));
    }
    let mut out = found.into_keys().collect::<Vec<_>>().join("\n");
    if total > MAX_GLOB {
        out.push_str(&format!(
            "\n[{} more files match; {total} in all, this is the first {MAX_GLOB} by path]",
            total - MAX_GLOB
        ));
    }
    out.push_str(walk_note(hit));
    Ok(out)
}

/// A checked glob (`*` does not cross `/`); a bad one is a clear error.
fn glob_matcher(tool: &str, what: &str, p: &str) -> Result<globset::GlobMatcher, String> {
    check_pattern(tool, what, p)?;
    Ok(globset::GlobBuilder::new(p)
        .literal_separator(true)
        .build()
        .map_err(|e| format!("{tool}: bad {what} {p:?}: {}", e.kind()))?
        .compile_matcher())
}

pub(crate) struct GrepArgs<'a> {
    pub pattern: &'a str,
    pub path: Option<&'a str>,
    pub glob: Option<&'a str>,
    pub case_insensitive: bool,
}

/// `grep`: lines matching the regex `pattern` in the text files under
/// `path` (a folder, or one file), as `path:line:text`, files in path order.
pub(crate) fn grep(workspace: &Path, a: &GrepArgs, cancel: &CancellationToken) -> Result<String, String> {
    use grep_searcher::{BinaryDetection, SearcherBuilder};
    check_pattern("grep", "pattern", a.pattern)?;
    let matcher = grep_regex::RegexMatcherBuilder::new()
        .case_insensitive(a.case_insensitive)
        .line_terminator(Some(b'\n'))
        .size_limit(1 << 20)
        .dfa_size_limit(8 << 20)
        .build(a.pattern)
        .map_err(|e| {
            // The engine's message shows the pattern wrapped in a group, with
            // a caret that points into the wrapping: keep its reason only.
            let full = e.to_string();
            let why = full
                .lines()
                .find_map(|l| l.strip_prefix("error: "))
                .unwrap_or(&full)
                .to_string();
            format!("grep: bad regex {:?}: {why}", a.pattern)
        })?;
    let glob = match a.glob {
        None => None,
        Some(g) => {
            let m = glob_matcher("grep", "glob", g)?;
            Some((m, !g.contains('/')))
        }
    };
    let mut searcher = SearcherBuilder::new()
        .binary_detection(BinaryDetection::quit(0))
        .line_number(true)
        .heap_limit(Some(16 << 20))
        .build();
    let shown = a.path.unwrap_or(".");
    let mut out = String::new();
    let (mut lines, mut more) = (0usize, 0u64);
    let mut search = |file: File, name: &str, out: &mut String| {
        let sink = grep_searcher::sinks::Lossy(|lnum, line: &str| {
            if lines >= MAX_GREP_LINES || out.len() >= MAX_GREP_BYTES {
                more += 1;
                return Ok(!cancel.is_cancelled());
            }
            let line = line.trim_end_matches(['\n', '\r']);
            let mut text = line;
            if text.len() > MAX_GREP_LINE {
                let mut at = MAX_GREP_LINE;
                while !text.is_char_boundary(at) {
                    at -= 1;
                }
                text = &text[..at];
            }
            let cut = if text.len() < line.len() { "…" } else { "" };
            out.push_str(&format!("{name}:{lnum}:{text}{cut}\n"));
            lines += 1;
            Ok(!cancel.is_cancelled())
        });
        // A file that cannot be searched (a line past the heap limit) is skipped.
        let _ = searcher.search_file(&matcher, &file, sink);
    };
    let parts = parts(a.path)?;
    let root = workspace::open_root(workspace)?;
    // One file, or a folder's branch.
    let first = open_in(&root, &parts, shown, false)?;
    let first = File::from(first);
    let is_dir = first.metadata().map(|m| m.is_dir()).unwrap_or(false);
    let hit = if !is_dir {
        workspace::check_regular(&first, shown, "searched")?;
        search(first, &parts.join("/"), &mut out);
        false
    } else {
        drop(first);
        let branch = Branch::open(workspace, a.path)?;
        branch.files(shown, cancel, |r, below| {
            if let Some((m, base_only)) = &glob {
                let ok = if *base_only {
                    r.last().is_some_and(|n| m.is_match(n))
                } else {
                    m.is_match(r[below..].join("/"))
                };
                if !ok {
                    return true;
                }
            }
            let parts: Vec<&str> = r.iter().map(String::as_str).collect();
            let Ok(fd) = workspace::open_beneath(
                &branch.root,
                &parts,
                libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC,
                0,
            ) else {
                return true;
            };
            let file = File::from(fd);
            let name = parts.join("/");
            if workspace::check_regular(&file, &name, "searched").is_err() {
                return true;
            }
            search(file, &name, &mut out);
            !cancel.is_cancelled()
        })?
    };
    if cancel.is_cancelled() {
        return Err(CANCELLED.into());
    }
    if lines == 0 {
        return Ok(format!("no lines match {}{}", a.pattern, walk_note(hit)));
    }
    out.pop();
    if more > 0 {
        out.push_str(&format!(
            "\n[{more} more matching lines not shown; this is the first {lines}; narrow the pattern, path or glob]"
        ));
    }
    out.push_str(walk_note(hit));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ws() -> tempfile::TempDir {
        let ws = tempfile::tempdir().unwrap();
        let w = ws.path();
        std::fs::create_dir_all(w.join("src/deep")).unwrap();
        std::fs::create_dir_all(w.join("target")).unwrap();
        std::fs::write(w.join(".gitignore"), "target/\n*.log\n").unwrap();
        std::fs::write(w.join("src/a.rs"), "fn main() {}\n// TODO one\n").unwrap();
        std::fs::write(w.join("src/deep/b.rs"), "// todo two\n").unwrap();
        std::fs::write(w.join("src/deep/x.log"), "TODO log\n").unwrap();
        std::fs::write(w.join("target/c.rs"), "TODO built\n").unwrap();
        std::fs::write(w.join("bin"), b"TODO\0binary").unwrap();
        ws
    }

    #[test]
    fn glob_respects_gitignore_from_above_the_named_folder() {
        let ws = ws();
        let c = CancellationToken::new();
        assert_eq!(
            glob(ws.path(), "**/*.rs", None, &c).unwrap(),
            "src/a.rs\nsrc/deep/b.rs"
        );
        assert_eq!(glob(ws.path(), "*.rs", Some("src"), &c).unwrap(), "src/a.rs");
        assert_eq!(
            glob(ws.path(), "**/*.log", Some("src/deep"), &c).unwrap(),
            "no files match **/*.log"
        );
        assert!(glob(ws.path(), "a[", None, &c)
            .unwrap_err()
            .starts_with("glob: bad pattern"));
        assert_eq!(
            glob(ws.path(), "*", Some("src/a.rs"), &c).unwrap_err(),
            "src/a.rs: not a folder"
        );
    }

    #[test]
    fn grep_finds_lines_skips_ignored_and_binary_files() {
        let ws = ws();
        let c = CancellationToken::new();
        let g = |pattern, path, glob, ci| {
            grep(
                ws.path(),
                &GrepArgs {
                    pattern,
                    path,
                    glob,
                    case_insensitive: ci,
                },
                &c,
            )
        };
        assert_eq!(g("TODO", None, None, false).unwrap(), "src/a.rs:2:// TODO one");
        assert_eq!(
            g("todo", None, None, true).unwrap(),
            "src/a.rs:2:// TODO one\nsrc/deep/b.rs:1:// todo two"
        );
        assert_eq!(
            g("todo", None, Some("b.rs"), true).unwrap(),
            "src/deep/b.rs:1:// todo two"
        );
        assert_eq!(
            g("todo", Some("src/deep/b.rs"), None, false).unwrap(),
            "src/deep/b.rs:1:// todo two"
        );
        assert!(g("(", None, None, false)
            .unwrap_err()
            .starts_with("grep: bad regex \"(\""));
        assert_eq!(g("nothing", None, None, false).unwrap(), "no lines match nothing");
    }

    #[test]
    fn a_folder_named_through_an_inside_symlink_is_refused_by_the_walk() {
        let ws = ws();
        std::os::unix::fs::symlink("src", ws.path().join("alias")).unwrap();
        let c = CancellationToken::new();
        assert_eq!(
            glob(ws.path(), "*", Some("alias"), &c).unwrap_err(),
            "alias: is reached through a symlink; name the folder it points to"
        );
        // The link is not followed from above either.
        assert_eq!(glob(ws.path(), "**/a.rs", None, &c).unwrap(), "src/a.rs");
        assert_eq!(list_dir(ws.path(), Some("alias")).unwrap(), "a.rs\ndeep/");
    }

    #[test]
    fn a_cancelled_walk_stops() {
        let ws = ws();
        let c = CancellationToken::new();
        c.cancel();
        assert_eq!(glob(ws.path(), "*", None, &c).unwrap_err(), "cancelled");
    }

    #[test]
    fn list_dir_marks_folders_and_links() {
        let ws = ws();
        std::os::unix::fs::symlink("/etc", ws.path().join("out")).unwrap();
        assert_eq!(
            list_dir(ws.path(), None).unwrap(),
            ".gitignore\nbin\nout -> /etc\nsrc/\ntarget/"
        );
        assert_eq!(list_dir(ws.path(), Some("src/deep")).unwrap(), "b.rs\nx.log");
        assert_eq!(
            list_dir(ws.path(), Some("out")).unwrap_err(),
            "out: a symlink leads outside the workspace"
        );
    }
}
