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
//!   program and, when the next word looks like one, its subcommand
//!   (`cargo test lib` → `cargo test`, `ls src` → `ls src`), but only when
//!   every word after those is a *plain word*: no option (`-x`, `--x`), no
//!   path (a `/` anywhere, or a leading `.` or `~`) and no `=`. The prefix
//!   later matches only simple commands whose words start with it and go on
//!   with plain words only, so `cargo test` never covers
//!   `cargo test --config=…` or `cargo test --manifest-path=/etc/x`.
//!   Programs whose subcommands or options can write anywhere or run code
//!   (`RESTRICTED`: shells, wrappers, interpreters, `git`, `curl`, `tar`,
//!   `busybox`, package managers, `make`, `cp`…) get a prefix only in one
//!   of the few `SAFE_FORMS` (`git status`, `git log`, `cargo test`…).
//!   Anything else, a command with an option, a path or `=` included,
//!   becomes an *exact* rule: that command line and nothing else. Only the
//!   blanks bash ignores (space, tab, newline) are trimmed around a
//!   command; any other whitespace (`\u{a0}ls`, `ls\u{2003}`) is part of it,
//!   so such a command is never simple and an exact rule matches it byte
//!   for byte. A compound command is never generalised.
//! - file tools (`write_file`, `edit_file`): a *path* rule on the file,
//!   normalised relative to the workspace (`./a//b.txt` is `a/b.txt`).
//!
//! The rules file (`<home>/permissions/<workspace key>.json`, 0600) is read
//! once at startup and rewritten whole, through a temporary file and a rename,
//! on every change; changes run on the file's owner task (`file_owner.rs`),
//! one at a time, their writes on a blocking thread, and the in-memory list that tool calls read is swapped only once the file is
//! written, so what is listed is what a restart finds.
//!
//! With `--bus` the rules live in the bucket every replica shares instead
//! (`shared_config.rs`, key `rules.<workspace key>`, the same document):
//! a change is a compare-and-set there, and every replica reads the list
//! the bucket's watch keeps in memory, so a rule stored by an approval on
//! one replica lets calls run on any, and a delete on any removes it
//! everywhere. The home's rules file is then not read.

use super::file_owner::FileOwner;
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
    /// bash: a simple command whose words start with the pattern's words
    /// and go on with plain words only.
    Prefix,
    /// bash: exactly this command line (the blanks bash ignores around it aside).
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
            RuleKind::Exact => arg("command").is_some_and(|c| as_run(c) == self.pattern),
            RuleKind::Prefix => arg("command").and_then(simple_words).is_some_and(|words| {
                let prefix: Vec<&str> = self.pattern.split(' ').collect();
                prefix_allowed(&prefix)
                    && words.len() >= prefix.len()
                    && words[..prefix.len()] == prefix[..]
                    && words[prefix.len()..].iter().all(|w| plain_word(w))
            }),
            RuleKind::Path => arg("path").and_then(normal_path).as_deref() == Some(self.pattern.as_str()),
        }
    }

    /// `bash `cargo test`` or `write_file `src/a.rs``: what the rule covers, for people.
    pub fn describe(&self) -> String {
        match self.kind {
            RuleKind::Prefix => format!(
                "{} `{}` (and the same with more plain words: no options, paths or `=`)",
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

/// Programs that never get a prefix rule beyond their `SAFE_FORMS`: those
/// whose arguments are commands or code (shells, wrappers, interpreters),
/// and those whose subcommands or options can write files anywhere, fetch,
/// install or run code, or act on other processes, even with plain words
/// only (`tar xf`, `make deploy`, `npm run x`, `cp x link`, `kill 1`). A
/// program is named by its file name with any version suffix dropped
/// (`/usr/bin/python3.12` is `python`, `pip3` is `pip`).
#[rustfmt::skip]
const RESTRICTED: &[&str] = &[
    // Shells, wrappers and interpreters: their arguments are code.
    "sh", "bash", "zsh", "dash", "ksh", "mksh", "csh", "tcsh", "fish", "elvish", "nu", "pwsh", "powershell",
    "busybox", "toybox", "env", "sudo", "su", "doas", "pkexec", "runuser", "xargs", "eval", "exec", "command",
    "builtin", "source", ".", "nohup", "nice", "ionice", "timeout", "time", "watch", "strace", "ltrace", "gdb",
    "lldb", "valgrind", "chroot", "unshare", "nsenter", "setsid", "stdbuf", "flock", "parallel", "script",
    "systemd-run", "find", "python", "node", "nodejs", "deno", "bun", "perl", "ruby", "irb", "php", "lua",
    "luajit", "tclsh", "wish", "expect", "java", "jshell", "R", "Rscript", "julia", "awk", "gawk", "mawk",
    "nawk", "sed", "ed", "ex", "vi", "vim", "nvim", "emacs", "sqlite", "psql", "mysql", "osascript",
    // Remote access, fetchers and archivers: they write where options or
    // plain words say (`tar xf`, `curl -o`, `unzip`) or reach other hosts.
    "ssh", "scp", "sftp", "rsync", "ftp", "telnet", "nc", "ncat", "netcat", "socat", "curl", "wget", "aria2c",
    "tar", "unzip", "zip", "7z", "7za", "cpio", "ar", "gzip", "gunzip", "bzip2", "xz", "zstd",
    // Version control, build tools and package managers: subcommands and
    // options that write outside the workspace, install or run code.
    "git", "hg", "svn", "make", "gmake", "cmake", "ninja", "meson", "bazel", "gradle", "mvn", "ant", "cargo",
    "rustup", "rustc", "go", "npm", "npx", "pnpm", "pnpx", "yarn", "bunx", "pip", "pipx", "uv", "uvx", "poetry",
    "pdm", "conda", "mamba", "gem", "bundle", "composer", "apt", "apt-get", "aptitude", "dpkg", "snap", "flatpak",
    "dnf", "yum", "rpm", "pacman", "zypper", "apk", "brew", "nix", "nix-env", "docker", "podman", "kubectl",
    "helm",
    // Files and processes: a plain word may be a symlink to a file outside,
    // or another process.
    "cp", "mv", "rm", "ln", "install", "chmod", "chown", "chgrp", "chattr", "dd", "tee", "truncate", "shred",
    "patch", "kill", "pkill", "killall", "crontab", "at", "batch", "systemctl", "open", "xdg-open",
];

/// The subcommands of `RESTRICTED` programs that may still get a prefix
/// rule, because with plain words after them (revisions, test names,
/// package names) they only read, or build and test the workspace as the
/// approved call did. Left out on purpose: `git diff` and `git show` (a
/// plain-word path or revision picks files whose `.gitattributes` name an
/// external diff or textconv driver), `cargo run`, `cargo install`,
/// `npm run`, `make` (a plain word is another target or recipe).
const SAFE_FORMS: &[(&str, &str)] = &[
    ("git", "status"),
    ("git", "log"),
    ("cargo", "build"),
    ("cargo", "check"),
    ("cargo", "test"),
    ("cargo", "bench"),
    ("cargo", "clippy"),
    ("cargo", "fmt"),
    ("cargo", "doc"),
    ("go", "build"),
    ("go", "test"),
    ("go", "vet"),
    ("npm", "test"),
    ("pip", "list"),
    ("pip", "show"),
    ("pip", "freeze"),
];

/// The blanks bash itself ignores around a command: only these are
/// trimmed. Any other whitespace (a no-break or em space, a carriage
/// return) is part of a word to the shell (`ls\u{a0}` is another program),
/// so it is part of the command as matched too.
const BLANKS: &[char] = &[' ', '\t', '\n'];

/// The command as the shell runs it, for matching: `command` without the
/// blanks around it (see `BLANKS`).
fn as_run(command: &str) -> &str {
    command.trim_matches(BLANKS)
}

/// The words of a simple command, or None when the line is anything the
/// shell would read as more than a program and plain words.
fn simple_words(command: &str) -> Option<Vec<&str>> {
    let plain = |c: char| c.is_ascii_alphanumeric() || " -_./:=,+@%^".contains(c);
    let command = as_run(command);
    if !command.chars().all(plain) {
        return None;
    }
    let words: Vec<&str> = command.split(' ').filter(|w| !w.is_empty()).collect();
    // `NAME=value cmd`: an assignment changes what the program does.
    match words.first() {
        Some(first) if !first.contains('=') => Some(words),
        _ => None,
    }
}

/// A plain word: no option (`-x`, `--x`), no path (`/` anywhere, or a
/// leading `.` or `~`), no `=`: what a prefix rule lets vary.
fn plain_word(word: &str) -> bool {
    word.starts_with(|c: char| c.is_ascii_alphanumeric())
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.,+@%^:".contains(c))
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

/// The program's family, version aside (`python3.12` → `python`, `pip3` → `pip`).
fn program_family(word: &str) -> &str {
    let name = program_name(word);
    match name.trim_end_matches(|c: char| c.is_ascii_digit() || c == '.' || c == '-') {
        "" => name,
        family => family,
    }
}

/// Whether `words` (a program and at most a subcommand) may be a prefix
/// rule's pattern: the subcommand looks like one, and a `RESTRICTED`
/// program is in one of its `SAFE_FORMS`. Checked when a rule is derived
/// and again when one matches, so a rule stored by an older vak (or
/// written into the rules file or the shared bucket by hand) covers no
/// more than today's would.
fn prefix_allowed(words: &[&str]) -> bool {
    let (program, sub) = match words {
        [program] => (*program, None),
        [program, sub] if subcommand(sub) => (*program, Some(*sub)),
        _ => return false,
    };
    if program.is_empty() || program.contains('=') {
        return false;
    }
    let family = program_family(program);
    let restricted = RESTRICTED.contains(&family)
        || RESTRICTED.contains(&program_name(program))
        || family.starts_with("python");
    !restricted || sub.is_some_and(|sub| SAFE_FORMS.contains(&(family, sub)))
}

/// What a bash rule made from `command` covers (see the module docs).
fn bash_candidate(command: &str) -> Candidate {
    let command = as_run(command);
    let exact = Candidate {
        tool: "bash".into(),
        kind: RuleKind::Exact,
        pattern: command.to_string(),
    };
    let Some(words) = simple_words(command) else {
        return exact;
    };
    let take = if words.len() > 1 && subcommand(words[1]) {
        2
    } else {
        1
    };
    if !prefix_allowed(&words[..take]) || !words[take..].iter().all(|w| plain_word(w)) {
        return exact;
    }
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
            (!as_run(command).is_empty()).then(|| bash_candidate(command))
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
    list: List,
    /// With `--bus`: the shared bucket, which holds the list instead.
    shared: Option<Arc<SharedConfig>>,
    /// Where every change runs, one at a time, from reading the list to
    /// swapping it (the write itself on a blocking thread; readers never
    /// wait on it).
    file: FileOwner<RulesFile>,
}

type List = Arc<RwLock<Arc<Vec<Rule>>>>;

/// What the owner of the rules file holds: where the list is kept, and the
/// live list it swaps once a change is stored.
struct RulesFile {
    dir: PathBuf,
    name: String,
    workspace: String,
    list: List,
    shared: Option<Arc<SharedConfig>>,
}

impl Rules {
    /// Reads the workspace's rules file (blocking: call it at startup). A
    /// missing file is no rules; an unreadable or malformed one is logged
    /// and treated as none, and is replaced by the next change.
    pub fn load(home: &Path, workspace: &Path) -> Rules {
        let (workspace, key) = crate::home::workspace_key(workspace);
        let rules = Rules::new(home.join("permissions"), format!("{key}.json"), workspace, None);
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
        Rules::new(home.join("permissions"), key, workspace, Some(shared))
    }

    fn new(dir: PathBuf, name: String, workspace: String, shared: Option<Arc<SharedConfig>>) -> Rules {
        let list: List = Arc::new(RwLock::new(Arc::new(Vec::new())));
        let file = RulesFile {
            dir: dir.clone(),
            name: name.clone(),
            workspace: workspace.clone(),
            list: list.clone(),
            shared: shared.clone(),
        };
        Rules {
            dir,
            name,
            workspace,
            list,
            shared,
            file: FileOwner::new("the rules file", file),
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
        self.file.change(|f| Box::pin(f.add(c))).await?
    }

    /// Deletes the rule `id`; the rule deleted. NotFound for an unknown id.
    pub async fn delete(&self, id: &str) -> Result<Rule> {
        super::hub::validate_plain_id("rule id", id)?;
        let id = id.to_string();
        self.file.change(|f| Box::pin(f.delete(id))).await?
    }
}

impl RulesFile {
    fn list(&self) -> Arc<Vec<Rule>> {
        self.list.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// `Rules::add` on the owner's task.
    async fn add(&mut self, c: Candidate) -> Result<(Rule, bool)> {
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

    /// `Rules::delete` on the owner's task.
    async fn delete(&mut self, id: String) -> Result<Rule> {
        if let Some(shared) = &self.shared {
            return shared
                .change_rules(&self.name, &self.workspace, |list| deleted(list, &id))
                .await;
        }
        let (next, gone) = deleted(&self.list(), &id)?;
        if let Some(next) = next {
            self.store(next).await?;
        }
        Ok(gone)
    }

    /// Writes `next` to the file, then makes it the live list (on the owner's task).
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

    fn covers(c: &Candidate, cmd: &str) -> bool {
        c.covers("bash", &json!({ "command": cmd }))
    }

    #[test]
    fn simple_commands_with_plain_words_become_program_and_subcommand_prefixes() {
        for (cmd, prefix) in [
            ("cargo test lib", "cargo test"),
            ("cargo test", "cargo test"),
            ("ls", "ls"),
            ("ls Cargo.toml", "ls"),
            ("  cargo   build ", "cargo build"),
            ("./run.sh fast", "./run.sh fast"),
            ("rg foo src", "rg foo"),
            ("git status", "git status"),
            ("git log main", "git log"),
            ("/usr/bin/git log", "/usr/bin/git log"),
            ("pip3 list", "pip3 list"),
        ] {
            let c = bash(cmd);
            assert_eq!((c.kind, c.pattern.as_str()), (RuleKind::Prefix, prefix), "{cmd}");
        }
        let c = bash("cargo test lib");
        assert!(covers(&c, "cargo test"));
        assert!(covers(&c, "cargo test rules modes"));
        assert!(!covers(&c, "cargo testify"));
        assert!(!covers(&c, "cargo build"));
        assert!(!c.covers("write_file", &json!({ "command": "cargo test" })));
    }

    /// Each bypass the audit found: an `always` on the first command stored
    /// a prefix that covered the second, which writes a file or runs code.
    #[test]
    fn a_rule_never_covers_options_paths_or_assignments_it_was_not_given() {
        for (approved, kind, pattern, bypasses) in [
            (
                "git log --oneline",
                RuleKind::Exact,
                "git log --oneline",
                &[
                    "git log --output=/outside/file --format=x",
                    "git log --oneline --output=x",
                ][..],
            ),
            (
                "curl -s http://127.0.0.1:9/",
                RuleKind::Exact,
                "curl -s http://127.0.0.1:9/",
                &["curl -o /outside/file http://127.0.0.1:9/", "curl example.com"][..],
            ),
            (
                "tar -tf x.tar",
                RuleKind::Exact,
                "tar -tf x.tar",
                &["tar -xf x.tar --to-command=sh", "tar xf x.tar"][..],
            ),
            (
                "busybox sh -c ls",
                RuleKind::Exact,
                "busybox sh -c ls",
                &["busybox sh -c id", "busybox sh evil", "busybox sh"][..],
            ),
            (
                "cargo test",
                RuleKind::Prefix,
                "cargo test",
                &[
                    "cargo test --config=build.rustc-wrapper=x",
                    "cargo test --manifest-path=/etc/x",
                    "cargo test -p x",
                    "cargo test ../x",
                    "cargo test ~/x",
                    "cargo test .hidden",
                    "cargo test a=b",
                    "cargo test -- --nocapture",
                ][..],
            ),
        ] {
            let c = bash(approved);
            assert_eq!((c.kind, c.pattern.as_str()), (kind, pattern), "{approved}");
            assert!(covers(&c, approved), "{approved}");
            for b in bypasses {
                assert!(!covers(&c, b), "{approved} covers {b}");
            }
        }
        // Options, paths and `=` after the subcommand make the rule exact.
        for cmd in [
            "ls -la",
            "cargo test --lib",
            "rg -n foo src",
            "cat src/main.rs",
            "cat ./x",
            "cat .env",
            "mytool run key=value",
            "git status --porcelain",
        ] {
            assert_eq!(bash(cmd).kind, RuleKind::Exact, "{cmd}");
        }
        // Restricted programs outside their safe forms are exact, whatever follows.
        for cmd in [
            "git diff",
            "git show HEAD",
            "git config core.pager less",
            "git",
            "curl example.com",
            "wget example.com",
            "tar tf x.tar",
            "make",
            "make test",
            "npm run build",
            "npm install left-pad",
            "pip install requests",
            "pip3.12 install requests",
            "cargo run",
            "cargo install ripgrep",
            "apt-get install x",
            "busybox ls",
            "python3.12 x",
            "/usr/local/bin/node x",
            "cp a b",
            "kill 1",
            "docker run x",
        ] {
            let c = bash(cmd);
            assert_eq!((c.kind, c.pattern.as_str()), (RuleKind::Exact, cmd), "{cmd}");
        }
        // A prefix rule stored by an older vak (or put in the rules file by
        // hand) on a restricted program covers nothing now; `git log`, a
        // safe form, covers plain words only.
        let old = |pattern: &str| Candidate {
            tool: "bash".into(),
            kind: RuleKind::Prefix,
            pattern: pattern.into(),
        };
        for (pattern, cmd) in [
            ("curl", "curl example.com"),
            ("tar", "tar xf x.tar"),
            ("busybox sh", "busybox sh evil"),
            ("make", "make deploy"),
            ("ls -la", "ls -la"),
            ("ls src extra", "ls src extra"),
        ] {
            assert!(!covers(&old(pattern), cmd), "{pattern} covers {cmd}");
        }
        assert!(covers(&old("git log"), "git log main"));
        assert!(!covers(&old("git log"), "git log --output=/x"));
    }

    #[test]
    fn whitespace_bash_does_not_ignore_is_part_of_the_command() {
        // The blanks bash ignores around a command are trimmed...
        let ls = bash("ls");
        assert!(covers(&ls, " ls\t\n"));
        let exact = bash("ls -la");
        assert!(covers(&exact, "\tls -la \n"));
        // ...any other whitespace is a part of a word to the shell: another program.
        for cmd in [
            "\u{2003}ls",
            "ls\u{00a0}",
            "\u{a0}ls -la",
            "ls -la\u{2003}",
            "ls\r",
            "ls -la\r",
        ] {
            assert!(!covers(&ls, cmd), "{cmd:?}");
            assert!(!covers(&exact, cmd), "{cmd:?}");
        }
        // Approving such a command stores it byte for byte, and it covers only itself.
        let odd = bash("ls\u{00a0}");
        assert_eq!((odd.kind, odd.pattern.as_str()), (RuleKind::Exact, "ls\u{00a0}"));
        assert!(covers(&odd, "ls\u{00a0}"));
        assert!(!covers(&odd, "ls"));
        let odd = bash("\u{2003}ls");
        assert_eq!((odd.kind, odd.pattern.as_str()), (RuleKind::Exact, "\u{2003}ls"));
        assert!(!covers(&odd, "ls"));
        assert_eq!(candidate("bash", &json!({ "command": " \t\n" })), None);
        assert!(candidate("bash", &json!({ "command": "\u{2003}" })).is_some());
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
        let (r, new) = rules.add(bash("cargo test lib")).await.unwrap();
        assert!(new && r.id.starts_with("rule_"));
        let (again, new) = rules.add(bash("cargo test")).await.unwrap();
        assert!(!new && again.id == r.id, "the same rule is not stored twice");
        assert!(rules
            .allowing("bash", &json!({"command": "cargo test quick"}))
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
