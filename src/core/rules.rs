//! Always-allow rules: a tool and a pattern a user approved for good, kept per workspace in the home, so later matching calls run without asking.
//!
//! A rule only ever turns an ask into a run: the permission table decides
//! first, so plan mode still refuses every edit and command whatever the
//! rules say, and a read never needed one.
//!
//! What a rule covers is derived from the approved call, conservatively:
//! - `bash`: a *simple* command (one program and its plain words: no quotes,
//!   `$`, globs, redirections, pipes, `;`, `&&`, subshells or backslashes,
//!   and no leading `NAME=value` assignment) becomes a *prefix* rule on its
//!   program and subcommand (`cargo test --lib` → `cargo test`, `ls -la` →
//!   `ls`), which later matches only simple commands whose words start with
//!   it. Anything else, and any shell, wrapper or interpreter (`bash`, `env`,
//!   `sudo`, `xargs`, `python`…) whose arguments are themselves code, becomes
//!   an *exact* rule: that command line and nothing else. A compound command
//!   is never generalised.
//! - file tools (`write_file`, `edit_file`): a *path* rule on the file,
//!   normalised relative to the workspace (`./a//b.txt` is `a/b.txt`).
//!
//! The rules file (`<home>/permissions/<workspace key>.json`, 0600) is read
//! once at startup and rewritten whole, through a temporary file and a rename,
//! on every change; writes run on a blocking thread, one at a time, and the
//! in-memory list that tool calls read is swapped only once the file is
//! written, so what is listed is what a restart finds.
//!
//! With `--bus` the rules live in the bucket every replica shares instead
//! (`shared_config.rs`, key `rules.<workspace key>`, the same document):
//! a change is a compare-and-set there, and every replica reads the list
//! the bucket's watch keeps in memory, so a rule stored by an approval on
//! one replica lets calls run on any, and a delete on any removes it
//! everywhere. The home's rules file is then not read.

use super::shared_config::SharedConfig;
use super::tools::{self, ToolClass};
use super::workspace;
use crate::error::{Error, ErrorKind, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

/// The most rules one workspace keeps.
pub const MAX_RULES: usize = 256;
/// The longest pattern a rule holds, in bytes.
pub const MAX_PATTERN: usize = 1024;

/// How a rule's pattern matches a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RuleKind {
    /// bash: a simple command whose words start with the pattern's words.
    Prefix,
    /// bash: exactly this command line (surrounding whitespace aside).
    Exact,
    /// A file tool: this path, relative to the workspace.
    Path,
}

impl RuleKind {
    pub fn as_str(self) -> &'static str {
        match self {
            RuleKind::Prefix => "prefix",
            RuleKind::Exact => "exact",
            RuleKind::Path => "path",
        }
    }
}

/// What an always-allow answer stores: derived from the call when its
/// approval is asked.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Candidate {
    pub tool: String,
    pub kind: RuleKind,
    pub pattern: String,
}

impl Candidate {
    /// Whether this pattern covers a call of `tool` with `input`.
    pub fn covers(&self, tool: &str, input: &Value) -> bool {
        if tool != self.tool {
            return false;
        }
        let arg = |k: &str| input.get(k).and_then(Value::as_str);
        match self.kind {
            RuleKind::Exact => arg("command").is_some_and(|c| c.trim() == self.pattern),
            RuleKind::Prefix => arg("command").and_then(simple_words).is_some_and(|words| {
                let prefix: Vec<&str> = self.pattern.split(' ').collect();
                words.len() >= prefix.len() && words[..prefix.len()] == prefix[..]
            }),
            RuleKind::Path => arg("path").and_then(normal_path).as_deref() == Some(self.pattern.as_str()),
        }
    }

    /// `bash `cargo test`` or `write_file `src/a.rs``: what the rule covers, for people.
    pub fn describe(&self) -> String {
        match self.kind {
            RuleKind::Prefix => format!(
                "{} `{}` (and longer commands that start with it)",
                self.tool, self.pattern
            ),
            RuleKind::Exact => format!("{} `{}` (exactly this command)", self.tool, self.pattern),
            RuleKind::Path => format!("{} `{}`", self.tool, self.pattern),
        }
    }
}

/// A stored rule.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rule {
    /// `rule_` and 12 hex digits.
    pub id: String,
    #[serde(flatten)]
    pub what: Candidate,
    /// RFC 3339, UTC.
    pub created_at: String,
}

/// Programs whose arguments are themselves commands or code: a rule on one
/// of them is always exact, never a prefix.
const NEVER_PREFIX: &[&str] = &[
    "sh", "bash", "zsh", "dash", "ksh", "csh", "tcsh", "fish", "env", "sudo", "su", "doas", "xargs", "eval",
    "exec", "command", "builtin", "source", ".", "nohup", "nice", "ionice", "timeout", "time", "watch",
    "strace", "ltrace", "chroot", "setsid", "stdbuf", "flock", "parallel", "find", "node", "deno", "bun",
    "perl", "ruby", "php", "lua", "awk", "gawk", "mawk", "sed", "ssh", "npx",
];

/// The words of a simple command, or None when the line is anything the
/// shell would read as more than a program and plain words.
fn simple_words(command: &str) -> Option<Vec<&str>> {
    let plain = |c: char| c.is_ascii_alphanumeric() || " -_./:=,+@%^".contains(c);
    if !command.trim().chars().all(plain) {
        return None;
    }
    let words: Vec<&str> = command.split_whitespace().collect();
    // `NAME=value cmd`: an assignment changes what the program does.
    match words.first() {
        Some(first) if !first.contains('=') => Some(words),
        _ => None,
    }
}

/// A subcommand-like word: `test`, `run`, `status` (not an option, a path or a value).
fn subcommand(word: &str) -> bool {
    let mut chars = word.chars();
    chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
}

/// The program's own name (`/usr/bin/python3` → `python3`).
fn program_name(word: &str) -> &str {
    word.rsplit('/').next().unwrap_or(word)
}

/// What a bash rule made from `command` covers (see the module docs).
fn bash_candidate(command: &str) -> Candidate {
    let command = command.trim();
    let exact = Candidate {
        tool: "bash".into(),
        kind: RuleKind::Exact,
        pattern: command.to_string(),
    };
    let Some(words) = simple_words(command) else {
        return exact;
    };
    let program = program_name(words[0]);
    if NEVER_PREFIX.contains(&program) || program.starts_with("python") {
        return exact;
    }
    let take = if words.len() > 1 && subcommand(words[1]) {
        2
    } else {
        1
    };
    Candidate {
        tool: "bash".into(),
        kind: RuleKind::Prefix,
        pattern: words[..take].join(" "),
    }
}

/// A tool's path relative to the workspace, normalised; None for one no tool accepts.
fn normal_path(path: &str) -> Option<String> {
    let parts = workspace::components(path).ok()?;
    (!parts.is_empty()).then(|| parts.join("/"))
}

/// What `{approve: true, always: true}` would store for this call; None for
/// a call no rule can cover (reads never ask, a plan is approved once, and
/// a path no tool accepts names nothing).
pub fn candidate(tool: &str, input: &Value) -> Option<Candidate> {
    match tools::class(tool) {
        ToolClass::Exec if tool == "bash" => {
            let command = input.get("command").and_then(Value::as_str)?;
            (!command.trim().is_empty()).then(|| bash_candidate(command))
        }
        ToolClass::Edit => Some(Candidate {
            tool: tool.to_string(),
            kind: RuleKind::Path,
            pattern: normal_path(input.get("path").and_then(Value::as_str)?)?,
        }),
        _ => None,
    }
}

/// The rules file's content.
#[derive(Serialize, Deserialize)]
struct File {
    version: u32,
    workspace: String,
    rules: Vec<Rule>,
}

/// The rules of this server's workspace.
pub struct Rules {
    dir: PathBuf,
    name: String,
    workspace: String,
    /// What tool calls read; replaced whole once a change is on disk.
    list: RwLock<Arc<Vec<Rule>>>,
    /// One change at a time, from reading the list to swapping it (the
    /// write itself runs on a blocking thread; readers never wait on it).
    change: tokio::sync::Mutex<()>,
    /// With `--bus`: the shared bucket, which holds the list instead.
    shared: Option<Arc<SharedConfig>>,
}

impl Rules {
    /// Reads the workspace's rules file (blocking: call it at startup). A
    /// missing file is no rules; an unreadable or malformed one is logged
    /// and treated as none, and is replaced by the next change.
    pub fn load(home: &Path, workspace: &Path) -> Rules {
        let (workspace, key) = crate::home::workspace_key(workspace);
        let rules = Rules {
            dir: home.join("permissions"),
            name: format!("{key}.json"),
            workspace,
            list: RwLock::new(Arc::new(Vec::new())),
            change: tokio::sync::Mutex::new(()),
            shared: None,
        };
        let path = rules.path();
        let loaded = match std::fs::read(&path) {
            Ok(bytes) => match serde_json::from_slice::<File>(&bytes) {
                Ok(f) => f.rules,
                Err(e) => {
                    tracing::error!(path = %path.display(), "ignoring a malformed rules file: {e}");
                    Vec::new()
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => {
                tracing::error!(path = %path.display(), "cannot read the rules file: {e}");
                Vec::new()
            }
        };
        *rules.list.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(loaded);
        rules
    }

    /// The rules of `workspace` in the bucket every replica shares (`--bus`).
    pub fn shared(shared: Arc<SharedConfig>, home: &Path, workspace: &Path) -> Rules {
        let (workspace, key) = crate::home::workspace_key(workspace);
        Rules {
            dir: home.join("permissions"),
            name: key,
            workspace,
            list: RwLock::new(Arc::new(Vec::new())),
            change: tokio::sync::Mutex::new(()),
            shared: Some(shared),
        }
    }

    pub fn path(&self) -> PathBuf {
        self.dir.join(&self.name)
    }

    /// The workspace these rules belong to (canonical).
    pub fn workspace(&self) -> &str {
        &self.workspace
    }

    pub fn list(&self) -> Arc<Vec<Rule>> {
        if let Some(shared) = &self.shared {
            return shared.rules(&self.name);
        }
        self.list.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The list as the store holds it now: with `--bus`, read from the
    /// bucket (so a listing made after a change on any replica shows it).
    pub async fn list_now(&self) -> Result<Arc<Vec<Rule>>> {
        match &self.shared {
            Some(shared) => shared.refresh_rules(&self.name).await,
            None => Ok(self.list()),
        }
    }

    /// The rule that lets a call of `tool` with `input` run without asking.
    pub fn allowing(&self, tool: &str, input: &Value) -> Option<Rule> {
        self.list().iter().find(|r| r.what.covers(tool, input)).cloned()
    }

    /// Stores `c` (an identical rule already stored is answered as is):
    /// the rule, and whether it is new. Refused past `MAX_RULES` or
    /// `MAX_PATTERN`; an Internal error when the file cannot be written.
    pub async fn add(&self, c: Candidate) -> Result<(Rule, bool)> {
        if c.pattern.len() > MAX_PATTERN {
            return Err(Error::invalid(format!(
                "the pattern is {} bytes; an always-allow rule holds at most {MAX_PATTERN}",
                c.pattern.len()
            )));
        }
        let _one = self.change.lock().await;
        if let Some(shared) = &self.shared {
            return shared
                .change_rules(&self.name, &self.workspace, |list| added(list, &c))
                .await;
        }
        let (next, out) = added(&self.list(), &c)?;
        if let Some(next) = next {
            self.store(next).await?;
        }
        Ok(out)
    }

    /// Deletes the rule `id`; the rule deleted. NotFound for an unknown id.
    pub async fn delete(&self, id: &str) -> Result<Rule> {
        super::hub::validate_plain_id("rule id", id)?;
        let _one = self.change.lock().await;
        if let Some(shared) = &self.shared {
            return shared
                .change_rules(&self.name, &self.workspace, |list| deleted(list, id))
                .await;
        }
        let (next, gone) = deleted(&self.list(), id)?;
        if let Some(next) = next {
            self.store(next).await?;
        }
        Ok(gone)
    }

    /// Writes `next` to the file, then makes it the live list. Called with `change` held.
    async fn store(&self, next: Vec<Rule>) -> Result<()> {
        let file = File {
            version: 1,
            workspace: self.workspace.clone(),
            rules: next,
        };
        let bytes = serde_json::to_vec_pretty(&file).map_err(|e| Error::internal(e.to_string()))?;
        let (dir, name) = (self.dir.clone(), self.name.clone());
        tokio::task::spawn_blocking(move || {
            crate::home::create_private_dir(&dir)
                .map_err(|e| Error::internal(format!("cannot create {}: {e}", dir.display())))?;
            crate::home::write_private_file(&dir, &name, &bytes)
        })
        .await
        .map_err(|e| Error::internal(e.to_string()))??;
        *self.list.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(file.rules);
        Ok(())
    }
}

/// `list` with `c` added (None when an identical rule is there already):
/// the list to store and what `add` answers.
type Added = (Option<Vec<Rule>>, (Rule, bool));

fn added(list: &[Rule], c: &Candidate) -> Result<Added> {
    if let Some(same) = list.iter().find(|r| r.what == *c) {
        return Ok((None, (same.clone(), false)));
    }
    if list.len() >= MAX_RULES {
        return Err(Error::new(
            ErrorKind::ResourceExhausted,
            format!(
                "this workspace already has {MAX_RULES} always-allow rules, the most it keeps: \
                 delete some first"
            ),
        ));
    }
    let rule = Rule {
        id: format!("rule_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]),
        what: c.clone(),
        created_at: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
    };
    let mut next = list.to_vec();
    next.push(rule.clone());
    Ok((Some(next), (rule, true)))
}

/// `list` without the rule `id`, and that rule; NotFound for an unknown id.
fn deleted(list: &[Rule], id: &str) -> Result<(Option<Vec<Rule>>, Rule)> {
    let Some(at) = list.iter().position(|r| r.id == id) else {
        return Err(Error::not_found(format!("no always-allow rule {id}")));
    };
    let mut next = list.to_vec();
    let gone = next.remove(at);
    Ok((Some(next), gone))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn bash(cmd: &str) -> Candidate {
        candidate("bash", &json!({ "command": cmd })).unwrap()
    }

    #[test]
    fn simple_commands_become_program_and_subcommand_prefixes() {
        for (cmd, prefix) in [
            ("cargo test --lib", "cargo test"),
            ("cargo test", "cargo test"),
            ("ls -la", "ls"),
            ("ls", "ls"),
            ("  cargo   build --release ", "cargo build"),
            ("./run.sh fast", "./run.sh fast"),
            ("rg -n foo src", "rg"),
            ("git status", "git status"),
        ] {
            let c = bash(cmd);
            assert_eq!((c.kind, c.pattern.as_str()), (RuleKind::Prefix, prefix), "{cmd}");
        }
        let c = bash("cargo test --lib");
        let covers = |cmd: &str| c.covers("bash", &json!({ "command": cmd }));
        assert!(covers("cargo test"));
        assert!(covers("cargo test -p vak -- modes"));
        assert!(!covers("cargo testify"));
        assert!(!covers("cargo build"));
        assert!(!c.covers("write_file", &json!({ "command": "cargo test" })));
    }

    #[test]
    fn compound_commands_and_wrappers_are_never_generalised() {
        for cmd in [
            "cargo test && rm -rf /",
            "cargo test; rm -rf /",
            "cargo test | tee out",
            "cargo test > out",
            "(cargo test)",
            "$(cargo test)",
            "`cargo test`",
            "FOO=1 cargo test",
            "cargo test \"quoted\"",
            "cargo test 'x'",
            "ls *",
            "cargo test\nrm x",
            "cargo test \\\n --lib",
            "bash -c ls",
            "env ls",
            "sudo ls",
            "xargs rm",
            "python3 -c 1",
            "/usr/bin/python script.py",
            "ssh host ls",
            "find . -delete",
        ] {
            let c = bash(cmd);
            assert_eq!(c.kind, RuleKind::Exact, "{cmd:?}");
            assert_eq!(c.pattern, cmd.trim());
            assert!(c.covers("bash", &json!({ "command": format!(" {cmd} ") })));
            assert!(!c.covers("bash", &json!({ "command": format!("{cmd} x") })));
        }
        // A prefix rule never covers a compound command that starts like it.
        let ls = bash("ls -la");
        for cmd in [
            "ls; rm -rf /",
            "ls && rm x",
            "ls | sh",
            "ls $(rm x)",
            "ls `rm x`",
            "FOO=1 ls",
        ] {
            assert!(!ls.covers("bash", &json!({ "command": cmd })), "{cmd}");
        }
        assert_eq!(candidate("bash", &json!({ "command": "  " })), None);
        assert_eq!(candidate("bash", &json!({})), None);
    }

    #[test]
    fn file_tools_get_their_normalised_path_and_other_tools_nothing() {
        let c = candidate("write_file", &json!({"path": "./src//a.rs", "content": "x"})).unwrap();
        assert_eq!((c.kind, c.pattern.as_str()), (RuleKind::Path, "src/a.rs"));
        assert!(c.covers("write_file", &json!({"path": "src/a.rs"})));
        assert!(!c.covers("edit_file", &json!({"path": "src/a.rs"})));
        assert!(!c.covers("write_file", &json!({"path": "src/b.rs"})));
        assert!(candidate("edit_file", &json!({"path": "a"})).is_some());
        for input in [json!({"path": "../x"}), json!({"path": "/etc/passwd"}), json!({})] {
            assert_eq!(candidate("write_file", &input), None, "{input}");
        }
        assert_eq!(candidate("read_file", &json!({"path": "a"})), None);
        assert_eq!(candidate("exit_plan_mode", &json!({"plan": "p"})), None);
    }

    #[tokio::test]
    async fn rules_persist_dedupe_are_capped_and_deleted() {
        let (home, ws) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let rules = Rules::load(home.path(), ws.path());
        let (r, new) = rules.add(bash("cargo test --lib")).await.unwrap();
        assert!(new && r.id.starts_with("rule_"));
        let (again, new) = rules.add(bash("cargo test")).await.unwrap();
        assert!(!new && again.id == r.id, "the same rule is not stored twice");
        assert!(rules
            .allowing("bash", &json!({"command": "cargo test -q"}))
            .is_some());
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(rules.path()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);

        let reloaded = Rules::load(home.path(), ws.path());
        assert_eq!(reloaded.list().as_ref(), rules.list().as_ref());
        // Another workspace has its own rules.
        let other = tempfile::tempdir().unwrap();
        assert!(Rules::load(home.path(), other.path()).list().is_empty());

        let long = Candidate {
            pattern: "x".repeat(MAX_PATTERN + 1),
            ..bash("ls")
        };
        assert_eq!(
            rules.add(long).await.unwrap_err().kind,
            ErrorKind::InvalidArgument
        );
        for i in 1..MAX_RULES {
            rules.add(bash(&format!("prog{i} -x"))).await.unwrap();
        }
        let full = rules.add(bash("one-too-many")).await.unwrap_err();
        assert_eq!(full.kind, ErrorKind::ResourceExhausted);
        assert!(full.message.contains("256"), "{full}");

        assert_eq!(rules.delete(&r.id).await.unwrap().id, r.id);
        assert_eq!(rules.delete(&r.id).await.unwrap_err().kind, ErrorKind::NotFound);
        assert!(rules
            .allowing("bash", &json!({"command": "cargo test"}))
            .is_none());
        assert_eq!(Rules::load(home.path(), ws.path()).list().len(), MAX_RULES - 1);
    }

    #[tokio::test]
    async fn a_failed_write_changes_nothing() {
        let (home, ws) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        std::fs::write(home.path().join("permissions"), "not a directory").unwrap();
        let rules = Rules::load(home.path(), ws.path());
        let e = rules.add(bash("ls")).await.unwrap_err();
        assert_eq!(e.kind, ErrorKind::Internal);
        assert!(rules.list().is_empty());
    }
}
