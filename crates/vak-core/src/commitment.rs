//! Commitments: the plan items the model keeps with `update_plan`, what a `fulfilled` close must be able to cite, and the order a scheduler would work the open ones in (with the reasons).
//!
//! A commitment lives in its session's ledger as `commitment` events, each
//! carrying the commitment's whole state after the change; `log/plan.rs`
//! folds them (and the tool calls they cite) and checks evidence. Its id is
//! `<session id>.<item id>`, so any surface can find its session from it.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::time::{Duration, SystemTime};

/// The plan tool's name.
pub const UPDATE_PLAN: &str = "update_plan";
/// The most items one update_plan call may carry.
pub const MAX_ITEMS: usize = 64;
/// The most commitments one session keeps; past it update_plan refuses new ones.
pub const MAX_COMMITMENTS: usize = 256;
/// The longest item text, in bytes.
pub const MAX_TEXT: usize = 1024;
/// The most tool calls one commitment may cite.
pub const MAX_EVIDENCE: usize = 32;
/// The most requirements one commitment may carry.
pub const MAX_REQUIRES: usize = 8;
/// The longest requirement pattern or path, in bytes.
pub const MAX_PATTERN: usize = 256;
/// The longest closing note, in bytes.
pub const MAX_NOTE: usize = 4096;

/// Where the model says an item stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PlanStatus {
    Pending,
    InProgress,
    Done,
    Dropped,
}

impl PlanStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            PlanStatus::Pending => "pending",
            PlanStatus::InProgress => "in_progress",
            PlanStatus::Done => "done",
            PlanStatus::Dropped => "dropped",
        }
    }
}

/// How a commitment was closed (`POST /commitments/:id/close`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Done, and the cited evidence shows it: refused without that evidence.
    Fulfilled,
    Abandoned,
    Superseded,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Fulfilled => "fulfilled",
            Verdict::Abandoned => "abandoned",
            Verdict::Superseded => "superseded",
        }
    }

    pub fn parse(s: &str) -> Option<Verdict> {
        match s {
            "fulfilled" => Some(Verdict::Fulfilled),
            "abandoned" => Some(Verdict::Abandoned),
            "superseded" => Some(Verdict::Superseded),
            _ => None,
        }
    }
}

/// How much is at stake if a commitment goes wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stakes {
    Low,
    Medium,
    High,
}

impl Stakes {
    pub fn as_str(self) -> &'static str {
        match self {
            Stakes::Low => "low",
            Stakes::Medium => "medium",
            Stakes::High => "high",
        }
    }

    pub fn parse(s: &str) -> Option<Stakes> {
        match s {
            "low" => Some(Stakes::Low),
            "medium" => Some(Stakes::Medium),
            "high" => Some(Stakes::High),
            _ => None,
        }
    }
}

/// Words that make work high or low stakes, matched as whole lowercase
/// words (a prefix for the ones ending in `*`). Fixed and documented
/// (docs/protocol.md, "Commitments"): the reading costs nothing and says why.
pub const HIGH_STAKES_WORDS: &[&str] = &[
    "delete*",
    "remove*",
    "rm",
    "drop*",
    "destroy*",
    "wipe*",
    "erase*",
    "purge*",
    "truncate*",
    "overwrite*",
    "reset",
    "force",
    "deploy*",
    "release*",
    "publish*",
    "production",
    "prod",
    "migrat*",
    "secret*",
    "credential*",
    "password*",
    "token*",
    "key",
    "keys",
    "billing",
    "payment*",
    "irreversibl*",
];
pub const LOW_STAKES_WORDS: &[&str] = &[
    "readme",
    "docs",
    "doc",
    "documentation",
    "comment*",
    "typo*",
    "format*",
    "lint*",
    "explain*",
    "read",
    "list",
    "show",
    "summar*",
    "look",
];

/// The stakes a text reads as, with the words that set them: any high-stakes
/// word makes it high, else any low-stakes word low, else medium.
pub fn stakes_of(text: &str) -> (Stakes, Vec<String>) {
    let words: Vec<String> = text
        .split(|c: char| !c.is_alphanumeric() && c != '-' && c != '_')
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect();
    let hits = |list: &[&str]| -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for w in &words {
            let hit = list.iter().any(|p| match p.strip_suffix('*') {
                Some(prefix) => w.starts_with(prefix),
                None => w == p,
            });
            if hit && !out.contains(w) {
                out.push(w.clone());
            }
        }
        out
    };
    let high = hits(HIGH_STAKES_WORDS);
    if !high.is_empty() {
        return (Stakes::High, high);
    }
    let low = hits(LOW_STAKES_WORDS);
    if !low.is_empty() {
        return (Stakes::Low, low);
    }
    (Stakes::Medium, Vec::new())
}

/// Evidence a `fulfilled` close needs: each must be met by a tool call the
/// commitment cites.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Requirement {
    /// A cited call ended successfully; with `tool`, a call of that tool;
    /// with `pattern`, one whose command (bash) or input (other tools, as
    /// JSON) matches that regular expression.
    ToolOk {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tool: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pattern: Option<String>,
    },
    /// A cited write_file or edit_file call wrote `path` and succeeded.
    FileChanged { path: String },
    /// A cited call ran because a person approved it.
    Approval,
}

impl Requirement {
    pub fn kind(&self) -> &'static str {
        match self {
            Requirement::ToolOk { .. } => "tool_ok",
            Requirement::FileChanged { .. } => "file_changed",
            Requirement::Approval => "approval",
        }
    }

    /// The requirement in words (what a 409 names when it is missing).
    pub fn describe(&self) -> String {
        match self {
            Requirement::ToolOk { tool, pattern } => {
                let mut s = String::from("tool_ok: a cited ");
                match tool {
                    Some(t) => s.push_str(&format!("`{t}` call")),
                    None => s.push_str("tool call"),
                }
                s.push_str(" that ended successfully");
                if let Some(p) = pattern {
                    s.push_str(&format!(" matching /{p}/"));
                }
                s
            }
            Requirement::FileChanged { path } => format!("file_changed: a cited successful write of {path}"),
            Requirement::Approval => "approval: a cited call a person approved".into(),
        }
    }

    fn check(&self) -> Result<(), String> {
        let long = |what: &str, s: &str| {
            if s.is_empty() || s.len() > MAX_PATTERN {
                Err(format!("a requirement's {what} must be 1 to {MAX_PATTERN} bytes"))
            } else {
                Ok(())
            }
        };
        match self {
            Requirement::ToolOk { tool, pattern } => {
                if let Some(t) = tool {
                    long("tool", t)?;
                }
                if let Some(p) = pattern {
                    long("pattern", p)?;
                    compile(p)?;
                }
                Ok(())
            }
            Requirement::FileChanged { path } => long("path", path),
            Requirement::Approval => Ok(()),
        }
    }
}

/// A requirement's pattern as a bounded regular expression.
pub(crate) fn compile(pattern: &str) -> Result<regex::Regex, String> {
    regex::RegexBuilder::new(pattern)
        .size_limit(1 << 20)
        .build()
        .map_err(|e| format!("a requirement's pattern is not a regular expression: {e}"))
}

/// How a commitment event changed it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Change {
    Created,
    Updated,
    Closed,
}

impl Change {
    pub fn as_str(self) -> &'static str {
        match self {
            Change::Created => "created",
            Change::Updated => "updated",
            Change::Closed => "closed",
        }
    }
}

/// A closed commitment's closure.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Closure {
    pub verdict: Verdict,
    #[serde(default)]
    pub note: String,
    pub at: String,
}

/// One commitment as its events leave it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Commitment {
    /// `<session id>.<item>`.
    pub id: String,
    /// The item's id within its session's plan (the model's, or the next number).
    pub item: String,
    pub session_id: String,
    pub text: String,
    pub status: PlanStatus,
    /// Tool call ids cited as evidence, in the order first cited.
    #[serde(default)]
    pub evidence: Vec<String>,
    #[serde(default)]
    pub requires: Vec<Requirement>,
    pub stakes: Stakes,
    /// RFC 3339, when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub due: Option<String>,
    /// Items of the same plan that must be done first.
    #[serde(default)]
    pub blocked_by: Vec<String>,
    pub created_at: String,
    pub updated_at: String,
    /// The seq of the event that created it (its natural order).
    #[serde(default)]
    pub created_seq: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub closed: Option<Closure>,
}

impl Commitment {
    /// Open: not closed, and not done or dropped by the model.
    pub fn is_open(&self) -> bool {
        self.closed.is_none() && matches!(self.status, PlanStatus::Pending | PlanStatus::InProgress)
    }
}

/// Applies a commitment event's state `new` to `old`, the state before it:
/// a closed commitment stays as it was closed (the first close wins) and
/// citations only accumulate, so an update planned before a close landed
/// cannot undo it. Its creation stays the first event's.
pub fn merge(old: &mut Commitment, new: &Commitment) {
    let mut evidence = std::mem::take(&mut old.evidence);
    for e in &new.evidence {
        if !evidence.contains(e) {
            evidence.push(e.clone());
        }
    }
    if old.closed.is_none() {
        let created = (old.created_seq, std::mem::take(&mut old.created_at));
        *old = new.clone();
        (old.created_seq, old.created_at) = created;
    }
    old.evidence = evidence;
}

/// `<session>.<item>` split; None when it is not that shape.
pub fn split_id(id: &str) -> Option<(&str, &str)> {
    let (s, i) = id.split_once('.')?;
    (crate::ids::validate_session_id(s).is_ok() && crate::ids::validate_plain_id("item", i).is_ok())
        .then_some((s, i))
}

/// One item of an update_plan call, checked.
#[derive(Clone, Debug, PartialEq)]
pub struct ItemInput {
    pub id: Option<String>,
    pub text: Option<String>,
    pub status: PlanStatus,
    pub evidence: Vec<String>,
    pub requires: Option<Vec<Requirement>>,
    pub stakes: Option<Stakes>,
    pub due: Option<String>,
    pub blocked_by: Option<Vec<String>>,
}

/// Reads update_plan's input: `{items: [{id?, text, status, evidence?,
/// requires?, stakes?, due?, blocked_by?}]}`, every bound checked.
pub fn parse_items(input: &Value) -> Result<Vec<ItemInput>, String> {
    let Some(items) = input.get("items").and_then(Value::as_array) else {
        return Err("update_plan needs `items`, an array".into());
    };
    if items.is_empty() {
        return Err("update_plan needs at least one item".into());
    }
    if items.len() > MAX_ITEMS {
        return Err(format!(
            "update_plan takes at most {MAX_ITEMS} items, got {}",
            items.len()
        ));
    }
    items
        .iter()
        .enumerate()
        .map(|(n, item)| parse_item(item).map_err(|e| format!("item {}: {e}", n + 1)))
        .collect()
}

fn parse_item(item: &Value) -> Result<ItemInput, String> {
    let Some(obj) = item.as_object() else {
        return Err("an item is an object".into());
    };
    const KNOWN: &[&str] = &[
        "id",
        "text",
        "status",
        "evidence",
        "requires",
        "stakes",
        "due",
        "blocked_by",
    ];
    if let Some(k) = obj.keys().find(|k| !KNOWN.contains(&k.as_str())) {
        return Err(format!("unknown field `{k}`"));
    }
    let string = |k: &str| -> Result<Option<String>, String> {
        match obj.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(format!("`{k}` must be a string")),
        }
    };
    let id = string("id")?;
    if let Some(id) = &id {
        crate::ids::validate_plain_id("item id", id).map_err(|e| e.message)?;
    }
    let text = string("text")?;
    if let Some(t) = &text {
        if t.trim().is_empty() || t.len() > MAX_TEXT {
            return Err(format!("`text` must be 1 to {MAX_TEXT} bytes and not blank"));
        }
    }
    let status = match string("status")?.as_deref() {
        Some("pending") => PlanStatus::Pending,
        Some("in_progress") => PlanStatus::InProgress,
        Some("done") => PlanStatus::Done,
        Some("dropped") => PlanStatus::Dropped,
        Some(other) => {
            return Err(format!(
                "`status` {other:?} is not pending, in_progress, done or dropped"
            ))
        }
        None => return Err("`status` is required: pending, in_progress, done or dropped".into()),
    };
    let strings = |k: &str, max: usize| -> Result<Option<Vec<String>>, String> {
        match obj.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Array(a)) if a.len() <= max => a
                .iter()
                .map(|v| match v.as_str() {
                    Some(s) if !s.is_empty() && s.len() <= 128 => Ok(s.to_string()),
                    _ => Err(format!("`{k}` holds strings of 1 to 128 bytes")),
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some(_) => Err(format!("`{k}` must be an array of at most {max} strings")),
        }
    };
    let evidence = strings("evidence", MAX_EVIDENCE)?.unwrap_or_default();
    let blocked_by = strings("blocked_by", MAX_ITEMS)?;
    let requires = match obj.get("requires") {
        None | Some(Value::Null) => None,
        Some(Value::Array(a)) if a.len() <= MAX_REQUIRES => {
            let rs = a
                .iter()
                .map(|r| {
                    serde_json::from_value::<Requirement>(r.clone()).map_err(|e| {
                        format!("a requirement is {{kind: tool_ok|file_changed|approval, ...}}: {e}")
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            for r in &rs {
                r.check()?;
            }
            Some(rs)
        }
        Some(_) => return Err(format!("`requires` must be an array of at most {MAX_REQUIRES}")),
    };
    let stakes = match string("stakes")? {
        None => None,
        Some(s) => {
            Some(Stakes::parse(&s).ok_or_else(|| format!("`stakes` {s:?} is not low, medium or high"))?)
        }
    };
    let due = string("due")?;
    if let Some(d) = &due {
        humantime::parse_rfc3339_weak(d).map_err(|_| format!("`due` {d:?} is not an RFC 3339 time"))?;
    }
    Ok(ItemInput {
        id,
        text,
        status,
        evidence,
        requires,
        stakes,
        due,
        blocked_by,
    })
}

/// One commitment's place in the order a scheduler would work the open ones.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Priority {
    pub id: String,
    pub score: i64,
    pub reasons: Vec<String>,
}

/// Score points; docs/protocol.md ("Commitments") gives the same table.
const STAKES_POINTS: [(Stakes, i64); 3] = [(Stakes::High, 30), (Stakes::Medium, 20), (Stakes::Low, 10)];
/// One point per full hour open, up to a day.
const MAX_AGE_POINTS: i64 = 24;
const OVERDUE_POINTS: i64 = 40;
const DUE_SOON_POINTS: i64 = 20;
const DUE_SOON: Duration = Duration::from_secs(24 * 3600);
const IN_PROGRESS_POINTS: i64 = 5;
/// Blocked work cannot be worked: it ranks below everything that can.
const BLOCKED_POINTS: i64 = -100;

/// The open commitments of `rows`, highest score first (ties: natural
/// order), each with the reasons for its score. `rows` itself is not reordered.
pub fn priorities(rows: &[Commitment], now: SystemTime) -> Vec<Priority> {
    let mut out: Vec<(usize, Priority)> = Vec::new();
    for (n, c) in rows.iter().enumerate().filter(|(_, c)| c.is_open()) {
        let mut score = 0;
        let mut reasons = Vec::new();
        let stakes = STAKES_POINTS
            .iter()
            .find(|(s, _)| *s == c.stakes)
            .map_or(0, |(_, p)| *p);
        score += stakes;
        reasons.push(format!("stakes: {} (+{stakes})", c.stakes.as_str()));
        let age = humantime::parse_rfc3339_weak(&c.created_at)
            .ok()
            .and_then(|t| now.duration_since(t).ok())
            .unwrap_or_default();
        let hours = (age.as_secs() / 3600) as i64;
        if hours > 0 {
            let points = hours.min(MAX_AGE_POINTS);
            score += points;
            reasons.push(format!("age: open {hours} h (+{points})"));
        }
        if let Some(due) = c
            .due
            .as_deref()
            .and_then(|d| humantime::parse_rfc3339_weak(d).ok())
        {
            match due.duration_since(now) {
                Err(_) => {
                    score += OVERDUE_POINTS;
                    reasons.push(format!("due: overdue (+{OVERDUE_POINTS})"));
                }
                Ok(left) if left <= DUE_SOON => {
                    score += DUE_SOON_POINTS;
                    reasons.push(format!("due: within 24 h (+{DUE_SOON_POINTS})"));
                }
                Ok(_) => {}
            }
        }
        if c.status == PlanStatus::InProgress {
            score += IN_PROGRESS_POINTS;
            reasons.push(format!("in progress (+{IN_PROGRESS_POINTS})"));
        }
        let blockers: Vec<&str> = c
            .blocked_by
            .iter()
            .filter(|b| {
                rows.iter()
                    .any(|o| o.session_id == c.session_id && &o.item == *b && o.is_open())
            })
            .map(String::as_str)
            .collect();
        if !blockers.is_empty() {
            score += BLOCKED_POINTS;
            reasons.push(format!("blocked by {} ({BLOCKED_POINTS})", blockers.join(", ")));
        }
        out.push((
            n,
            Priority {
                id: c.id.clone(),
                score,
                reasons,
            },
        ));
    }
    out.sort_by(|(na, a), (nb, b)| b.score.cmp(&a.score).then(na.cmp(nb)));
    out.into_iter().map(|(_, p)| p).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn row(item: &str, stakes: Stakes, created_at: &str) -> Commitment {
        Commitment {
            id: format!("s.{item}"),
            item: item.into(),
            session_id: "s".into(),
            text: item.into(),
            status: PlanStatus::Pending,
            evidence: Vec::new(),
            requires: Vec::new(),
            stakes,
            due: None,
            blocked_by: Vec::new(),
            created_at: created_at.into(),
            updated_at: created_at.into(),
            created_seq: 0,
            closed: None,
        }
    }

    #[test]
    fn a_blocked_item_ranks_last_and_an_old_high_stakes_one_first_with_reasons() {
        let now = humantime::parse_rfc3339("2026-12-05T12:00:00Z").unwrap();
        let mut rows = vec![
            row("fresh", Stakes::Medium, "2026-12-05T12:00:00Z"),
            row("blocked", Stakes::High, "2026-12-05T11:00:00Z"),
            row("old", Stakes::High, "2026-12-04T00:00:00Z"),
            row("done", Stakes::High, "2026-12-01T00:00:00Z"),
        ];
        rows[1].blocked_by = vec!["fresh".into()];
        rows[3].status = PlanStatus::Done;
        let p = priorities(&rows, now);
        let ids: Vec<&str> = p.iter().map(|p| p.id.as_str()).collect();
        assert_eq!(
            ids,
            ["s.old", "s.fresh", "s.blocked"],
            "done items are not ranked"
        );
        assert_eq!(p[0].score, 30 + 24);
        assert!(
            p[0].reasons.iter().any(|r| r == "age: open 36 h (+24)"),
            "{:?}",
            p[0].reasons
        );
        assert!(p[0].reasons.iter().any(|r| r == "stakes: high (+30)"));
        assert!(
            p[2].reasons.iter().any(|r| r == "blocked by fresh (-100)"),
            "{:?}",
            p[2].reasons
        );
        // Once its blocker is done it is not blocked any more.
        rows[0].status = PlanStatus::Done;
        let p = priorities(&rows, now);
        assert_eq!(p[1].id, "s.blocked", "{p:?}");
        assert_eq!(p[1].score, 31);
        assert!(!p[1].reasons.iter().any(|r| r.starts_with("blocked")));
    }

    #[test]
    fn due_dates_raise_the_score() {
        let now = humantime::parse_rfc3339("2026-12-05T12:00:00Z").unwrap();
        let mut a = row("a", Stakes::Low, "2026-12-05T12:00:00Z");
        a.due = Some("2026-12-05T11:00:00Z".into());
        let mut b = row("b", Stakes::Low, "2026-12-05T12:00:00Z");
        b.due = Some("2026-12-05T18:00:00Z".into());
        let mut c = row("c", Stakes::Low, "2026-12-05T12:00:00Z");
        c.due = Some("2026-12-09T18:00:00Z".into());
        let p = priorities(&[c, b, a], now);
        let scored: Vec<(&str, i64)> = p.iter().map(|p| (p.id.as_str(), p.score)).collect();
        assert_eq!(scored, [("s.a", 50), ("s.b", 30), ("s.c", 10)]);
    }

    #[test]
    fn stakes_are_read_from_whole_words() {
        assert_eq!(
            stakes_of("delete the build folder"),
            (Stakes::High, vec!["delete".into()])
        );
        assert_eq!(stakes_of("Fix a typo in the README").0, Stakes::Low);
        assert_eq!(stakes_of("add a test for the parser").0, Stakes::Medium);
        assert_eq!(
            stakes_of("keyboard shortcuts").0,
            Stakes::Medium,
            "`key` is a whole word"
        );
        assert_eq!(stakes_of("deploying to prod, then the docs").0, Stakes::High);
    }

    #[test]
    fn update_plan_input_is_checked_with_clear_errors() {
        let ok = parse_items(&json!({"items": [
            {"text": "run the tests", "status": "pending",
             "requires": [{"kind": "tool_ok", "tool": "bash", "pattern": "cargo test"}, {"kind": "approval"}]},
            {"id": "t2", "status": "done", "evidence": ["call_1"]}
        ]}))
        .unwrap();
        assert_eq!(ok.len(), 2);
        assert_eq!(ok[0].requires.as_ref().unwrap().len(), 2);
        assert_eq!(ok[1].id.as_deref(), Some("t2"));
        let bad = |v: Value| parse_items(&v).unwrap_err();
        assert!(bad(json!({})).contains("`items`"));
        assert!(bad(json!({"items": []})).contains("at least one"));
        assert!(bad(json!({"items": [{"text": "x"}]})).contains("`status` is required"));
        assert!(bad(json!({"items": [{"text": "x", "status": "later"}]})).contains("\"later\""));
        assert!(bad(json!({"items": [{"text": "x", "status": "done", "colour": 1}]})).contains("`colour`"));
        assert!(bad(json!({"items": [{"id": "a/b", "text": "x", "status": "done"}]})).contains("item id"));
        let req = bad(
            json!({"items": [{"text": "x", "status": "done", "requires": [{"kind": "tool_ok", "pattern": "("}]}]}),
        );
        assert!(req.contains("not a regular expression"), "{req}");
        assert!(
            bad(json!({"items": [{"text": "x", "status": "done", "requires": [{"kind": "vibes"}]}]}))
                .contains("kind")
        );
        assert!(
            bad(json!({"items": [{"text": "x", "status": "done", "due": "tomorrow"}]})).contains("RFC 3339")
        );
        let many: Vec<Value> = (0..=MAX_ITEMS)
            .map(|_| json!({"text": "x", "status": "pending"}))
            .collect();
        assert!(bad(json!({ "items": many })).contains("at most"));
    }

    #[test]
    fn ids_split_into_session_and_item() {
        assert_eq!(split_id("s-1.t2"), Some(("s-1", "t2")));
        assert_eq!(split_id("s-1"), None);
        assert_eq!(split_id("a/b.c"), None);
        assert_eq!(split_id("s.c.d"), None);
    }
}
