//! File I/O confined to the workspace, without a check-then-use gap.
//!
//! Every path a tool names is opened relative to a descriptor of the
//! workspace directory with a resolution that cannot leave it: on Linux
//! `openat2(2)` with `RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS` (the kernel
//! refuses `..`, absolute symlinks and any symlink whose target is outside,
//! atomically with the open). Where openat2 is missing (other systems, or a
//! kernel before 5.6) the path is walked one component at a time with
//! `openat(O_NOFOLLOW)`, so no symlink is followed at all.
//!
//! What is opened must be a regular file with one link: files are opened with
//! `O_NONBLOCK` and checked with fstat, so a FIFO, device, socket or
//! directory is refused at once instead of blocking a thread forever, and a
//! hard link (which may share its inode with a file outside) is refused too.
//!
//! These functions block: call them from `spawn_blocking`.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Component, Path};

/// The longest path a tool may name, in bytes (Linux's PATH_MAX).
pub(crate) const MAX_PATH_BYTES: usize = 4096;
/// The longest single path component, in bytes (NAME_MAX).
pub(crate) const MAX_NAME_BYTES: usize = 255;

/// What `read` returns: at most `cap` bytes of the file, and whether there was more.
#[derive(Debug)]
pub(crate) struct Clipped {
    pub bytes: Vec<u8>,
    /// The file's size when it was opened.
    pub size: u64,
    pub truncated: bool,
}

/// Checks a tool's path and returns its components (no `.`, no `..`, no root).
pub(crate) fn components(path: &str) -> Result<Vec<&str>, String> {
    if path.is_empty() {
        return Err("an empty path".into());
    }
    if path.contains('\0') {
        return Err("the path contains a NUL byte".into());
    }
    if path.len() > MAX_PATH_BYTES {
        return Err(format!(
            "the path is {} bytes long; the limit is {MAX_PATH_BYTES}",
            path.len()
        ));
    }
    let rel = Path::new(path);
    if rel.is_absolute() || rel.has_root() {
        return Err(format!("{path}: absolute paths are outside the workspace"));
    }
    let mut out = Vec::new();
    for c in rel.components() {
        match c {
            Component::Normal(name) => {
                let name = name.to_str().unwrap_or_default();
                if name.len() > MAX_NAME_BYTES {
                    return Err(format!(
                        "{path}: a path component is {} bytes long; the limit is {MAX_NAME_BYTES}",
                        name.len()
                    ));
                }
                out.push(name);
            }
            Component::CurDir => {}
            Component::ParentDir => return Err(format!("{path}: `..` would escape the workspace")),
            Component::RootDir | Component::Prefix(_) => {
                return Err(format!("{path}: absolute paths are outside the workspace"))
            }
        }
    }
    Ok(out)
}

/// Reads at most `cap` bytes of the regular file `path` inside `workspace`.
pub(crate) fn read(workspace: &Path, path: &str, cap: usize) -> Result<Clipped, String> {
    let parts = components(path)?;
    let root = open_root(workspace)?;
    let fd = open_beneath(
        &root,
        &parts,
        libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC,
        0,
    )
    .map_err(|e| explain(path, "read", e))?;
    let file = File::from(fd);
    let size = check_regular(&file, path, "read")?;
    let mut bytes = Vec::with_capacity(cap.min(size as usize).saturating_add(1));
    (&file)
        .take(cap as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read {path}: {e}"))?;
    let truncated = bytes.len() > cap;
    bytes.truncate(cap);
    Ok(Clipped {
        bytes,
        size,
        truncated,
    })
}

/// Creates or replaces the regular file `path` inside `workspace` with
/// `content`, creating missing parent folders (each one beneath the workspace).
pub(crate) fn write(workspace: &Path, path: &str, content: &[u8]) -> Result<(), String> {
    let parts = components(path)?;
    let Some((_, dirs)) = parts.split_last() else {
        return Err(format!("{path}: is the workspace itself, not a file"));
    };
    let root = open_root(workspace)?;
    for depth in 1..=dirs.len() {
        make_dir_beneath(&root, &dirs[..depth]).map_err(|e| {
            format!(
                "cannot create the folder for {path}: {}",
                explain(&dirs[..depth].join("/"), "create", e)
            )
        })?;
    }
    // No O_TRUNC: a file is emptied only after fstat says it may be written.
    let fd = open_beneath(
        &root,
        &parts,
        libc::O_WRONLY | libc::O_CREAT | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC,
        0o666,
    )
    .map_err(|e| explain(path, "write", e))?;
    let mut file = File::from(fd);
    check_regular(&file, path, "write")?;
    file.set_len(0)
        .and_then(|()| file.write_all(content))
        .map_err(|e| format!("cannot write {path}: {e}"))
}

/// Refuses anything but a regular file with a single link; returns its size.
pub(crate) fn check_regular(file: &File, path: &str, verb: &str) -> Result<u64, String> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let meta = file
        .metadata()
        .map_err(|e| format!("cannot {verb} {path}: {e}"))?;
    let ft = meta.file_type();
    if !ft.is_file() {
        let what = if ft.is_dir() {
            "a directory"
        } else if ft.is_fifo() {
            "a FIFO"
        } else if ft.is_socket() {
            "a socket"
        } else if ft.is_char_device() || ft.is_block_device() {
            "a device"
        } else {
            "not a file"
        };
        return Err(format!(
            "{path}: not a regular file (it is {what}); only regular files can be {verb}"
        ));
    }
    if meta.nlink() > 1 {
        return Err(format!(
            "{path}: refused: the file has {} hard links, and a hard link may be a file outside the workspace",
            meta.nlink()
        ));
    }
    Ok(meta.len())
}

/// A clear message for an open that failed.
pub(crate) fn explain(path: &str, verb: &str, e: io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::EXDEV) => format!("{path}: a symlink leads outside the workspace"),
        Some(libc::ELOOP) => format!(
            "{path}: a symlink cannot be followed here (too many, a /proc magic link, or symlinks are not followed on this system)"
        ),
        Some(libc::ENXIO) => {
            format!("{path}: not a regular file (a FIFO without a reader, or a socket); only regular files can be {verb}")
        }
        Some(libc::EAGAIN) => format!("{path}: the workspace changed while the path was resolved; try again"),
        _ => format!("cannot {verb} {path}: {e}"),
    }
}

pub(crate) fn open_root(workspace: &Path) -> Result<OwnedFd, String> {
    let bad = |e: io::Error| format!("the workspace {} is not usable: {e}", workspace.display());
    let c = std::ffi::CString::new(workspace.as_os_str().as_encoded_bytes())
        .map_err(|_| bad(io::Error::from(io::ErrorKind::InvalidInput)))?;
    // SAFETY: c is a valid NUL-terminated string; open returns a new fd or -1.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(bad(io::Error::last_os_error()));
    }
    // SAFETY: fd is a freshly opened descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Makes the directory `parts` (its parent exists beneath `root`), if it is missing.
pub(crate) fn make_dir_beneath(root: &OwnedFd, parts: &[&str]) -> io::Result<()> {
    let dir = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC;
    match open_beneath(root, parts, dir, 0) {
        Ok(_) => return Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
        Err(e) => return Err(e),
    }
    let (name, up) = parts.split_last().expect("at least one component");
    let parent = if up.is_empty() {
        None
    } else {
        Some(open_beneath(root, up, dir, 0)?)
    };
    let at = parent.as_ref().unwrap_or(root);
    let c = cstr(name)?;
    // SAFETY: `at` is an open directory fd and c a NUL-terminated single name,
    // so mkdirat creates inside that directory and follows nothing.
    if unsafe { libc::mkdirat(at.as_raw_fd(), c.as_ptr(), 0o777) } < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EEXIST) {
            return Err(e);
        }
    }
    // Whatever is there now must be a directory beneath the workspace.
    open_beneath(root, parts, dir, 0).map(drop)
}

pub(crate) fn cstr(s: &str) -> io::Result<std::ffi::CString> {
    std::ffi::CString::new(s).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

/// Opens `parts` relative to `root` with a resolution that cannot leave it.
pub(crate) fn open_beneath(
    root: &OwnedFd,
    parts: &[&str],
    flags: libc::c_int,
    mode: libc::mode_t,
) -> io::Result<OwnedFd> {
    #[cfg(target_os = "linux")]
    {
        use std::sync::atomic::{AtomicBool, Ordering};
        static NO_OPENAT2: AtomicBool = AtomicBool::new(false);
        if !NO_OPENAT2.load(Ordering::Relaxed) {
            match openat2_beneath(root, parts, flags, mode) {
                Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => NO_OPENAT2.store(true, Ordering::Relaxed),
                other => return other,
            }
        }
    }
    open_walk(root, parts, flags, mode)
}

#[cfg(target_os = "linux")]
fn openat2_beneath(
    root: &OwnedFd,
    parts: &[&str],
    flags: libc::c_int,
    mode: libc::mode_t,
) -> io::Result<OwnedFd> {
    let rel = if parts.is_empty() {
        ".".to_string()
    } else {
        parts.join("/")
    };
    let c = cstr(&rel)?;
    // SAFETY: open_how is plain old data; all-zero is its documented default.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = flags as u64;
    how.mode = if flags & libc::O_CREAT != 0 {
        mode as u64
    } else {
        0
    };
    how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS;
    // EAGAIN: a concurrent rename raced a `..` check; the kernel asks for a retry.
    for _ in 0..64 {
        // SAFETY: root is an open directory fd, c a NUL-terminated path, and
        // how a valid open_how whose size is passed with it.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                root.as_raw_fd(),
                c.as_ptr(),
                &how as *const libc::open_how,
                std::mem::size_of::<libc::open_how>(),
            )
        };
        if fd >= 0 {
            // SAFETY: fd is a freshly opened descriptor that nothing else owns.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) });
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::EINTR) => continue,
            _ => return Err(e),
        }
    }
    Err(io::Error::from_raw_os_error(libc::EAGAIN))
}

/// The portable fallback: one component at a time, never following a symlink.
pub(crate) fn open_walk(
    root: &OwnedFd,
    parts: &[&str],
    flags: libc::c_int,
    mode: libc::mode_t,
) -> io::Result<OwnedFd> {
    let at = |dir: &OwnedFd, name: &str, flags: libc::c_int| -> io::Result<OwnedFd> {
        let c = cstr(name)?;
        loop {
            // SAFETY: dir is an open directory fd and c a NUL-terminated name.
            let fd = unsafe { libc::openat(dir.as_raw_fd(), c.as_ptr(), flags, mode as libc::c_uint) };
            if fd >= 0 {
                // SAFETY: fd is a freshly opened descriptor that nothing else owns.
                return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
            }
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINTR) {
                return Err(e);
            }
        }
    };
    let Some((last, dirs)) = parts.split_last() else {
        return at(root, ".", flags);
    };
    let mut cur: Option<OwnedFd> = None;
    for d in dirs {
        let next = at(
            cur.as_ref().unwrap_or(root),
            d,
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )?;
        cur = Some(next);
    }
    at(cur.as_ref().unwrap_or(root), last, flags | libc::O_NOFOLLOW)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_checked_before_anything_is_opened() {
        assert_eq!(components("./a/./b.txt").unwrap(), ["a", "b.txt"]);
        assert_eq!(components("a/b/").unwrap(), ["a", "b"]);
        let err = |p: &str| components(p).unwrap_err();
        assert_eq!(err(""), "an empty path");
        assert_eq!(err("a\0b"), "the path contains a NUL byte");
        assert!(err("/etc/passwd").contains("absolute paths are outside the workspace"));
        assert!(err("a/../../x").contains("`..` would escape the workspace"));
        assert!(err(&"a/".repeat(2100)).contains("the limit is 4096"));
        assert!(err(&"n".repeat(300)).contains("the limit is 255"));
    }

    #[test]
    fn the_fallback_walk_follows_no_symlink() {
        let ws = tempfile::tempdir().unwrap();
        std::fs::create_dir(ws.path().join("d")).unwrap();
        std::fs::write(ws.path().join("d/f"), "x").unwrap();
        std::os::unix::fs::symlink("d", ws.path().join("l")).unwrap();
        std::os::unix::fs::symlink("f", ws.path().join("d/lf")).unwrap();
        let root = open_root(ws.path()).unwrap();
        let ro = libc::O_RDONLY | libc::O_CLOEXEC;
        assert!(open_walk(&root, &["d", "f"], ro, 0).is_ok());
        for bad in [&["l", "f"][..], &["d", "lf"][..]] {
            let e = open_walk(&root, bad, ro, 0).unwrap_err();
            assert!(
                matches!(e.raw_os_error(), Some(libc::ELOOP) | Some(libc::ENOTDIR)),
                "{bad:?}: {e}"
            );
        }
    }

    #[test]
    fn a_write_creates_its_folders_and_replaces_the_file() {
        let ws = tempfile::tempdir().unwrap();
        write(ws.path(), "a/b/c.txt", b"longer text").unwrap();
        write(ws.path(), "a/b/c.txt", b"short").unwrap();
        assert_eq!(
            std::fs::read_to_string(ws.path().join("a/b/c.txt")).unwrap(),
            "short"
        );
        let r = read(ws.path(), "a/b/c.txt", 3).unwrap();
        assert_eq!((r.bytes.as_slice(), r.size, r.truncated), (&b"sho"[..], 5, true));
        let r = read(ws.path(), "a/b/c.txt", 5).unwrap();
        assert!(!r.truncated);
        assert!(write(ws.path(), ".", b"x").is_err());
        assert!(read(ws.path(), "a", 10)
            .unwrap_err()
            .contains("it is a directory"));
    }
}
