//! What an always-allow rule is and what it covers: a tool and a pattern a user approved for good (`rules.rs` keeps them per workspace).
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

use super::tools::{self, ToolClass};
use super::workspace;
use serde::{Deserialize, Serialize};
use serde_json::Value;

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
    /// An MCP tool (`mcp__<server>__<tool>`): every call of it; the pattern
    /// is the tool's name.
    Tool,
}

impl RuleKind {
    pub fn as_str(self) -> &'static str {
        match self {
            RuleKind::Prefix => "prefix",
            RuleKind::Exact => "exact",
            RuleKind::Path => "path",
            RuleKind::Tool => "tool",
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
            RuleKind::Tool => self.pattern == tool && crate::mcp::names::server_of(tool).is_some(),
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
            RuleKind::Tool => format!("{} (every call)", self.tool),
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
        ToolClass::Exec if crate::mcp::names::server_of(tool).is_some() => Some(Candidate {
            tool: tool.to_string(),
            kind: RuleKind::Tool,
            pattern: tool.to_string(),
        }),
        ToolClass::Edit => Some(Candidate {
            tool: tool.to_string(),
            kind: RuleKind::Path,
            pattern: normal_path(input.get("path").and_then(Value::as_str)?)?,
        }),
        _ => None,
    }
}
