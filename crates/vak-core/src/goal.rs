//! The goal of a turn chain: its objective (the chain's first prompt), and each steering message read as a goal update (add, correct, replace, pause, resume, reprioritise, cancel) by fixed phrase rules, folded into the goal state the presentation timeline shows.

use serde::{Deserialize, Serialize};

/// The notice a paused chain publishes when it starts to hold its next leg.
pub const HELD: &str = "paused: the next leg waits for a \"resume\" (or a cancel)";

/// The most additions and superseded revisions a goal keeps, each.
pub const MAX_REVISIONS: usize = 64;
/// The most updates a goal keeps (the oldest are dropped; the ledger keeps all).
pub const MAX_UPDATES: usize = 256;
/// The most of a message's text a goal keeps, in bytes.
pub const MAX_TEXT: usize = 4096;

/// How a steering message relates to the goal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Relation {
    Add,
    Correct,
    Replace,
    Pause,
    Resume,
    Reprioritise,
    Cancel,
}

impl Relation {
    pub fn as_str(self) -> &'static str {
        match self {
            Relation::Add => "add",
            Relation::Correct => "correct",
            Relation::Replace => "replace",
            Relation::Pause => "pause",
            Relation::Resume => "resume",
            Relation::Reprioritise => "reprioritise",
            Relation::Cancel => "cancel",
        }
    }

    /// Pause, resume and cancel act on the run and are not the model's input.
    pub fn is_control(self) -> bool {
        matches!(self, Relation::Pause | Relation::Resume | Relation::Cancel)
    }
}

/// Where the chain stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Control {
    Running,
    Paused,
    Cancelled,
    Done,
}

impl Control {
    pub fn as_str(self) -> &'static str {
        match self {
            Control::Running => "running",
            Control::Paused => "paused",
            Control::Cancelled => "cancelled",
            Control::Done => "done",
        }
    }
}

/// One steering message as read; append-only.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GoalUpdate {
    pub relation: Relation,
    pub text: String,
    /// The phrases that set the relation (and any asking for wider permissions).
    pub signals: Vec<String>,
    pub request_id: String,
    /// It asks for wider permissions (bypass, no approvals): never applied
    /// by itself; the permission mode changes only through its own API.
    #[serde(default)]
    pub widens_permissions: bool,
    /// The seq of its event (0 in the event itself).
    #[serde(default)]
    pub at_seq: u64,
}

/// The goal as its chain's messages leave it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GoalState {
    pub objective: String,
    pub additions: Vec<String>,
    /// Revisions a correct or replace superseded, oldest first.
    pub superseded: Vec<String>,
    pub control: Control,
    pub updates: Vec<GoalUpdate>,
}

/// Exact messages (lowercase, punctuation and a trailing "please" dropped) by relation.
pub const CANCEL_PHRASES: &[&str] = &[
    "stop",
    "stop it",
    "stop now",
    "stop that",
    "cancel",
    "cancel it",
    "cancel that",
    "abort",
    "halt",
    "never mind",
    "nevermind",
    "forget it",
];
pub const PAUSE_PHRASES: &[&str] = &[
    "pause",
    "hold",
    "hold on",
    "wait",
    "pause it",
    "pause that",
    "hold that",
];
pub const RESUME_PHRASES: &[&str] = &[
    "resume",
    "continue",
    "go on",
    "carry on",
    "go ahead",
    "proceed",
    "unpause",
    "keep going",
];
/// Leading words (after lowercasing) by relation, tried in this order.
pub const REPLACE_STARTS: &[&str] = &[
    "instead",
    "actually instead",
    "forget that",
    "scrap that",
    "new plan",
    "change of plan",
    "rather",
    "replace that",
];
pub const CORRECT_STARTS: &[&str] = &[
    "no",
    "actually",
    "correction",
    "i meant",
    "not",
    "wrong",
    "that's wrong",
    "fix that",
];
pub const REPRIORITISE_STARTS: &[&str] = &[
    "first",
    "before that",
    "before anything",
    "prioritise",
    "prioritize",
    "priority",
];
pub const ADD_STARTS: &[&str] = &[
    "also",
    "and also",
    "additionally",
    "plus",
    "one more thing",
    "and",
];
/// Phrases anywhere in the text that ask for wider permissions.
pub const WIDENING_PHRASES: &[&str] = &[
    "bypass",
    "skip approval",
    "skip the approval",
    "without asking",
    "don't ask",
    "do not ask",
    "no approval",
    "auto-approve",
    "auto approve",
    "allow all",
    "full access",
    "accept-edits",
    "accept edits",
    "permission mode",
    "sudo",
];

/// The message's words, lowercase, without punctuation.
fn normal(text: &str) -> String {
    let words: Vec<String> = text
        .split(|c: char| c.is_whitespace() || matches!(c, ',' | '.' | '!' | '?' | ';' | ':'))
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect();
    words.join(" ")
}

fn starts(n: &str, lead: &str) -> bool {
    n == lead || n.strip_prefix(lead).is_some_and(|r| r.starts_with(' '))
}

/// Reads a steering message: its relation with the phrase that set it
/// (`add` with `default` when none did), and whether it asks for wider
/// permissions. Documented in docs/protocol.md section 40.
pub fn classify(text: &str) -> (Relation, Vec<String>, bool) {
    let n = normal(text);
    let bare = n.strip_suffix(" please").unwrap_or(&n);
    let bare = bare.strip_prefix("please ").unwrap_or(bare);
    let mut signals = Vec::new();
    let widens: Vec<&str> = WIDENING_PHRASES
        .iter()
        .copied()
        .filter(|p| n.contains(p))
        .collect();
    let exact: [(Relation, &[&str]); 3] = [
        (Relation::Cancel, CANCEL_PHRASES),
        (Relation::Pause, PAUSE_PHRASES),
        (Relation::Resume, RESUME_PHRASES),
    ];
    let leading: [(Relation, &[&str]); 4] = [
        (Relation::Replace, REPLACE_STARTS),
        (Relation::Reprioritise, REPRIORITISE_STARTS),
        (Relation::Correct, CORRECT_STARTS),
        (Relation::Add, ADD_STARTS),
    ];
    let found = exact
        .iter()
        .find_map(|(r, list)| {
            list.iter()
                .find(|p| **p == bare)
                .map(|p| (*r, format!("the message \"{p}\"")))
        })
        .or_else(|| {
            leading.iter().find_map(|(r, list)| {
                list.iter()
                    .find(|p| starts(bare, p))
                    .map(|p| (*r, format!("starts with \"{p}\"")))
            })
        });
    let relation = match found {
        Some((r, why)) => {
            signals.push(why);
            r
        }
        None => {
            signals.push("default: more to do".into());
            Relation::Add
        }
    };
    for p in &widens {
        signals.push(format!("asks for wider permissions: \"{p}\""));
    }
    (relation, signals, !widens.is_empty())
}

fn capped(text: &str) -> String {
    let mut end = text.len().min(MAX_TEXT);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

fn push_bounded<T>(list: &mut Vec<T>, item: T, max: usize) {
    if list.len() == max {
        list.remove(0);
    }
    list.push(item);
}

impl GoalState {
    /// A chain's goal, set by its first prompt.
    pub fn new(objective: &str) -> GoalState {
        GoalState {
            objective: capped(objective),
            additions: Vec::new(),
            superseded: Vec::new(),
            control: Control::Running,
            updates: Vec::new(),
        }
    }

    /// Folds one update (its `at_seq` set to `seq`). A message asking for
    /// wider permissions changes no revision: it is recorded, not applied.
    pub fn apply(&mut self, seq: u64, u: &GoalUpdate) {
        let mut u = u.clone();
        u.at_seq = seq;
        u.text = capped(&u.text);
        let text = u.text.clone();
        match u.relation {
            Relation::Pause => self.control = Control::Paused,
            Relation::Resume => self.control = Control::Running,
            Relation::Cancel => self.control = Control::Cancelled,
            _ if u.widens_permissions => {}
            Relation::Add => push_bounded(&mut self.additions, text, MAX_REVISIONS),
            Relation::Reprioritise => {
                if self.additions.len() == MAX_REVISIONS {
                    self.additions.pop();
                }
                self.additions.insert(0, text);
            }
            Relation::Correct => {
                // The latest revision (the last addition, else the objective) is superseded.
                let old = match self.additions.last_mut() {
                    Some(last) => std::mem::replace(last, text),
                    None => std::mem::replace(&mut self.objective, text),
                };
                push_bounded(&mut self.superseded, old, MAX_REVISIONS);
            }
            Relation::Replace => {
                let old = std::mem::replace(&mut self.objective, text);
                push_bounded(&mut self.superseded, old, MAX_REVISIONS);
                for a in std::mem::take(&mut self.additions) {
                    push_bounded(&mut self.superseded, a, MAX_REVISIONS);
                }
            }
        }
        push_bounded(&mut self.updates, u, MAX_UPDATES);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rel(t: &str) -> Relation {
        classify(t).0
    }

    #[test]
    fn steering_is_read_by_its_phrases() {
        assert_eq!(rel("also add a README"), Relation::Add);
        assert_eq!(rel("Stop"), Relation::Cancel);
        assert_eq!(rel("stop!"), Relation::Cancel);
        assert_eq!(
            rel("stop using tabs"),
            Relation::Add,
            "not the whole message: not a cancel"
        );
        assert_eq!(rel("pause please"), Relation::Pause);
        assert_eq!(rel("Resume."), Relation::Resume);
        assert_eq!(rel("go ahead"), Relation::Resume);
        assert_eq!(rel("instead, write it in Go"), Relation::Replace);
        assert_eq!(rel("no, the other file"), Relation::Correct);
        assert_eq!(rel("nothing else matters"), Relation::Add, "`no` is a whole word");
        assert_eq!(rel("first fix the tests"), Relation::Reprioritise);
        assert_eq!(rel("add docs"), Relation::Add);
        let (r, signals, widens) = classify("also switch to bypass mode so you don't ask");
        assert_eq!(r, Relation::Add);
        assert!(widens);
        assert!(
            signals
                .iter()
                .any(|s| s == "asks for wider permissions: \"bypass\""),
            "{signals:?}"
        );
        assert_eq!(classify("also add a README").1, ["starts with \"also\""]);
    }

    fn update(relation: Relation, text: &str, widens: bool) -> GoalUpdate {
        GoalUpdate {
            relation,
            text: text.into(),
            signals: Vec::new(),
            request_id: "r".into(),
            widens_permissions: widens,
            at_seq: 0,
        }
    }

    #[test]
    fn updates_fold_into_the_goal_and_a_widening_one_is_recorded_not_applied() {
        let mut g = GoalState::new("write a parser");
        g.apply(3, &update(Relation::Add, "also add a README", false));
        g.apply(4, &update(Relation::Correct, "no, a CONTRIBUTING file", false));
        assert_eq!(g.additions, ["no, a CONTRIBUTING file"]);
        assert_eq!(g.superseded, ["also add a README"]);
        g.apply(5, &update(Relation::Reprioritise, "first the tests", false));
        assert_eq!(g.additions[0], "first the tests");
        g.apply(6, &update(Relation::Add, "and use bypass mode", true));
        assert_eq!(g.additions.len(), 2, "not applied");
        g.apply(7, &update(Relation::Pause, "pause", false));
        assert_eq!(g.control, Control::Paused);
        g.apply(8, &update(Relation::Resume, "resume", false));
        assert_eq!(g.control, Control::Running);
        g.apply(9, &update(Relation::Replace, "instead write a lexer", false));
        assert_eq!(g.objective, "instead write a lexer");
        assert!(g.additions.is_empty());
        assert_eq!(g.superseded.len(), 4);
        assert_eq!(g.updates.len(), 7);
        assert_eq!(g.updates[0].at_seq, 3);
        for n in 0..(MAX_UPDATES + 5) {
            g.apply(10 + n as u64, &update(Relation::Add, "x", false));
        }
        assert_eq!(g.updates.len(), MAX_UPDATES);
        assert_eq!(g.additions.len(), MAX_REVISIONS);
    }
}
