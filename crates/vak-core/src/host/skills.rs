//! Learned skills: proposals made when a run repeats what an earlier one did (or when a person asks), screened against the promoted skills, and promoted to `.vak/skills/<name>.md` (or the home's `skills/` for every workspace), where every session's model finds them as `skill__<name>` tools.
//!
//! Proposals and the runs they are matched against live in memory and in
//! `<home>/skills/proposals.json`, written by a thread of its own after each
//! change (never under a lock). A promoted skill is a file; listing reads the
//! two folders, bounded.

use crate::error::{Error, Result};
use crate::log::transcript::{Role, Transcript};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex, MutexGuard};

mod files;
pub use files::{list, read_skill, Scope, Skill, MAX_SKILLS};

const FILE: &str = "proposals.json";
/// The most proposals kept (pending, promoted and rejected together).
pub const MAX_PROPOSALS: usize = 100;
/// The most earlier runs remembered to match a new one against.
pub const MAX_SEEN: usize = 256;
/// The longest body a proposal takes from a run, in bytes.
pub const MAX_BODY: usize = 16 * 1024;
/// Word overlap (Jaccard) from which a proposal is a near-copy of a skill.
pub const SIMILAR: f64 = 0.8;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SkillKind {
    /// A prompt the model follows.
    Prompt,
    /// Shell commands run as one bash call.
    Script,
}

impl SkillKind {
    pub fn as_str(self) -> &'static str {
        match self {
            SkillKind::Prompt => "prompt",
            SkillKind::Script => "script",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProposalState {
    Pending,
    Promoted,
    Rejected,
}

/// Where a proposal came from.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Origin {
    pub session: String,
    pub seqs: Vec<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Proposal {
    pub id: String,
    pub name: String,
    pub description: String,
    pub body: String,
    pub kind: SkillKind,
    pub source: Origin,
    /// The promoted skill this one nearly copies, screened when made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duplicate_of: Option<String>,
    /// `duplicate-of:<name>` when it has one.
    #[serde(default)]
    pub tags: Vec<String>,
    pub state: ProposalState,
    pub created_at: String,
    /// What it was made from, so the same shape is proposed once.
    #[serde(default)]
    key: String,
    /// The workspace whose run it came from.
    #[serde(default)]
    pub workspace: String,
}

/// What a finished run did, as a proposal is made from it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunShape {
    pub session: String,
    pub workspace: String,
    /// The run's prompts (user messages), in order.
    pub prompts: Vec<(u64, String)>,
    /// Its tool calls: (seq, tool, bash command or the input as JSON).
    pub calls: Vec<(u64, String, String)>,
}

impl RunShape {
    /// What a completed run did, from its transcript messages with from < seq
    /// <= upto: its prompts and, when every call succeeded, its tool calls
    /// (update_plan, bookkeeping, left out). A run with a failed call gives
    /// nothing to match.
    pub fn from_transcript(session: &str, workspace: &str, t: &Transcript, from: u64, upto: u64) -> RunShape {
        let mut shape = RunShape {
            session: session.to_string(),
            workspace: workspace.to_string(),
            ..RunShape::default()
        };
        for m in t.messages.iter().filter(|m| m.seq > from && m.seq <= upto) {
            match m.role {
                Role::User => shape.prompts.push((m.seq, m.text.clone())),
                Role::Tool if m.tool == crate::commitment::UPDATE_PLAN => {}
                Role::Tool if !m.ok => return RunShape::default(),
                Role::Tool => {
                    let subject = match m.input.get("command").and_then(Value::as_str) {
                        Some(c) if m.tool == "bash" => c.to_string(),
                        _ => m.input.to_string(),
                    };
                    shape.calls.push((m.seq, m.tool.clone(), subject));
                }
                _ => {}
            }
        }
        shape
    }

    /// The same shape is the same tool sequence (tools and commands), or,
    /// with no tool call, the same prompt.
    fn key(&self) -> Option<String> {
        if !self.calls.is_empty() {
            let parts: Vec<String> = self
                .calls
                .iter()
                .map(|(_, t, s)| format!("{t}\u{1f}{s}"))
                .collect();
            return Some(format!("calls:{}", parts.join("\u{1e}")));
        }
        let prompt = self.prompts.first()?.1.trim();
        (!prompt.is_empty()).then(|| format!("prompt:{prompt}"))
    }

    fn seqs(&self) -> Vec<u64> {
        let mut s: Vec<u64> = self
            .prompts
            .iter()
            .map(|p| p.0)
            .chain(self.calls.iter().map(|c| c.0))
            .collect();
        s.sort_unstable();
        s
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct Seen {
    key: String,
    workspace: String,
}

#[derive(Default, Serialize, Deserialize)]
struct State {
    proposals: Vec<Proposal>,
    seen: VecDeque<Seen>,
    #[serde(skip)]
    generation: u64,
    #[serde(skip)]
    saved: u64,
}

/// What the skills thread does.
enum Job {
    /// Write the proposals file if anything changed.
    Save,
    /// A finished run to match against the earlier ones (`observe`).
    Observe(RunShape),
}

/// Runs queued for the thread beyond which a finished run is not matched
/// (its shape is dropped, with a warning: a proposal missed, nothing else).
const QUEUE: usize = 64;

/// The proposals of a home, and where promoted skills go.
pub struct Skills {
    home: PathBuf,
    state: Arc<Mutex<State>>,
    /// None in the thread's own copy: it saves directly, and holds no
    /// sender, so the channel closes (and the thread ends) with the handle.
    tx: Option<SyncSender<Job>>,
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn now() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
}

/// A skill name: 1 to 48 of a-z 0-9 -, not starting or ending with -.
pub fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 48
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "invalid skill name {:?}: 1 to 48 of a-z 0-9 -, not starting or ending with -",
            name.chars().take(60).collect::<String>()
        )))
    }
}

/// A name made from text: its first words, lowercase, joined by `-`.
fn name_from(text: &str) -> String {
    let words: Vec<String> = text
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .take(4)
        .map(str::to_lowercase)
        .collect();
    let mut name = words.join("-");
    name.truncate(40);
    let name = name.trim_matches('-').to_string();
    if name.is_empty() {
        "skill".into()
    } else {
        name
    }
}

fn words(text: &str) -> std::collections::HashSet<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect()
}

/// Jaccard overlap of the two texts' word sets (lowercase words): shared
/// words over all words; two empty texts are the same.
pub fn similarity(a: &str, b: &str) -> f64 {
    let (a, b) = (words(a), words(b));
    let union = a.union(&b).count();
    if union == 0 {
        return 1.0;
    }
    a.intersection(&b).count() as f64 / union as f64
}

fn cap(text: &str, max: usize) -> String {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

/// A proposal's content made from what a run did: a script when every call
/// was a bash command, else a prompt (the run's prompts).
fn draft(shape: &RunShape, name: Option<&str>) -> Option<(String, String, String, SkillKind)> {
    let all_bash = !shape.calls.is_empty() && shape.calls.iter().all(|(_, t, _)| t == "bash");
    let (kind, body) = if all_bash {
        let lines: Vec<&str> = shape.calls.iter().map(|(_, _, c)| c.as_str()).collect();
        (SkillKind::Script, lines.join("\n"))
    } else {
        let prompts: Vec<&str> = shape.prompts.iter().map(|(_, p)| p.as_str()).collect();
        if prompts.is_empty() {
            return None;
        }
        (SkillKind::Prompt, prompts.join("\n"))
    };
    let body = cap(&body, MAX_BODY);
    let first = body.lines().next().unwrap_or_default();
    let name = name.map_or_else(|| name_from(first), str::to_string);
    let description = match kind {
        SkillKind::Script => format!("runs: {}", cap(first, 120)),
        SkillKind::Prompt => cap(first, 160),
    };
    Some((name, description, body, kind))
}

impl Skills {
    /// Loads `<home>/skills/proposals.json` (missing or unreadable: empty,
    /// with a warning) and starts the thread that writes it. Blocking: startup.
    pub fn open(home: &Path, persist: bool) -> Skills {
        let dir = home.join("skills");
        let mut st = State::default();
        if persist {
            match read_capped(&dir.join(FILE)) {
                Ok(body) => match serde_json::from_slice::<State>(&body) {
                    Ok(s) => st = s,
                    Err(e) => tracing::warn!(
                        "starting with no skill proposals: {} is corrupt: {e}",
                        dir.join(FILE).display()
                    ),
                },
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => tracing::warn!(
                    "starting with no skill proposals: cannot read {}: {e}",
                    dir.join(FILE).display()
                ),
            }
        }
        let state = Arc::new(Mutex::new(st));
        let (tx, rx) = sync_channel(QUEUE);
        let worker = Skills {
            home: home.to_path_buf(),
            state: state.clone(),
            tx: None,
        };
        let spawned = std::thread::Builder::new()
            .name("vak-skills".into())
            .spawn(move || worker.run(&dir, persist, rx));
        if let Err(e) = spawned {
            tracing::error!("skills are not proposed or saved: cannot start their thread: {e}");
        }
        Skills {
            home: home.to_path_buf(),
            state,
            tx: Some(tx),
        }
    }

    fn changed(&self) {
        if let Some(tx) = &self.tx {
            let _ = tx.try_send(Job::Save);
        }
    }

    /// Queues a finished run to be matched on the skills thread (never waits).
    pub fn observe_later(&self, shape: RunShape) {
        let Some(tx) = &self.tx else { return };
        if let Err(std::sync::mpsc::TrySendError::Full(_)) = tx.try_send(Job::Observe(shape)) {
            tracing::warn!("the skills queue is full: a finished run is not matched against earlier ones");
        }
    }

    /// The thread: matches runs and writes the file (when `persist`).
    fn run(&self, dir: &Path, persist: bool, rx: Receiver<Job>) {
        while let Ok(job) = rx.recv() {
            match job {
                Job::Observe(shape) => {
                    if let Some(p) = self.observe(&shape) {
                        tracing::info!(proposal = %p.id, name = %p.name, "a skill is proposed: a run repeated an earlier one");
                    }
                    if persist {
                        save(dir, &self.state);
                    }
                }
                Job::Save if persist => save(dir, &self.state),
                Job::Save => {}
            }
        }
    }

    /// Screens `body` against the skills promoted for `workspace`.
    fn screen(&self, workspace: &Path, name: &str, body: &str) -> Option<String> {
        let skills = files::list(&self.home, workspace).ok()?;
        skills
            .into_iter()
            .find(|s| s.name == name || similarity(&s.body, body) >= SIMILAR)
            .map(|s| s.name)
    }

    /// A finished run: proposed when an earlier run of the same workspace
    /// had the same shape, once per shape. Reads the promoted skills to
    /// screen it (small, bounded files): call it off the runtime's workers.
    pub fn observe(&self, shape: &RunShape) -> Option<Proposal> {
        let key = shape.key()?;
        let repeated = {
            let mut st = lock(&self.state);
            let known = st
                .proposals
                .iter()
                .any(|p| p.key == key && p.workspace == shape.workspace);
            let repeated = st
                .seen
                .iter()
                .any(|s| s.key == key && s.workspace == shape.workspace);
            if !repeated {
                if st.seen.len() == MAX_SEEN {
                    st.seen.pop_front();
                }
                st.seen.push_back(Seen {
                    key: key.clone(),
                    workspace: shape.workspace.clone(),
                });
                st.generation += 1;
            }
            repeated && !known
        };
        if !repeated {
            self.changed();
            return None;
        }
        let p = self.make(shape, None, key)?;
        Some(p)
    }

    /// A proposal a person asked for, from what `shape` holds.
    pub fn propose(&self, shape: &RunShape, name: Option<&str>) -> Result<Proposal> {
        if let Some(n) = name {
            check_name(n)?;
        }
        let key = format!("asked:{}:{}", shape.session, uuid::Uuid::new_v4().simple());
        self.make(shape, name, key).ok_or_else(|| {
            Error::invalid("nothing to make a skill of: the range holds no prompt and no tool call")
        })
    }

    fn make(&self, shape: &RunShape, name: Option<&str>, key: String) -> Option<Proposal> {
        let (name, description, body, kind) = draft(shape, name)?;
        let duplicate_of = self.screen(Path::new(&shape.workspace), &name, &body);
        let p = Proposal {
            id: format!("sp_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]),
            name,
            description,
            body,
            kind,
            source: Origin {
                session: shape.session.clone(),
                seqs: shape.seqs(),
            },
            tags: duplicate_of.iter().map(|d| format!("duplicate-of:{d}")).collect(),
            duplicate_of,
            state: ProposalState::Pending,
            created_at: now(),
            key,
            workspace: shape.workspace.clone(),
        };
        {
            let mut st = lock(&self.state);
            if st.proposals.len() == MAX_PROPOSALS {
                // The oldest settled one goes first, else the oldest.
                let at = st
                    .proposals
                    .iter()
                    .position(|p| p.state != ProposalState::Pending)
                    .unwrap_or(0);
                st.proposals.remove(at);
            }
            st.proposals.push(p.clone());
            st.generation += 1;
        }
        self.changed();
        Some(p)
    }

    /// Every kept proposal, oldest first.
    pub fn proposals(&self) -> Vec<Proposal> {
        lock(&self.state).proposals.clone()
    }

    fn pending(&self, id: &str) -> Result<Proposal> {
        let st = lock(&self.state);
        let p = st
            .proposals
            .iter()
            .find(|p| p.id == id)
            .ok_or_else(|| Error::not_found(format!("no skill proposal {id}")))?;
        if p.state != ProposalState::Pending {
            return Err(Error::conflict(format!(
                "skill proposal {id} was already {}",
                match p.state {
                    ProposalState::Promoted => "promoted",
                    _ => "rejected",
                }
            ))
            .with_reason("proposal_settled"));
        }
        Ok(p.clone())
    }

    fn settle(&self, id: &str, state: ProposalState) {
        let mut st = lock(&self.state);
        if let Some(p) = st.proposals.iter_mut().find(|p| p.id == id) {
            p.state = state;
        }
        st.generation += 1;
        drop(st);
        self.changed();
    }

    /// Writes the proposal as a skill file (`name` instead of its own when
    /// given) in the `.vak/skills/` of the workspace it came from or, for
    /// `Scope::Global`, the home's `skills/`; refuses a name a skill there
    /// already has (Conflict `skill_exists`). Blocking.
    pub fn promote(&self, id: &str, scope: Scope, name: Option<&str>) -> Result<Skill> {
        let p = self.pending(id)?;
        let workspace = Path::new(&p.workspace);
        let name = name.unwrap_or(&p.name);
        check_name(name)?;
        let skill = Skill {
            name: name.to_string(),
            description: p.description.clone(),
            kind: p.kind,
            body: p.body.clone(),
            scope,
            path: files::dir(&self.home, workspace, scope).join(format!("{name}.md")),
        };
        files::write(&skill, workspace)?;
        self.settle(id, ProposalState::Promoted);
        Ok(skill)
    }

    pub fn reject(&self, id: &str) -> Result<Proposal> {
        let mut p = self.pending(id)?;
        self.settle(id, ProposalState::Rejected);
        p.state = ProposalState::Rejected;
        Ok(p)
    }

    /// The skills promoted for `workspace` (its own, then the home's). Blocking.
    pub fn list(&self, workspace: &Path) -> Result<Vec<Skill>> {
        files::list(&self.home, workspace)
    }
}

/// More than `MAX_PROPOSALS` proposals and `MAX_SEEN` runs ever take.
const MAX_FILE: u64 = 8 << 20;

/// The proposals file, refused past `MAX_FILE` (it is not ours then).
fn read_capped(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut body = Vec::new();
    std::fs::File::open(path)?
        .take(MAX_FILE + 1)
        .read_to_end(&mut body)?;
    if body.len() as u64 > MAX_FILE {
        return Err(std::io::Error::other(format!("it is over {MAX_FILE} bytes")));
    }
    Ok(body)
}

fn save(dir: &Path, state: &Mutex<State>) {
    let (body, generation) = {
        let st = lock(state);
        if st.generation == st.saved {
            return;
        }
        (serde_json::to_vec(&*st), st.generation)
    };
    let written = body.map_err(std::io::Error::other).and_then(|b| {
        crate::home::create_private_dir(dir)?;
        let temp = dir.join("proposals.json.tmp");
        crate::host::index::write_replace(&temp, &dir.join(FILE), &b)
    });
    match written {
        Ok(()) => {
            let mut st = lock(state);
            st.saved = st.saved.max(generation);
        }
        Err(e) => tracing::warn!("cannot save the skill proposals: {e}"),
    }
}

#[cfg(test)]
mod tests;
