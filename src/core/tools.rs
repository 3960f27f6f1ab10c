//! The tools the agent can call (read_file, write_file, bash), each confined to the workspace.

use super::workspace;
use serde_json::Value;
use std::path::Path;
use std::process::Stdio;
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
/// ok=false, never errors: the model sees them like any other result. Every
/// tool ends when `cancel` fires: file tools stop waiting for their (bounded)
/// blocking work, bash kills its whole process group.
pub async fn run(workspace: &Path, tool: &str, input: &Value, cancel: &CancellationToken) -> ToolOutput {
    let arg = |k: &str| input.get(k).and_then(Value::as_str);
    if cancel.is_cancelled() {
        return ToolOutput::err(CANCELLED);
    }
    match tool {
        "read_file" => {
            let Some(path) = arg("path") else {
                return ToolOutput::err("read_file needs a string `path`");
            };
            let (ws, p) = (workspace.to_path_buf(), path.to_string());
            match blocking(cancel, move || workspace::read(&ws, &p, MAX_OUTPUT)).await {
                Some(Ok(read)) => {
                    let mut text = String::from_utf8_lossy(&read.bytes).into_owned();
                    if read.truncated {
                        cut(&mut text, MAX_OUTPUT);
                        // The size is fstat's at open time; a file that grew while
                        // it was read is longer than that.
                        let size = if read.size > MAX_OUTPUT as u64 {
                            format!("is {}", bytes(read.size as usize))
                        } else {
                            "grew while it was read".to_string()
                        };
                        text.push_str(&format!(
                            "\n[output truncated: {path} {size}; this is the first {}]",
                            bytes(MAX_OUTPUT)
                        ));
                    } else {
                        text = clip(text);
                    }
                    ToolOutput::ok(text)
                }
                Some(Err(e)) => ToolOutput::err(e),
                None => ToolOutput::err(CANCELLED),
            }
        }
        "write_file" => {
            let (Some(path), Some(content)) = (arg("path"), arg("content")) else {
                return ToolOutput::err("write_file needs string `path` and `content`");
            };
            let len = content.len();
            let (ws, p, c) = (workspace.to_path_buf(), path.to_string(), content.to_string());
            match blocking(cancel, move || workspace::write(&ws, &p, c.as_bytes())).await {
                Some(Ok(())) => ToolOutput::ok(format!("wrote {} to {path}", bytes(len))),
                Some(Err(e)) => ToolOutput::err(e),
                None => ToolOutput::err(CANCELLED),
            }
        }
        "bash" => {
            let Some(command) = arg("command") else {
                return ToolOutput::err("bash needs a string `command`");
            };
            bash(workspace, command, cancel).await
        }
        other => ToolOutput::err(format!("unknown tool {other}")),
    }
}

const CANCELLED: &str = "cancelled";

/// Runs `f` on the blocking pool; None when `cancel` fires first (the work
/// itself is bounded and finishes on its own).
async fn blocking<T: Send + 'static>(
    cancel: &CancellationToken,
    f: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Option<Result<T, String>> {
    tokio::select! {
        r = tokio::task::spawn_blocking(f) => {
            Some(r.unwrap_or_else(|e| Err(format!("the tool failed: {e}"))))
        }
        _ = cancel.cancelled() => None,
    }
}

/// Kills a process group when dropped, unless disarmed: a bash command that
/// is cancelled (or whose run is dropped) takes its children with it.
struct ProcessGroup(Option<i32>);

impl ProcessGroup {
    fn kill(&mut self) {
        if let Some(pgid) = self.0.take() {
            // SAFETY: killpg only sends a signal. The group's leader is our
            // unreaped child, so its id cannot have been reused.
            unsafe { libc::killpg(pgid, libc::SIGKILL) };
        }
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        self.kill();
    }
}

async fn bash(workspace: &Path, command: &str, cancel: &CancellationToken) -> ToolOutput {
    let mut child = match tokio::process::Command::new("sh")
        .arg("-c")
        .arg(command)
        .current_dir(workspace)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
    {
        Ok(c) => c,
        Err(e) => return ToolOutput::err(format!("cannot run sh: {e}")),
    };
    let mut group = ProcessGroup(child.id().and_then(|id| i32::try_from(id).ok()));
    let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
    let finished = tokio::select! {
        r = async { tokio::join!(drain(stdout), drain(stderr), child.wait()) } => Some(r),
        _ = cancel.cancelled() => None,
    };
    let Some((out, err, status)) = finished else {
        group.kill();
        // SIGKILL cannot be caught: the reap is prompt, but never wait unbounded.
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), child.wait()).await;
        return ToolOutput::err("cancelled: the command and its process group were killed");
    };
    // Finished on its own: background jobs that let go of the output live on.
    group.0 = None;
    let status = match status {
        Ok(s) => s,
        Err(e) => return ToolOutput::err(format!("cannot wait for sh: {e}")),
    };
    let mut text = String::from_utf8_lossy(&out).into_owned();
    text.push_str(&String::from_utf8_lossy(&err));
    let mut text = clip(text);
    if !status.success() {
        text.push_str(&format!("\n[{status}]"));
    }
    ToolOutput {
        ok: status.success(),
        output: text,
    }
}

/// Reads a pipe to its end, keeping at most MAX_OUTPUT + 1 bytes (one more
/// than fits says it was cut) and discarding the rest, so the writer never stalls.
async fn drain(pipe: Option<impl tokio::io::AsyncRead + Unpin>) -> Vec<u8> {
    use tokio::io::AsyncReadExt;
    let mut kept = Vec::new();
    let Some(mut pipe) = pipe else {
        return kept;
    };
    let mut buf = vec![0u8; 64 * 1024];
    while let Ok(n) = pipe.read(&mut buf).await {
        if n == 0 {
            break;
        }
        let room = (MAX_OUTPUT + 1).saturating_sub(kept.len());
        kept.extend_from_slice(&buf[..n.min(room)]);
    }
    kept
}

/// `1 byte`, `2 bytes`: what people read in approvals and results.
fn bytes(n: usize) -> String {
    crate::text::count(n, "byte")
}

fn clip(mut s: String) -> String {
    if s.len() > MAX_OUTPUT {
        cut(&mut s, MAX_OUTPUT);
        s.push_str("\n[output truncated]");
    }
    s
}

/// Truncates `s` to at most `max` bytes, on a character boundary.
fn cut(s: &mut String, max: usize) {
    if s.len() > max {
        let mut at = max;
        while !s.is_char_boundary(at) {
            at -= 1;
        }
        s.truncate(at);
    }
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

    #[tokio::test]
    async fn paths_cannot_escape_the_workspace() {
        let ws = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), "s").unwrap();
        std::os::unix::fs::symlink(outside.path(), ws.path().join("link")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), ws.path().join("s")).unwrap();
        let cancel = CancellationToken::new();
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "a/../../x",
            "link/secret",
            "s",
            "link/new/file",
        ] {
            let r = run(ws.path(), "read_file", &json!({"path": bad}), &cancel).await;
            assert!(!r.ok, "{bad} must be refused: {}", r.output);
            let w = run(
                ws.path(),
                "write_file",
                &json!({"path": bad, "content": "x"}),
                &cancel,
            )
            .await;
            assert!(!w.ok, "{bad} must be refused: {}", w.output);
        }
        assert_eq!(
            std::fs::read_to_string(outside.path().join("secret")).unwrap(),
            "s"
        );
        assert!(!outside.path().join("new").exists());
        let ok = run(
            ws.path(),
            "write_file",
            &json!({"path": "./ok.txt", "content": "x"}),
            &cancel,
        )
        .await;
        assert!(ok.ok, "{}", ok.output);
    }

    #[test]
    fn cut_keeps_whole_characters() {
        let mut s = "aé".to_string();
        cut(&mut s, 2);
        assert_eq!(s, "a");
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
