//! read_file's checks and its line window: binary files are refused, and
//! `offset`/`limit` (in lines, 1-based) pick a window of a text file.

use crate::workspace;
use serde_json::Value;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use tokio_util::sync::CancellationToken;

/// How much of a file's start decides whether it is text.
pub(super) const SNIFF: usize = 8 * 1024;

/// Why `head` (a file's first bytes, `more` when the file goes on) is not
/// text: a NUL byte or invalid UTF-8; None for text.
pub(super) fn binary_reason(head: &[u8], more: bool) -> Option<&'static str> {
    if memchr::memchr(0, head).is_some() {
        return Some("it contains NUL bytes");
    }
    match std::str::from_utf8(head) {
        Ok(_) => None,
        // A character cut by the end of the sniffed bytes is not an error.
        Err(e) if more && e.error_len().is_none() => None,
        Err(_) => Some("it is not valid UTF-8"),
    }
}

/// The message for a refused binary file.
pub(super) fn binary_message(path: &str, why: &str) -> String {
    format!("{path}: a binary file ({why} in its first 8 KiB); read_file reads text files only")
}

/// Opens the regular file `path` beneath `workspace` for reading.
pub(super) fn open(workspace: &Path, path: &str) -> Result<(File, u64), String> {
    let parts = workspace::components(path)?;
    let root = workspace::open_root(workspace)?;
    let fd = workspace::open_beneath(
        &root,
        &parts,
        libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC,
        0,
    )
    .map_err(|e| workspace::explain(path, "read", e))?;
    let file = File::from(fd);
    let size = workspace::check_regular(&file, path, "read")?;
    Ok((file, size))
}

/// Refuses `path` if its first 8 KiB are not text (reads them with pread,
/// so the file's position is unchanged).
pub(super) fn refuse_binary(file: &File, path: &str) -> Result<(), String> {
    use std::os::unix::fs::FileExt;
    let mut head = vec![0u8; SNIFF + 1];
    let mut n = 0;
    while n < head.len() {
        match file.read_at(&mut head[n..], n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("cannot read {path}: {e}")),
        }
    }
    let more = n > SNIFF;
    match binary_reason(&head[..n.min(SNIFF)], more) {
        Some(why) => Err(binary_message(path, why)),
        None => Ok(()),
    }
}

/// A window of lines read from a file.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Window {
    pub text: String,
    /// The first line shown (1-based) and how many lines were shown whole.
    pub first: u64,
    pub lines: u64,
    /// The file goes on past the window (more lines, or the byte cap cut it).
    pub more: bool,
    /// The byte cap cut the window (the line after the last whole one is
    /// cut or missing).
    pub capped: bool,
}

/// Reads lines `offset..offset+limit` (1-based; `limit` None is to the end)
/// of `reader`, holding at most `cap` bytes of text. Lines are kept with
/// their `\n`; invalid UTF-8 is shown as U+FFFD. An offset past the end is an
/// error that says how many lines there are.
pub(super) fn window(
    reader: impl Read,
    path: &str,
    offset: u64,
    limit: Option<u64>,
    cap: usize,
    cancel: &CancellationToken,
) -> Result<Window, String> {
    let mut r = BufReader::with_capacity(64 * 1024, reader);
    let io = |e: std::io::Error| format!("cannot read {path}: {e}");
    let mut line = 1u64;
    // Skip to the offset without holding a line: a line may be huge.
    while line < offset {
        if line.is_multiple_of(4096) && cancel.is_cancelled() {
            return Err("cancelled".into());
        }
        let buf = r.fill_buf().map_err(io)?;
        if buf.is_empty() {
            let has = line - 1;
            return Err(format!(
                "{path}: offset {offset} is past the end; the file has {}",
                crate::text::count(has as usize, "line")
            ));
        }
        match memchr::memchr(b'\n', buf) {
            Some(i) => {
                r.consume(i + 1);
                line += 1;
            }
            None => {
                let n = buf.len();
                r.consume(n);
            }
        }
    }
    let mut out: Vec<u8> = Vec::new();
    let mut shown = 0u64;
    let (mut more, mut capped) = (false, false);
    loop {
        if limit.is_some_and(|l| shown >= l) {
            more = !r.fill_buf().map_err(io)?.is_empty();
            break;
        }
        if shown % 4096 == 4095 && cancel.is_cancelled() {
            return Err("cancelled".into());
        }
        let before = out.len();
        let room = (cap - before) as u64;
        let n = (&mut r).take(room + 1).read_until(b'\n', &mut out).map_err(io)?;
        if n == 0 {
            break;
        }
        if out.len() > cap {
            // This line does not fit: show the part of it that does only when
            // it is the first, so the window is never empty.
            if shown == 0 {
                out.truncate(cap);
            } else {
                out.truncate(before);
            }
            more = true;
            capped = true;
            break;
        }
        shown += 1;
        if out.len() == cap && !r.fill_buf().map_err(io)?.is_empty() {
            more = true;
            capped = true;
            break;
        }
    }
    if shown == 0 && !capped && offset > 1 {
        return Err(format!(
            "{path}: offset {offset} is past the end; the file has {}",
            crate::text::count((offset - 1) as usize, "line")
        ));
    }
    let text = match String::from_utf8(out) {
        Ok(t) => t,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    };
    Ok(Window {
        text,
        first: offset,
        lines: shown,
        more,
        capped,
    })
}

/// read_file's `offset` and `limit`: None when neither is given (the
/// whole file), else the offset (default 1) and the limit.
pub(super) fn window_args(input: &Value) -> Result<Option<(u64, Option<u64>)>, String> {
    let line_arg = |k: &str| match input.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64() {
            Some(n) if n >= 1 => Ok(Some(n)),
            _ => Err(format!("read_file: `{k}` must be a whole number from 1, got {v}")),
        },
    };
    let (offset, limit) = (line_arg("offset")?, line_arg("limit")?);
    if offset.is_none() && limit.is_none() {
        return Ok(None);
    }
    Ok(Some((offset.unwrap_or(1), limit)))
}

/// A window of the text file `path` beneath `workspace`, with its note.
pub(super) fn read_window(
    workspace: &Path,
    path: &str,
    offset: u64,
    limit: Option<u64>,
    cap: usize,
    cancel: &CancellationToken,
) -> Result<String, String> {
    let (file, _) = open(workspace, path)?;
    refuse_binary(&file, path)?;
    let w = window(&file, path, offset, limit, cap, cancel)?;
    let note = note(path, &w).unwrap_or_default();
    Ok(w.text + &note)
}

/// The note after a window: where it stopped and how to read on.
pub(super) fn note(path: &str, w: &Window) -> Option<String> {
    if !w.more {
        return None;
    }
    let next = w.first + w.lines;
    let why = if w.capped {
        "cut at the 1 MiB output cap"
    } else {
        "the file continues"
    };
    let shown = match w.lines {
        0 => format!("part of line {}", w.first),
        1 => format!("line {}", w.first),
        n => format!("lines {}-{}", w.first, w.first + n - 1),
    };
    Some(format!(
        "\n[{path}: {shown} shown; {why}: read on with offset {next}]"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn win(text: &str, offset: u64, limit: Option<u64>, cap: usize) -> Result<Window, String> {
        window(
            text.as_bytes(),
            "f",
            offset,
            limit,
            cap,
            &CancellationToken::new(),
        )
    }

    #[test]
    fn windows_count_lines_from_one_and_say_how_to_read_on() {
        let t = "a\nb\nc\nd\n";
        let w = win(t, 2, Some(2), 100).unwrap();
        assert_eq!((w.text.as_str(), w.lines, w.more), ("b\nc\n", 2, true));
        assert_eq!(
            note("f", &w).unwrap(),
            "\n[f: lines 2-3 shown; the file continues: read on with offset 4]"
        );
        let w = win(t, 3, Some(2), 100).unwrap();
        assert_eq!((w.text.as_str(), w.more), ("c\nd\n", false));
        assert_eq!(note("f", &w), None);
        let w = win("a\nb", 2, None, 100).unwrap();
        assert_eq!(w.text, "b", "a last line without newline");
        assert_eq!(
            win(t, 9, None, 100).unwrap_err(),
            "f: offset 9 is past the end; the file has 4 lines"
        );
        assert_eq!(
            win(t, 5, None, 100).unwrap_err(),
            "f: offset 5 is past the end; the file has 4 lines"
        );
        assert_eq!(win("", 1, None, 100).unwrap().text, "");
    }

    #[test]
    fn the_byte_cap_keeps_whole_lines_after_the_first() {
        let w = win("aaaa\nbbbb\ncc\n", 1, None, 7).unwrap();
        assert_eq!((w.text.as_str(), w.lines, w.capped), ("aaaa\n", 1, true));
        assert_eq!(
            note("f", &w).unwrap(),
            "\n[f: line 1 shown; cut at the 1 MiB output cap: read on with offset 2]"
        );
        let w = win("aaaaaaaaaa\nb\n", 1, None, 4).unwrap();
        assert_eq!((w.text.as_str(), w.lines, w.capped), ("aaaa", 0, true));
        assert!(note("f", &w).unwrap().contains("part of line 1"));
        let w = win("abc\n", 1, None, 4).unwrap();
        assert_eq!((w.text.as_str(), w.more), ("abc\n", false), "exactly the cap");
    }

    #[test]
    fn binary_is_a_nul_or_invalid_utf8_but_not_a_cut_character() {
        assert_eq!(binary_reason(b"ab\0c", false), Some("it contains NUL bytes"));
        assert_eq!(binary_reason(b"ab\xffc", false), Some("it is not valid UTF-8"));
        let e_acute = "é".as_bytes();
        assert_eq!(binary_reason(&e_acute[..1], true), None, "cut by the sniff");
        assert_eq!(
            binary_reason(&e_acute[..1], false),
            Some("it is not valid UTF-8"),
            "cut by the end of the file"
        );
        assert_eq!(binary_reason("plain text ✓".as_bytes(), false), None);
    }
}
