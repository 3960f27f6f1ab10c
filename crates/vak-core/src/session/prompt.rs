//! The system prompt: what the model is told about itself, the workspace and its tools, plus the project's own instructions from `AGENTS.md` and the user's memory notes.

use crate::workspace;
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
/// runtime's worker threads; a missing or refused file is left out, and so
/// is any when `read_agents` is false (the workspace failed its re-check).
pub async fn system(workspace: &Path, read_agents: bool, memory: &str) -> String {
    let ws = workspace.to_path_buf();
    let instructions = match read_agents {
        true => tokio::task::spawn_blocking(move || read_bounded(&ws))
            .await
            .ok()
            .flatten(),
        false => None,
    };
    let mut out = compose(workspace, instructions.as_deref());
    if !memory.is_empty() {
        out.push_str("\nWhat the user asked you to remember (memory notes; newer notes take precedence):\n");
        out.push_str(memory);
    }
    out
}

/// `AGENTS.md`, opened as the file tools open a file (`workspace::read`:
/// beneath the workspace, never through a symlink that leads out, a regular
/// file with one link), since the workspace's content may be hostile: a
/// hard link or a symlink to a secret would otherwise put the secret in
/// the prompt, and so in a request to the provider.
fn read_bounded(workspace: &Path) -> Option<String> {
    const NAME: &str = "AGENTS.md";
    // Only to stay quiet about the usual case; the open below is the check.
    if std::fs::symlink_metadata(workspace.join(NAME)).is_err() {
        return None;
    }
    let read = match workspace::read(workspace, NAME, MAX_INSTRUCTIONS) {
        Ok(read) => read,
        Err(why) => {
            tracing::warn!(workspace = %workspace.display(), "AGENTS.md is left out of the prompt: {why}");
            return None;
        }
    };
    let mut text = String::from_utf8_lossy(&read.bytes).into_owned();
    if read.truncated {
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
    async fn agents_md_is_included_bounded_and_never_through_a_symlink_or_a_hard_link() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path();
        let bare = system(ws, true, "").await;
        assert!(bare.contains("Workspace: "));
        assert!(!bare.contains("AGENTS.md at the workspace root"));

        std::fs::write(ws.join("AGENTS.md"), "Run `make test` before committing.\n").unwrap();
        let with = system(ws, true, "").await;
        assert!(with.ends_with("Run `make test` before committing.\n"), "{with}");

        std::fs::write(ws.join("AGENTS.md"), "x".repeat(MAX_INSTRUCTIONS + 10)).unwrap();
        let long = system(ws, true, "").await;
        assert!(long.contains("the rest is not shown"));
        assert!(long.len() < MAX_INSTRUCTIONS + 2048);

        let secret = dir.path().join("secret.txt");
        std::fs::write(&secret, "TOP SECRET").unwrap();
        let ws2 = dir.path().join("ws2");
        std::fs::create_dir(&ws2).unwrap();
        std::os::unix::fs::symlink(&secret, ws2.join("AGENTS.md")).unwrap();
        assert!(!system(&ws2, true, "").await.contains("TOP SECRET"));

        // A hard link shares the secret's contents while looking like a
        // plain file of the workspace: refused, as the file tools refuse it.
        let ws3 = dir.path().join("ws3");
        std::fs::create_dir(&ws3).unwrap();
        std::fs::hard_link(&secret, ws3.join("AGENTS.md")).unwrap();
        let linked = system(&ws3, true, "").await;
        assert!(!linked.contains("TOP SECRET"), "{linked}");
        assert!(!linked.contains("AGENTS.md at the workspace root"), "{linked}");
        // Nor is a FIFO waited on.
        let ws4 = dir.path().join("ws4");
        std::fs::create_dir(&ws4).unwrap();
        let fifo =
            std::ffi::CString::new(ws4.join("AGENTS.md").into_os_string().into_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        assert!(!system(&ws4, true, "")
            .await
            .contains("AGENTS.md at the workspace root"));
    }
}
