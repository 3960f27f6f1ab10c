//! Always-allow rules: a tool and a pattern a user approved for good, kept per workspace in the home, so later matching calls run without asking (`rule.rs` says what a rule covers).
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

use crate::cluster::shared_config::SharedConfig;
use crate::error::{Error, ErrorKind, Result};
use crate::file_owner::FileOwner;
pub use crate::rule::*;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

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
        crate::ids::validate_plain_id("rule id", id)?;
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
