//! The tools the agent can call (read_file, write_file, bash), each confined to the workspace.

use serde_json::Value;
use std::path::{Component, Path, PathBuf};
use tokio_util::sync::CancellationToken;

/// The most a tool returns as output; the rest is cut with a note.
const MAX_OUTPUT: usize = 1 << 20;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolOutput {
    pub ok: bool,
    pub output: String,
}

impl ToolOutput {
    fn ok(output: impl Into<String>) -> Self {
        ToolOutput {
            ok: true,
            output: output.into(),
        }
    }
    fn err(output: impl Into<String>) -> Self {
        ToolOutput {
            ok: false,
            output: output.into(),
        }
    }
}

/// Whether `tool` asks the user before it runs (in the default permission mode).
pub fn needs_approval(tool: &str) -> bool {
    matches!(tool, "write_file" | "bash")
}

/// A one-line human reason shown with an approval request.
pub fn approval_reason(tool: &str, input: &Value) -> String {
    let arg = |k: &str| {
        input
            .get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    match tool {
        "write_file" => format!("write {} to {}", bytes(arg("content").len()), arg("path")),
        "bash" => format!("run `{}` in the workspace", arg("command")),
        other => format!("run {other}"),
    }
}

/// Runs `tool` with `input` inside `workspace`. Failures are outputs with
/// ok=false, never errors: the model sees them like any other result.
pub async fn run(workspace: &Path, tool: &str, input: &Value, cancel: &CancellationToken) -> ToolOutput {
    let arg = |k: &str| input.get(k).and_then(Value::as_str);
    match tool {
        "read_file" => {
            let Some(path) = arg("path") else {
                return ToolOutput::err("read_file needs a string `path`");
            };
            match confine(workspace, path) {
                Ok(p) => match tokio::fs::read(&p).await {
                    Ok(bytes) => ToolOutput::ok(clip(String::from_utf8_lossy(&bytes).into_owned())),
                    Err(e) => ToolOutput::err(format!("cannot read {path}: {e}")),
                },
                Err(e) => ToolOutput::err(e),
            }
        }
        "write_file" => {
            let (Some(path), Some(content)) = (arg("path"), arg("content")) else {
                return ToolOutput::err("write_file needs string `path` and `content`");
            };
            let p = match confine(workspace, path) {
                Ok(p) => p,
                Err(e) => return ToolOutput::err(e),
            };
            if let Some(parent) = p.parent() {
                if let Err(e) = tokio::fs::create_dir_all(parent).await {
                    return ToolOutput::err(format!("cannot create the folder for {path}: {e}"));
                }
            }
            match tokio::fs::write(&p, content).await {
                Ok(()) => ToolOutput::ok(format!("wrote {} to {path}", bytes(content.len()))),
                Err(e) => ToolOutput::err(format!("cannot write {path}: {e}")),
            }
        }
        "bash" => {
            let Some(command) = arg("command") else {
                return ToolOutput::err("bash needs a string `command`");
            };
            let child = tokio::process::Command::new("sh")
                .arg("-c")
                .arg(command)
                .current_dir(workspace)
                .stdin(std::process::Stdio::null())
                .kill_on_drop(true)
                .output();
            tokio::select! {
                out = child => match out {
                    Ok(out) => {
                        let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
                        text.push_str(&String::from_utf8_lossy(&out.stderr));
                        if !out.status.success() {
                            text.push_str(&format!("\n[{}]", out.status));
                        }
                        ToolOutput { ok: out.status.success(), output: clip(text) }
                    }
                    Err(e) => ToolOutput::err(format!("cannot run sh: {e}")),
                },
                _ = cancel.cancelled() => ToolOutput::err("cancelled"),
            }
        }
        other => ToolOutput::err(format!("unknown tool {other}")),
    }
}

/// `1 byte`, `2 bytes`: what people read in approvals and results.
fn bytes(n: usize) -> String {
    if n == 1 {
        "1 byte".to_string()
    } else {
        format!("{n} bytes")
    }
}

fn clip(mut s: String) -> String {
    if s.len() > MAX_OUTPUT {
        let mut cut = MAX_OUTPUT;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push_str("\n[output truncated]");
    }
    s
}

/// Resolves a tool's relative `path` inside `workspace`, refusing absolute
/// paths, `..`, and symlinks (at the target or any existing ancestor) that
/// lead outside it.
pub fn confine(workspace: &Path, path: &str) -> Result<PathBuf, String> {
    let rel = Path::new(path);
    if path.is_empty() {
        return Err("an empty path".into());
    }
    if rel.is_absolute() || rel.has_root() {
        return Err(format!("{path}: absolute paths are outside the workspace"));
    }
    if rel
        .components()
        .any(|c| matches!(c, Component::ParentDir | Component::Prefix(_)))
    {
        return Err(format!("{path}: `..` would escape the workspace"));
    }
    let root = workspace
        .canonicalize()
        .map_err(|e| format!("the workspace {} is not usable: {e}", workspace.display()))?;
    let target = root.join(rel);
    // The deepest part of the path that exists decides where it really leads.
    let mut probe = target.clone();
    loop {
        if probe.symlink_metadata().is_ok() {
            let real = probe
                .canonicalize()
                .map_err(|e| format!("{path}: cannot resolve ({e})"))?;
            if !real.starts_with(&root) {
                return Err(format!("{path}: a symlink leads outside the workspace"));
            }
            break;
        }
        if !probe.pop() {
            break;
        }
    }
    Ok(target)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn one_byte_is_singular() {
        let ask = |content: &str| approval_reason("write_file", &json!({"path": "a", "content": content}));
        assert_eq!(ask("x"), "write 1 byte to a");
        assert_eq!(ask("xy"), "write 2 bytes to a");
        assert_eq!(ask(""), "write 0 bytes to a");
    }

    #[test]
    fn paths_cannot_escape_the_workspace() {
        let ws = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), "s").unwrap();
        std::os::unix::fs::symlink(outside.path(), ws.path().join("link")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), ws.path().join("s")).unwrap();
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "a/../../x",
            "link/secret",
            "s",
            "link/new/file",
        ] {
            assert!(confine(ws.path(), bad).is_err(), "{bad} must be refused");
        }
        assert!(confine(ws.path(), "a/b/c.txt").is_ok());
        assert!(confine(ws.path(), "./ok.txt").is_ok());
    }

    #[tokio::test]
    async fn tools_act_inside_the_workspace() {
        let ws = tempfile::tempdir().unwrap();
        let cancel = CancellationToken::new();
        let w = run(
            ws.path(),
            "write_file",
            &json!({"path": "d/f.txt", "content": "hello"}),
            &cancel,
        )
        .await;
        assert!(w.ok, "{}", w.output);
        let r = run(ws.path(), "read_file", &json!({"path": "d/f.txt"}), &cancel).await;
        assert_eq!(r, ToolOutput::ok("hello"));
        let b = run(
            ws.path(),
            "bash",
            &json!({"command": "cat d/f.txt; exit 3"}),
            &cancel,
        )
        .await;
        assert!(!b.ok);
        assert!(b.output.starts_with("hello"));
        let esc = run(ws.path(), "read_file", &json!({"path": "../etc/passwd"}), &cancel).await;
        assert!(!esc.ok);
    }
}
