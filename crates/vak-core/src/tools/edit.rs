//! edit_file: exact string replacements, all of one call or none, written
//! once through a temp file renamed over the original in its own folder.

use crate::workspace;
use serde_json::Value;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

/// The largest file edit_file changes.
pub(crate) const MAX_EDIT_FILE: u64 = 16 << 20;
/// The most edits one call may carry.
pub(crate) const MAX_EDITS: usize = 100;

#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Edit {
    pub old: String,
    pub new: String,
    pub all: bool,
}

/// The edits an edit_file input asks for: `{old_string, new_string,
/// replace_all?}` or `{edits: [...]}`, never both.
pub(crate) fn parse(input: &Value) -> Result<Vec<Edit>, String> {
    let one = |v: &Value, at: &str| -> Result<Edit, String> {
        let s = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
        let (Some(old), Some(new)) = (s("old_string"), s("new_string")) else {
            return Err(format!(
                "edit_file{at} needs string `old_string` and `new_string`"
            ));
        };
        let all = match v.get("replace_all") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err(format!("edit_file{at}: `replace_all` must be true or false")),
        };
        if old.is_empty() {
            return Err(format!(
                "edit_file{at}: `old_string` is empty; name the exact text to replace"
            ));
        }
        if old == new {
            return Err(format!(
                "edit_file{at}: `old_string` and `new_string` are the same; nothing would change"
            ));
        }
        Ok(Edit { old, new, all })
    };
    match input.get("edits") {
        Some(Value::Array(list)) => {
            if input.get("old_string").is_some() || input.get("new_string").is_some() {
                return Err("edit_file takes either `old_string`/`new_string` or `edits`, not both".into());
            }
            if list.is_empty() {
                return Err("edit_file: `edits` is empty".into());
            }
            if list.len() > MAX_EDITS {
                return Err(format!(
                    "edit_file: {} edits in one call; the limit is {MAX_EDITS}",
                    list.len()
                ));
            }
            let n = list.len();
            list.iter()
                .enumerate()
                .map(|(i, e)| one(e, &format!(" (edit {} of {n})", i + 1)))
                .collect()
        }
        Some(_) => Err("edit_file: `edits` must be a list of {old_string, new_string, replace_all?}".into()),
        None => Ok(vec![one(input, "")?]),
    }
}

/// Applies `edits` in order to `text`; the first that does not match exactly
/// once (or at least once with replace_all) fails the whole call. Returns the
/// new text and how many replacements were made.
pub(crate) fn apply(path: &str, mut text: String, edits: &[Edit]) -> Result<(String, usize), String> {
    let mut made = 0;
    for (i, e) in edits.iter().enumerate() {
        let which = if edits.len() > 1 {
            format!("edit {} of {}: ", i + 1, edits.len())
        } else {
            String::new()
        };
        let n = text.matches(e.old.as_str()).count();
        let unchanged = "; the file is unchanged";
        if n == 0 {
            return Err(format!("{which}old_string was not found in {path}{unchanged}"));
        }
        if n > 1 && !e.all {
            return Err(format!(
                "{which}old_string matches {n} times in {path}; give more context to match once, \
                 or set replace_all{unchanged}"
            ));
        }
        text = if e.all {
            text.replace(e.old.as_str(), &e.new)
        } else {
            text.replacen(e.old.as_str(), &e.new, 1)
        };
        made += n;
    }
    Ok((text, made))
}

/// Edits the regular file `path` beneath `workspace`: reads it whole (text,
/// at most MAX_EDIT_FILE), applies `edits`, and replaces it once through a
/// temp file in its folder renamed over it, with the same mode.
pub(crate) fn edit(workspace: &Path, path: &str, edits: &[Edit]) -> Result<usize, String> {
    let parts = workspace::components(path)?;
    let Some((name, dirs)) = parts.split_last() else {
        return Err(format!("{path}: is the workspace itself, not a file"));
    };
    let root = workspace::open_root(workspace)?;
    let dir = workspace::open_beneath(
        &root,
        dirs,
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        0,
    )
    .map_err(|e| workspace::explain(path, "edit", e))?;
    // The file itself is opened in that folder without following a symlink:
    // the rename would replace the link, not what it points to.
    let fd = openat(
        &dir,
        name,
        libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC,
        0,
    )
    .map_err(|e| match e.raw_os_error() {
        Some(libc::ELOOP) => format!("{path}: is a symlink; edit the file it points to"),
        Some(libc::ENOENT) => format!("{path}: no such file; write_file creates files"),
        _ => workspace::explain(path, "edit", e),
    })?;
    let file = File::from(fd);
    let size = workspace::check_regular(&file, path, "edited")?;
    if size > MAX_EDIT_FILE {
        return Err(format!(
            "{path}: is {size} bytes; edit_file changes files up to {MAX_EDIT_FILE} bytes"
        ));
    }
    let mut bytes = Vec::with_capacity(size as usize);
    (&file)
        .take(MAX_EDIT_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read {path}: {e}"))?;
    if bytes.len() as u64 > MAX_EDIT_FILE {
        return Err(format!(
            "{path}: grew past {MAX_EDIT_FILE} bytes while it was read"
        ));
    }
    let text = String::from_utf8(bytes)
        .map_err(|_| format!("{path}: not valid UTF-8 text; edit_file edits text files only"))?;
    let (text, made) = apply(path, text, edits)?;
    use std::os::unix::fs::PermissionsExt;
    let mode = file
        .metadata()
        .map_err(|e| format!("cannot edit {path}: {e}"))?
        .permissions()
        .mode()
        & 0o7777;
    replace(&dir, name, path, text.as_bytes(), mode)?;
    Ok(made)
}

pub(crate) fn openat(
    dir: &OwnedFd,
    name: &str,
    flags: libc::c_int,
    mode: libc::mode_t,
) -> std::io::Result<OwnedFd> {
    let c = workspace::cstr(name)?;
    loop {
        // SAFETY: dir is an open directory fd and c a NUL-terminated single name.
        let fd = unsafe { libc::openat(dir.as_raw_fd(), c.as_ptr(), flags, mode as libc::c_uint) };
        if fd >= 0 {
            // SAFETY: fd is a freshly opened descriptor that nothing else owns.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
}

/// Writes `content` to a new temp file in `dir` and renames it over `name`.
pub(crate) fn replace(
    dir: &OwnedFd,
    name: &str,
    path: &str,
    content: &[u8],
    mode: u32,
) -> Result<(), String> {
    let fail = |e: std::io::Error| format!("cannot write {path}: {e}; the file is unchanged");
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    // A name of at most 255 bytes: the original's start, then the suffix.
    let mut stem: String = String::new();
    for c in name.chars() {
        if stem.len() + c.len_utf8() > 200 {
            break;
        }
        stem.push(c);
    }
    let tmp = format!(".{stem}.{}.vak-edit", &suffix[..12]);
    let fd = openat(
        dir,
        &tmp,
        libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        0o600,
    )
    .map_err(fail)?;
    let c_tmp = workspace::cstr(&tmp).map_err(fail)?;
    let unlink = || {
        // SAFETY: dir is an open directory fd and c_tmp a NUL-terminated name.
        unsafe { libc::unlinkat(dir.as_raw_fd(), c_tmp.as_ptr(), 0) };
    };
    let mut f = File::from(fd);
    let written = f
        .write_all(content)
        .and_then(|()| {
            use std::os::unix::fs::PermissionsExt;
            f.set_permissions(std::fs::Permissions::from_mode(mode))
        })
        .and_then(|()| f.sync_data());
    if let Err(e) = written {
        unlink();
        return Err(fail(e));
    }
    drop(f);
    let c_name = workspace::cstr(name).map_err(fail)?;
    // SAFETY: both names are NUL-terminated single names in the open directory dir.
    let r = unsafe { libc::renameat(dir.as_raw_fd(), c_tmp.as_ptr(), dir.as_raw_fd(), c_name.as_ptr()) };
    if r < 0 {
        let e = std::io::Error::last_os_error();
        unlink();
        return Err(fail(e));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn e(old: &str, new: &str, all: bool) -> Edit {
        Edit {
            old: old.into(),
            new: new.into(),
            all,
        }
    }

    #[test]
    fn inputs_are_one_edit_or_a_list_and_bad_ones_are_named() {
        assert_eq!(
            parse(&json!({"old_string": "a", "new_string": "b"})).unwrap(),
            [e("a", "b", false)]
        );
        let list = json!({"edits": [{"old_string": "a", "new_string": "b", "replace_all": true}, {"old_string": "c", "new_string": ""}]});
        assert_eq!(parse(&list).unwrap(), [e("a", "b", true), e("c", "", false)]);
        let err = |v: Value| parse(&v).unwrap_err();
        assert!(err(json!({"old_string": "", "new_string": "b"})).contains("`old_string` is empty"));
        assert!(err(json!({"old_string": "x", "new_string": "x"})).contains("are the same"));
        assert!(err(json!({"edits": []})).contains("`edits` is empty"));
        assert!(
            err(json!({"edits": [{"old_string": "a", "new_string": "b"}, {"old_string": "a"}]}))
                .starts_with("edit_file (edit 2 of 2) needs")
        );
        assert!(err(json!({"edits": [], "old_string": "a", "new_string": "b"})).contains("not both"));
        assert!(
            err(json!({"old_string": "a", "new_string": "b", "replace_all": "yes"}))
                .contains("true or false")
        );
    }

    #[test]
    fn each_edit_matches_once_or_everything_stays() {
        let t = "one two two three".to_string();
        assert_eq!(
            apply("f", t.clone(), &[e("one", "1", false)]).unwrap().0,
            "1 two two three"
        );
        assert_eq!(
            apply("f", t.clone(), &[e("two", "2", false)]).unwrap_err(),
            "old_string matches 2 times in f; give more context to match once, or set replace_all; the file is unchanged"
        );
        assert_eq!(
            apply("f", t.clone(), &[e("two", "2", true)]).unwrap(),
            ("one 2 2 three".to_string(), 2)
        );
        assert_eq!(
            apply("f", t.clone(), &[e("one", "1", false), e("four", "4", false)]).unwrap_err(),
            "edit 2 of 2: old_string was not found in f; the file is unchanged"
        );
        // Later edits see earlier ones.
        assert_eq!(
            apply("f", t, &[e("one", "zero", false), e("zero two", "z", false)])
                .unwrap()
                .0,
            "z two three"
        );
    }

    #[test]
    fn an_edit_keeps_the_mode_and_leaves_no_temp_file() {
        use std::os::unix::fs::PermissionsExt;
        let ws = tempfile::tempdir().unwrap();
        let f = ws.path().join("s.sh");
        std::fs::write(&f, "echo hi\n").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o751)).unwrap();
        assert_eq!(edit(ws.path(), "s.sh", &[e("hi", "there", false)]).unwrap(), 1);
        assert_eq!(std::fs::read_to_string(&f).unwrap(), "echo there\n");
        assert_eq!(
            std::fs::metadata(&f).unwrap().permissions().mode() & 0o7777,
            0o751
        );
        let names: Vec<_> = std::fs::read_dir(ws.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["s.sh"]);
    }
}
