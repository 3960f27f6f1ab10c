//! The system prompt: what the model is told about itself, the workspace and its tools, plus the project's own instructions from `AGENTS.md` and the user's memory notes.

use std::path::Path;

/// The most of `AGENTS.md` the prompt carries; the rest is cut with a note.
pub const MAX_INSTRUCTIONS: usize = 64 * 1024;

const BASE: &str = "You are vak, a coding agent working in a user's workspace through tools. \
Read files before you change them, make the smallest change that does the job, and say what you did. \
Paths are relative to the workspace root; nothing outside it can be read or written. \
Tools that change files or run commands may need the user's approval; a refused tool call comes back as an error result: \
do not retry it unchanged.";

/// The system prompt for a leg in `workspace`, ending with `memory` (what
/// `Memory::prompt` gives, already bounded). Reads `AGENTS.md` off the
/// runtime's worker threads; a missing or unreadable file is left out.
pub async fn system(workspace: &Path, memory: &str) -> String {
    let path = workspace.join("AGENTS.md");
    let instructions = tokio::task::spawn_blocking(move || read_bounded(&path))
        .await
        .ok()
        .flatten();
    let mut out = compose(workspace, instructions.as_deref());
    if !memory.is_empty() {
        out.push_str("\nWhat the user asked you to remember (memory notes; newer notes take precedence):\n");
        out.push_str(memory);
    }
    out
}

fn read_bounded(path: &Path) -> Option<String> {
    use std::io::Read;
    // Not through a symlink: a hostile workspace could point it anywhere.
    let meta = std::fs::symlink_metadata(path).ok()?;
    if !meta.is_file() {
        return None;
    }
    let mut buf = Vec::new();
    std::fs::File::open(path)
        .ok()?
        .take(MAX_INSTRUCTIONS as u64 + 1)
        .read_to_end(&mut buf)
        .ok()?;
    let cut = buf.len() > MAX_INSTRUCTIONS;
    buf.truncate(MAX_INSTRUCTIONS);
    let mut text = String::from_utf8_lossy(&buf).into_owned();
    if cut {
        text.push_str(&format!(
            "\n[AGENTS.md is longer than {MAX_INSTRUCTIONS} bytes; the rest is not shown]"
        ));
    }
    Some(text)
}

fn compose(workspace: &Path, instructions: Option<&str>) -> String {
    let mut out = format!("{BASE}\n\nWorkspace: {}\n", workspace.display());
    if let Some(text) = instructions.filter(|t| !t.trim().is_empty()) {
        out.push_str("\nThe project's instructions (AGENTS.md at the workspace root):\n\n");
        out.push_str(text.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn agents_md_is_included_bounded_and_never_through_a_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path();
        let bare = system(ws, "").await;
        assert!(bare.contains("Workspace: "));
        assert!(!bare.contains("AGENTS.md at the workspace root"));

        std::fs::write(ws.join("AGENTS.md"), "Run `make test` before committing.\n").unwrap();
        let with = system(ws, "").await;
        assert!(with.ends_with("Run `make test` before committing.\n"), "{with}");

        std::fs::write(ws.join("AGENTS.md"), "x".repeat(MAX_INSTRUCTIONS + 10)).unwrap();
        let long = system(ws, "").await;
        assert!(long.contains("the rest is not shown"));
        assert!(long.len() < MAX_INSTRUCTIONS + 2048);

        let secret = dir.path().join("secret.txt");
        std::fs::write(&secret, "TOP SECRET").unwrap();
        let ws2 = dir.path().join("ws2");
        std::fs::create_dir(&ws2).unwrap();
        std::os::unix::fs::symlink(&secret, ws2.join("AGENTS.md")).unwrap();
        assert!(!system(&ws2, "").await.contains("TOP SECRET"));
    }
}
