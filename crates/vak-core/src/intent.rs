//! Reading a prompt without running it: what it asks (act, horizon, stakes, evidence, each with the signals that set it), the engagement that implies under the workspace's `[intent]` policy, and how that differs from the unrestricted baseline. Deterministic word rules, no model call.

use crate::commitment::{stakes_of, Stakes};
use crate::permissions::{decide, Decision, PermissionMode};
use crate::tools::{self, ToolClass};
use serde::Deserialize;

/// The longest prompt read, in bytes (a composer sends what is typed so far).
pub const MAX_PROMPT: usize = 64 * 1024;

/// What a prompt asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Act {
    Ask,
    Change,
    Run,
    Plan,
    Review,
}

impl Act {
    pub const ALL: [Act; 5] = [Act::Ask, Act::Change, Act::Run, Act::Plan, Act::Review];

    pub fn as_str(self) -> &'static str {
        match self {
            Act::Ask => "ask",
            Act::Change => "change",
            Act::Run => "run",
            Act::Plan => "plan",
            Act::Review => "review",
        }
    }

    pub fn parse(s: &str) -> Option<Act> {
        Act::ALL.into_iter().find(|a| a.as_str() == s)
    }
}

/// When the work is meant to happen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Horizon {
    Now,
    Session,
    Scheduled,
}

impl Horizon {
    pub fn as_str(self) -> &'static str {
        match self {
            Horizon::Now => "now",
            Horizon::Session => "session",
            Horizon::Scheduled => "scheduled",
        }
    }

    pub fn parse(s: &str) -> Option<Horizon> {
        [Horizon::Now, Horizon::Session, Horizon::Scheduled]
            .into_iter()
            .find(|h| h.as_str() == s)
    }
}

/// Where the prompt is typed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Surface {
    Api,
    App,
    Term,
    Ide,
    /// A scheduled task's prompt.
    Task,
}

impl Surface {
    pub fn as_str(self) -> &'static str {
        match self {
            Surface::Api => "api",
            Surface::App => "app",
            Surface::Term => "term",
            Surface::Ide => "ide",
            Surface::Task => "task",
        }
    }

    pub fn parse(s: &str) -> Option<Surface> {
        [
            Surface::Api,
            Surface::App,
            Surface::Term,
            Surface::Ide,
            Surface::Task,
        ]
        .into_iter()
        .find(|x| x.as_str() == s)
    }
}

/// Evidence a commitment for this work would require (`commitment::Requirement`'s kinds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EvidenceKind {
    ToolOk,
    FileChanged,
    Approval,
}

impl EvidenceKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EvidenceKind::ToolOk => "tool_ok",
            EvidenceKind::FileChanged => "file_changed",
            EvidenceKind::Approval => "approval",
        }
    }

    pub fn parse(s: &str) -> Option<EvidenceKind> {
        [
            EvidenceKind::ToolOk,
            EvidenceKind::FileChanged,
            EvidenceKind::Approval,
        ]
        .into_iter()
        .find(|k| k.as_str() == s)
    }
}

/// One thing that set part of the reading.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Signal {
    /// `act`, `horizon`, `stakes` or `evidence`.
    pub field: &'static str,
    pub value: String,
    /// `word "delete"`, `phrase "from now on"`, `a question`, `surface task`, `set by the request`, `default`.
    pub because: String,
}

/// What the caller already knows, which wins over the words.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Given {
    pub act: Option<Act>,
    pub horizon: Option<Horizon>,
    pub stakes: Option<Stakes>,
    pub evidence: Option<Vec<EvidenceKind>>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reading {
    pub act: Act,
    pub horizon: Horizon,
    pub stakes: Stakes,
    pub evidence: Vec<EvidenceKind>,
    pub signals: Vec<Signal>,
}

/// Verbs by act, matched as whole lowercase words (documented in docs/protocol.md section 39).
pub const REVIEW_WORDS: &[&str] = &["review", "audit", "critique", "inspect", "proofread"];
pub const PLAN_WORDS: &[&str] = &[
    "plan",
    "design",
    "outline",
    "propose",
    "architect",
    "strategy",
    "roadmap",
    "sketch",
];
pub const RUN_WORDS: &[&str] = &[
    "run",
    "execute",
    "launch",
    "start",
    "restart",
    "build",
    "compile",
    "test",
    "benchmark",
    "deploy",
    "install",
    "serve",
];
pub const CHANGE_WORDS: &[&str] = &[
    "add",
    "fix",
    "change",
    "edit",
    "write",
    "create",
    "delete",
    "remove",
    "rename",
    "refactor",
    "update",
    "implement",
    "rewrite",
    "move",
    "replace",
    "drop",
    "wipe",
    "clean",
    "format",
    "migrate",
    "upgrade",
    "bump",
    "make",
    "generate",
    "convert",
    "insert",
    "append",
    "modify",
    "patch",
    "revert",
    "erase",
    "purge",
];
/// First words that make a question (unless a polite request: "can you add …").
pub const QUESTION_WORDS: &[&str] = &[
    "what", "why", "how", "where", "when", "who", "which", "is", "are", "does", "do", "did", "explain",
    "describe",
];
/// Leading words of a request put politely; they are skipped.
pub const POLITE: &[&[&str]] = &[
    &["please"],
    &["can", "you"],
    &["could", "you"],
    &["would", "you"],
    &["will", "you"],
];
pub const SCHEDULED_WORDS: &[&str] = &[
    "every",
    "daily",
    "hourly",
    "weekly",
    "nightly",
    "monthly",
    "tomorrow",
    "tonight",
    "schedule",
    "scheduled",
    "cron",
    "remind",
    "later",
];
pub const SESSION_PHRASES: &[&str] = &[
    "from now on",
    "for this session",
    "for the rest of",
    "always",
    "whenever",
    "throughout",
];

fn words(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric() && c != '-' && c != '_' && c != '\'')
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect()
}

/// Reads `prompt` (as typed on `surface`), `given` winning where set.
pub fn read(prompt: &str, surface: Surface, given: &Given) -> Reading {
    let mut signals = Vec::new();
    let mut sig = |field: &'static str, value: &str, because: String| {
        signals.push(Signal {
            field,
            value: value.to_string(),
            because,
        })
    };
    let w = words(prompt);
    let mut rest: &[String] = &w;
    for p in POLITE {
        if rest.len() >= p.len() && rest.iter().zip(p.iter()).all(|(a, b)| a == b) {
            rest = &rest[p.len()..];
        }
    }
    let polite = rest.len() < w.len();
    let act = match given.act {
        Some(a) => {
            sig("act", a.as_str(), "set by the request".into());
            a
        }
        None => {
            let question = !polite
                && (prompt.trim_end().ends_with('?')
                    || rest.first().is_some_and(|f| QUESTION_WORDS.contains(&f.as_str())));
            let lists: [(Act, &[&str]); 4] = [
                (Act::Review, REVIEW_WORDS),
                (Act::Plan, PLAN_WORDS),
                (Act::Run, RUN_WORDS),
                (Act::Change, CHANGE_WORDS),
            ];
            let find = |acts: &[Act]| {
                rest.iter().find_map(|word| {
                    lists
                        .iter()
                        .filter(|(a, _)| acts.contains(a))
                        .find(|(_, list)| list.contains(&word.as_str()))
                        .map(|(a, _)| (*a, word.clone()))
                })
            };
            if question {
                // A question asks, unless it asks for a plan or a review.
                match find(&[Act::Review, Act::Plan]) {
                    Some((a, word)) => {
                        sig("act", a.as_str(), format!("a question with the word \"{word}\""));
                        a
                    }
                    None => {
                        sig("act", "ask", "a question".into());
                        Act::Ask
                    }
                }
            } else {
                match find(&Act::ALL) {
                    Some((a, word)) => {
                        sig("act", a.as_str(), format!("word \"{word}\""));
                        a
                    }
                    None => {
                        sig("act", "ask", "default: no verb of another act".into());
                        Act::Ask
                    }
                }
            }
        }
    };
    let lower = prompt.to_lowercase();
    let horizon = match given.horizon {
        Some(h) => {
            sig("horizon", h.as_str(), "set by the request".into());
            h
        }
        None if surface == Surface::Task => {
            sig("horizon", "scheduled", "surface task".into());
            Horizon::Scheduled
        }
        None => {
            let at_time = w
                .windows(2)
                .find(|p| p[0] == "at" && p[1].chars().next().is_some_and(|c| c.is_ascii_digit()));
            if let Some(word) = w.iter().find(|x| SCHEDULED_WORDS.contains(&x.as_str())) {
                sig("horizon", "scheduled", format!("word \"{word}\""));
                Horizon::Scheduled
            } else if let Some(p) = at_time {
                sig("horizon", "scheduled", format!("phrase \"at {}\"", p[1]));
                Horizon::Scheduled
            } else if let Some(p) = SESSION_PHRASES.iter().find(|p| {
                if p.contains(' ') {
                    lower.contains(*p)
                } else {
                    w.iter().any(|x| x == *p)
                }
            }) {
                sig("horizon", "session", format!("phrase \"{p}\""));
                Horizon::Session
            } else {
                sig("horizon", "now", "default".into());
                Horizon::Now
            }
        }
    };
    let stakes = match given.stakes {
        Some(s) => {
            sig("stakes", s.as_str(), "set by the request".into());
            s
        }
        None => {
            let (s, words) = stakes_of(prompt);
            if words.is_empty() {
                sig(
                    "stakes",
                    s.as_str(),
                    "default: no word of high or low stakes".into(),
                );
            }
            for word in words {
                sig("stakes", s.as_str(), format!("word \"{word}\""));
            }
            s
        }
    };
    let evidence = match &given.evidence {
        Some(e) => {
            for k in e {
                sig("evidence", k.as_str(), "set by the request".into());
            }
            e.clone()
        }
        None => {
            let mut e = Vec::new();
            match act {
                Act::Change => {
                    e.push(EvidenceKind::FileChanged);
                    sig("evidence", "file_changed", "act change".into());
                }
                Act::Run => {
                    e.push(EvidenceKind::ToolOk);
                    sig("evidence", "tool_ok", "act run".into());
                }
                _ => {}
            }
            if stakes == Stakes::High && matches!(act, Act::Change | Act::Run) {
                e.push(EvidenceKind::Approval);
                sig("evidence", "approval", "stakes high".into());
            }
            e
        }
    };
    Reading {
        act,
        horizon,
        stakes,
        evidence,
        signals,
    }
}

/// The `[intent]` and `[commitment]` policy, each value with where it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    /// A high-stakes change or run is held to this mode at most.
    pub high_stakes_mode: PermissionMode,
    /// Acts whose work only reads (plan mode, read tools).
    pub read_only_acts: Vec<Act>,
    /// Stakes from which a change or run is planned first; None: never.
    pub plan_first_at: Option<Stakes>,
    /// Whether a `fulfilled` close of a commitment with no requirements
    /// needs one cited successful call.
    pub require_evidence: bool,
    /// By key (`intent.high_stakes_mode`, …): `default` or `file`.
    pub sources: Vec<(&'static str, PolicySource)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PolicySource {
    Default,
    /// `<home>/config.toml`.
    File,
}

impl PolicySource {
    pub fn as_str(self) -> &'static str {
        match self {
            PolicySource::Default => "default",
            PolicySource::File => "file",
        }
    }
}

impl Default for Policy {
    fn default() -> Policy {
        Policy {
            high_stakes_mode: PermissionMode::Default,
            read_only_acts: vec![Act::Ask, Act::Review, Act::Plan],
            plan_first_at: Some(Stakes::High),
            require_evidence: true,
            sources: KEYS.iter().map(|k| (*k, PolicySource::Default)).collect(),
        }
    }
}

const KEYS: [&str; 4] = [
    "intent.high_stakes_mode",
    "intent.read_only_acts",
    "intent.plan_first_at",
    "commitment.require_evidence",
];

/// config.toml's `[intent]`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileIntent {
    pub high_stakes_mode: Option<String>,
    pub read_only_acts: Option<Vec<String>>,
    /// `low`, `medium`, `high` or `never`.
    pub plan_first_at: Option<String>,
}

/// config.toml's `[commitment]`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileCommitment {
    pub require_evidence: Option<bool>,
}

impl Policy {
    /// The defaults with what config.toml sets; an error names the key.
    pub fn from_file(intent: &FileIntent, commitment: &FileCommitment) -> Result<Policy, String> {
        let mut p = Policy::default();
        let mut set = |key: &'static str| {
            if let Some(s) = p.sources.iter_mut().find(|(k, _)| *k == key) {
                s.1 = PolicySource::File;
            }
        };
        let mut high = None;
        if let Some(m) = &intent.high_stakes_mode {
            high = Some(
                PermissionMode::parse(m)
                    .map_err(|_| format!("[intent] high_stakes_mode {m:?} is not a permission mode"))?,
            );
            set("intent.high_stakes_mode");
        }
        let mut acts = None;
        if let Some(list) = &intent.read_only_acts {
            acts = Some(
                list.iter()
                    .map(|a| {
                        Act::parse(a).ok_or_else(|| format!("[intent] read_only_acts: {a:?} is not an act"))
                    })
                    .collect::<Result<Vec<_>, _>>()?,
            );
            set("intent.read_only_acts");
        }
        let mut first = None;
        if let Some(s) = &intent.plan_first_at {
            first = Some(match s.as_str() {
                "never" => None,
                other => Some(Stakes::parse(other).ok_or_else(|| {
                    format!("[intent] plan_first_at {other:?} is not low, medium, high or never")
                })?),
            });
            set("intent.plan_first_at");
        }
        if commitment.require_evidence.is_some() {
            set("commitment.require_evidence");
        }
        if let Some(m) = high {
            p.high_stakes_mode = m;
        }
        if let Some(a) = acts {
            p.read_only_acts = a;
        }
        if let Some(f) = first {
            p.plan_first_at = f;
        }
        if let Some(r) = commitment.require_evidence {
            p.require_evidence = r;
        }
        Ok(p)
    }
}

/// What the reading implies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Engagement {
    pub mode: PermissionMode,
    /// The tools the model would be offered.
    pub tools: Vec<String>,
    /// The offered tools that would ask a person before they run (in
    /// `mode`, and with a plan first also in the mode after it).
    pub approvals: Vec<String>,
    /// The model route, `provider/model`.
    pub route: String,
    pub plan_first: bool,
    pub read_only: bool,
}

/// How strict a mode is: plan, then default, then accept-edits, then bypass.
fn strictness(m: PermissionMode) -> u8 {
    match m {
        PermissionMode::Plan => 3,
        PermissionMode::Default => 2,
        PermissionMode::AcceptEdits => 1,
        PermissionMode::Bypass => 0,
    }
}

fn stricter(a: PermissionMode, b: PermissionMode) -> PermissionMode {
    if strictness(a) >= strictness(b) {
        a
    } else {
        b
    }
}

fn asking(mode: PermissionMode, tools: &[String]) -> Vec<String> {
    tools
        .iter()
        .filter(|t| decide(mode, tools::class(t)) == Decision::Ask)
        .cloned()
        .collect()
}

/// The engagement `r` implies under `policy`, on a server in `mode` with
/// `all_tools` (built-in and MCP) on `route`.
pub fn engage(
    r: &Reading,
    policy: &Policy,
    mode: PermissionMode,
    all_tools: &[String],
    route: &str,
) -> Engagement {
    if policy.read_only_acts.contains(&r.act) {
        let tools: Vec<String> = all_tools
            .iter()
            .filter(|t| {
                matches!(tools::class(t), ToolClass::Read | ToolClass::Track)
                    || (r.act == Act::Plan && tools::class(t) == ToolClass::Plan)
            })
            .cloned()
            .collect();
        return Engagement {
            mode: PermissionMode::Plan,
            approvals: asking(PermissionMode::Plan, &tools),
            tools,
            route: route.to_string(),
            plan_first: r.act == Act::Plan,
            read_only: true,
        };
    }
    let after = if r.stakes == Stakes::High {
        stricter(mode, policy.high_stakes_mode)
    } else {
        mode
    };
    let plan_first = policy.plan_first_at.is_some_and(|at| r.stakes >= at);
    let engaged = if plan_first { PermissionMode::Plan } else { after };
    let tools = all_tools.to_vec();
    let mut approvals = asking(engaged, &tools);
    if plan_first {
        for t in asking(after, &tools) {
            if !approvals.contains(&t) {
                approvals.push(t);
            }
        }
    }
    Engagement {
        mode: engaged,
        approvals,
        tools,
        route: route.to_string(),
        plan_first,
        read_only: false,
    }
}

/// How an engagement differs from the unrestricted baseline: bypass mode,
/// every tool, no plan first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diff {
    /// The engagement's mode, when it is not bypass.
    pub mode: Option<PermissionMode>,
    pub tools_withheld: Vec<String>,
    pub approvals_added: Vec<String>,
    pub plan_first: bool,
}

pub fn diff(e: &Engagement, all_tools: &[String]) -> Diff {
    Diff {
        mode: (e.mode != PermissionMode::Bypass).then_some(e.mode),
        tools_withheld: all_tools
            .iter()
            .filter(|t| !e.tools.contains(t))
            .cloned()
            .collect(),
        // Bypass asks for nothing: every approval is one more.
        approvals_added: e.approvals.clone(),
        plan_first: e.plan_first,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn act(p: &str) -> Act {
        read(p, Surface::Api, &Given::default()).act
    }

    fn all() -> Vec<String> {
        tools::definitions().into_iter().map(|d| d.name).collect()
    }

    #[test]
    fn acts_are_read_from_the_first_verb_and_questions_ask() {
        assert_eq!(act("delete the build folder"), Act::Change);
        assert_eq!(act("run the tests"), Act::Run);
        assert_eq!(act("Please review my diff"), Act::Review);
        assert_eq!(act("what does main.rs do?"), Act::Ask);
        assert_eq!(act("how should we design the cache?"), Act::Plan);
        assert_eq!(
            act("can you add a README"),
            Act::Change,
            "a polite request is not a question"
        );
        assert_eq!(act("add a test, then run it"), Act::Change, "the first verb");
        assert_eq!(act("hello there"), Act::Ask);
        assert_eq!(act(""), Act::Ask);
    }

    #[test]
    fn horizon_and_stakes_have_their_signals_and_the_request_wins() {
        let r = read("run the backup every night at 2", Surface::Api, &Given::default());
        assert_eq!(r.horizon, Horizon::Scheduled);
        assert!(r
            .signals
            .iter()
            .any(|s| s.field == "horizon" && s.because == "word \"every\""));
        let r = read(
            "from now on, format before committing",
            Surface::Api,
            &Given::default(),
        );
        assert_eq!(r.horizon, Horizon::Session);
        assert_eq!(
            read("fix it", Surface::Task, &Given::default()).horizon,
            Horizon::Scheduled
        );
        let r = read("delete the build folder", Surface::Api, &Given::default());
        assert_eq!(r.stakes, Stakes::High);
        assert!(r
            .signals
            .iter()
            .any(|s| s.field == "stakes" && s.because == "word \"delete\""));
        assert_eq!(r.evidence, [EvidenceKind::FileChanged, EvidenceKind::Approval]);
        let given = Given {
            act: Some(Act::Review),
            stakes: Some(Stakes::Low),
            ..Given::default()
        };
        let r = read("delete the build folder", Surface::Api, &given);
        assert_eq!((r.act, r.stakes), (Act::Review, Stakes::Low));
        assert!(r
            .signals
            .iter()
            .any(|s| s.field == "act" && s.because == "set by the request"));
    }

    #[test]
    fn a_high_stakes_change_is_planned_first_and_asks_even_on_a_bypass_server() {
        let r = read("delete the build folder", Surface::Api, &Given::default());
        let e = engage(
            &r,
            &Policy::default(),
            PermissionMode::Bypass,
            &all(),
            "offline/offline",
        );
        assert_eq!(e.mode, PermissionMode::Plan);
        assert!(e.plan_first);
        for t in ["exit_plan_mode", "bash", "write_file", "edit_file"] {
            assert!(e.approvals.contains(&t.to_string()), "{t}: {:?}", e.approvals);
        }
        let d = diff(&e, &all());
        assert_eq!(d.mode, Some(PermissionMode::Plan));
        assert!(d.tools_withheld.is_empty());
        // A question reads only.
        let q = read("what does main.rs do?", Surface::Api, &Given::default());
        let e = engage(&q, &Policy::default(), PermissionMode::Bypass, &all(), "x");
        assert!(e.read_only && e.approvals.is_empty());
        assert!(!e.tools.contains(&"bash".to_string()));
        assert!(diff(&e, &all()).tools_withheld.contains(&"bash".to_string()));
        // A low-stakes change on a bypass server is the baseline.
        let c = read("fix a typo in the docs", Surface::Api, &Given::default());
        let e = engage(&c, &Policy::default(), PermissionMode::Bypass, &all(), "x");
        assert_eq!(
            diff(&e, &all()),
            Diff {
                mode: None,
                tools_withheld: vec![],
                approvals_added: vec![],
                plan_first: false
            }
        );
    }

    #[test]
    fn the_policy_file_sets_values_and_names_their_source() {
        let p = Policy::from_file(
            &FileIntent {
                high_stakes_mode: Some("accept-edits".into()),
                read_only_acts: Some(vec!["ask".into()]),
                plan_first_at: Some("never".into()),
            },
            &FileCommitment {
                require_evidence: Some(false),
            },
        )
        .unwrap();
        assert_eq!(p.high_stakes_mode, PermissionMode::AcceptEdits);
        assert_eq!(p.read_only_acts, [Act::Ask]);
        assert_eq!(p.plan_first_at, None);
        assert!(!p.require_evidence);
        assert!(p.sources.iter().all(|(_, s)| *s == PolicySource::File));
        let bad = |i: FileIntent| Policy::from_file(&i, &FileCommitment::default()).unwrap_err();
        assert!(bad(FileIntent {
            high_stakes_mode: Some("yolo".into()),
            ..Default::default()
        })
        .contains("high_stakes_mode"));
        assert!(bad(FileIntent {
            read_only_acts: Some(vec!["nap".into()]),
            ..Default::default()
        })
        .contains("\"nap\""));
        assert!(bad(FileIntent {
            plan_first_at: Some("huge".into()),
            ..Default::default()
        })
        .contains("plan_first_at"));
    }
}
