//! A scan of this crate's source for the lock rule ARCHITECTURE.md states: no mutex guard spans file I/O, an await or a `block_on`, no `Mutex<()>` serializes anything, and nothing outside a binary's `main` blocks on the runtime.
//!
//! A source scan, not a proof: a guard is a `let` whose value is a lock
//! (`lock(`, `.lock()`, `.read()`/`.write()` of an RwLock, or a helper
//! named `lock`, `state` or `table` that returns a guard), alive until its
//! block closes or it is `drop`ped; what it spans is read line by line.
//! The tests below also check the scan against snippets that break the rule,
//! so it cannot pass by finding nothing.

#![cfg(test)]

use std::path::{Path, PathBuf};

/// What may not happen while a guard is alive.
const UNDER_A_GUARD: &[&str] = &[
    "std::fs::",
    "fs::File",
    "File::open",
    "File::create",
    "OpenOptions",
    ".write_all(",
    ".sync_data(",
    ".sync_all(",
    ".set_len(",
    ".read_to_end(",
    "write_private_file(",
    "create_private_dir(",
    ".await",
    "block_on(",
];

/// One finding: the file, the guard's line and the line it spans.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Finding {
    pub(crate) file: String,
    pub(crate) line: usize,
    pub(crate) what: String,
}

/// The last call of `value` when nothing follows it: its name and what
/// comes before it (`a.b().lock()` -> `("lock", "a.b().")`).
fn last_call(value: &str) -> Option<(&str, &str)> {
    let body = value.strip_suffix(')')?;
    let mut depth = 1;
    let mut open = None;
    for (i, c) in body.char_indices().rev() {
        match c {
            ')' => depth += 1,
            '(' => {
                depth -= 1;
                if depth == 0 {
                    open = Some(i);
                    break;
                }
            }
            _ => {}
        }
    }
    let head = &body[..open?];
    let name_at = head
        .rfind(|c: char| !(c.is_alphanumeric() || c == '_'))
        .map_or(0, |i| i + 1);
    Some((&head[name_at..], &head[..name_at]))
}

/// Whether `value` is a lock guard: a call of `lock` (a method or a
/// helper), of `read`/`write` (an RwLock), or of a helper named `state` or
/// `table`, maybe unwrapped or awaited, with nothing after it.
fn is_guard(value: &str) -> bool {
    let value = value.strip_suffix(".await").unwrap_or(value);
    let Some((mut name, mut on)) = last_call(value) else {
        return false;
    };
    if name == "unwrap" || name == "unwrap_or_else" || name == "expect" {
        match on.strip_suffix('.').and_then(last_call) {
            Some((n, o)) => (name, on) = (n, o),
            None => return false,
        }
    }
    match name {
        // The standard streams' locks are their writers, not a guard of memory.
        "lock" if on.ends_with("stdout().") || on.ends_with("stderr().") => false,
        "lock" | "state" | "table" => true,
        // Methods only: `std::fs::read(..)` is I/O, not a guard.
        "read" | "write" => on.ends_with('.'),
        _ => false,
    }
}

/// The name a line binds to a guard, if it binds one (`_` drops it at once).
fn guard_binding(line: &str) -> Option<&str> {
    let rest = line.trim_start().strip_prefix("let ")?;
    let rest = rest.strip_prefix("mut ").unwrap_or(rest);
    let (name, value) = rest.split_once(" = ")?;
    let name = name.split(':').next()?.trim();
    if name == "_" || !name.chars().all(|c| c.is_alphanumeric() || c == '_') {
        return None;
    }
    let value = value.trim_end().strip_suffix(';')?.trim_end();
    is_guard(value).then_some(name)
}

/// Every rule `text` (one file's source, its test module left out) breaks.
pub(crate) fn scan(file: &str, text: &str) -> Vec<Finding> {
    let code: Vec<&str> = text.lines().take_while(|l| !test_only(l)).collect();
    let mut out = Vec::new();
    let bin = file.contains("/bin/") || file.ends_with("main.rs");
    for (i, line) in code.iter().enumerate() {
        let here = |what: String| Finding {
            file: file.to_string(),
            line: i + 1,
            what,
        };
        let line = line.split("//").next().unwrap_or_default();
        if line.contains("Mutex<()>") {
            out.push(here(
                "a Mutex<()>: a lock held to serialize, use an owner task".into(),
            ));
        }
        if line.contains("block_on(") && !bin {
            out.push(here("block_on outside a binary's main".into()));
        }
        let Some(name) = guard_binding(line) else { continue };
        let mut depth = 0i32;
        for (j, later) in code.iter().enumerate().skip(i + 1) {
            let later = later.split("//").next().unwrap_or_default();
            if later.contains(&format!("drop({name})")) {
                break;
            }
            if let Some(bad) = UNDER_A_GUARD.iter().find(|t| later.contains(*t)) {
                out.push(Finding {
                    file: file.to_string(),
                    line: i + 1,
                    what: format!("the guard `{name}` is alive at line {} ({bad})", j + 1),
                });
            }
            depth += later.matches('{').count() as i32 - later.matches('}').count() as i32;
            if depth < 0 {
                break;
            }
        }
    }
    out
}

/// Where a file's test code starts (a test module, or a file that is all tests).
fn test_only(line: &str) -> bool {
    matches!(line.trim(), "#[cfg(test)]" | "#![cfg(test)]")
}

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

mod tests {
    use super::*;

    #[test]
    fn no_lock_guard_spans_file_io_an_await_or_a_block_on_in_the_source() {
        // Every crate of the workspace: the core, and the edge and clients beside it.
        let crates = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .unwrap()
            .to_path_buf();
        let mut files = Vec::new();
        for c in ["vak-core", "vak-server", "vak-term", "vak-proto"] {
            sources(&crates.join(c).join("src"), &mut files);
        }
        sources(&crates.join("../src"), &mut files);
        let (mut guards, mut findings) = (0, Vec::new());
        for f in &files {
            let text = std::fs::read_to_string(f).unwrap();
            let name = f.strip_prefix(&crates).unwrap().display().to_string();
            guards += text
                .lines()
                .take_while(|l| !test_only(l))
                .filter(|l| guard_binding(l.split("//").next().unwrap_or_default()).is_some())
                .count();
            findings.extend(scan(&name, &text));
        }
        // Not vacuous: the scan reads the crate and finds its guards.
        assert!(
            files.len() > 40 && guards > 30,
            "{} files, {guards} guards",
            files.len()
        );
        let list: Vec<String> = findings
            .iter()
            .map(|f| format!("{}:{}: {}", f.file, f.line, f.what))
            .collect();
        assert!(list.is_empty(), "{}", list.join("\n"));
    }

    #[test]
    fn the_scan_catches_what_it_promises() {
        let io = "fn f(&self) {\n    let mut slot = lock(&self.file);\n    slot.as_mut().unwrap().write_all(b\"x\")?;\n}\n";
        assert_eq!(scan("a.rs", io).len(), 1, "a guard across a write");
        let serializer = "struct S {\n    turn: tokio::sync::Mutex<()>,\n}\nasync fn g(s: &S) {\n    let _turn = s.turn.lock().await;\n    std::fs::write(\"p\", b\"\").unwrap();\n}\n";
        let found = scan("b.rs", serializer);
        assert_eq!(found.len(), 2, "{found:?}");
        let across_await = "async fn h(&self) {\n    let st = self.state.lock().unwrap_or_else(|p| p.into_inner());\n    other().await;\n}\n";
        assert_eq!(scan("c.rs", across_await).len(), 1);
        let blocking = "fn i(&self) {\n    self.rt.block_on(x())\n}\n";
        assert_eq!(scan("d.rs", blocking).len(), 1);
        assert!(
            scan("src/main.rs", blocking).is_empty(),
            "a binary's main may block on its runtime"
        );
        // What the rule allows: a guard dropped or scoped before the I/O, a copy.
        let fine = "fn j(&self) {\n    let copy = lock(&self.m).clone();\n    {\n        let g = lock(&self.m);\n        g.len();\n    }\n    let h = lock(&self.m);\n    drop(h);\n    std::fs::write(\"p\", b\"\").unwrap();\n}\n";
        assert!(scan("e.rs", fine).is_empty(), "{:?}", scan("e.rs", fine));
        // Writing through a locked stdout is what its lock is for.
        let out =
            "fn l() {\n    let mut out = std::io::stdout().lock();\n    let _ = out.write_all(b\"x\");\n}\n";
        assert!(scan("g.rs", out).is_empty());
        // A test module is not scanned.
        let test_only = "#[cfg(test)]\nmod tests {\n    fn k() { rt.block_on(x()); }\n}\n";
        assert!(scan("f.rs", test_only).is_empty());
    }
}
