//! A session's plan: its commitments as their events leave them, and what the tool calls they may cite did, so an update is planned and a `fulfilled` close checked against the session's own record.

use crate::commitment::{
    self, Change, Closure, Commitment, ItemInput, Requirement, Verdict, MAX_COMMITMENTS, MAX_EVIDENCE,
};
use crate::event::{ApprovalOutcome, ClientEvent};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::{HashMap, VecDeque};
use std::path::{Component, Path};

/// Tool calls remembered for citing; the oldest are forgotten first (a
/// citation of one is then an unknown call).
pub(crate) const REMEMBERED_CALLS: usize = 4096;
/// Approvals awaiting an answer that are remembered (their call ids).
const OPEN_APPROVALS: usize = 1024;
/// A commitment's events kept for `GET /commitments/:id`, the most recent.
pub const HISTORY: usize = 32;
/// The most of a call's command or input kept to match a pattern against.
const SUBJECT: usize = 4096;

/// What a tool call did, as far as evidence goes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct CallFact {
    tool: String,
    /// bash: the command; write_file and edit_file: the path; others: the input as JSON.
    subject: String,
    /// None until its result.
    ok: Option<bool>,
    /// A person approved it.
    approved: bool,
}

/// One commitment event as the ledger holds it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recorded {
    pub seq: u64,
    pub change: Change,
    pub commitment: Commitment,
}

/// The fold.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// Natural order: as created.
    rows: Vec<Commitment>,
    history: HashMap<String, VecDeque<Recorded>>,
    calls: HashMap<String, CallFact>,
    call_order: VecDeque<String>,
    approvals: HashMap<String, String>,
}

/// Why a close was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    NotFound,
    AlreadyClosed(Verdict),
    /// `fulfilled` without the evidence: each missing piece in words, and
    /// what the cited calls were.
    EvidenceMissing {
        missing: Vec<String>,
        cited: Vec<String>,
    },
}

impl Plan {
    pub fn rows(&self) -> &[Commitment] {
        &self.rows
    }

    pub fn get(&self, item: &str) -> Option<&Commitment> {
        self.rows.iter().find(|c| c.item == item)
    }

    pub fn history(&self, item: &str) -> Vec<Recorded> {
        self.history
            .get(item)
            .map(|h| h.iter().cloned().collect())
            .unwrap_or_default()
    }

    pub(crate) fn apply(&mut self, seq: u64, event: &ClientEvent) {
        match event {
            ClientEvent::ToolCall { call_id, tool, input } => {
                if self.call_order.len() == REMEMBERED_CALLS {
                    if let Some(old) = self.call_order.pop_front() {
                        self.calls.remove(&old);
                    }
                }
                self.call_order.push_back(call_id.clone());
                self.calls.insert(
                    call_id.clone(),
                    CallFact {
                        tool: tool.clone(),
                        subject: subject(tool, input),
                        ok: None,
                        approved: false,
                    },
                );
            }
            ClientEvent::ToolResult { call_id, ok, .. } => {
                if let Some(c) = self.calls.get_mut(call_id) {
                    c.ok = Some(*ok);
                }
            }
            ClientEvent::ApprovalRequested {
                request_id, call_id, ..
            } if self.approvals.len() < OPEN_APPROVALS => {
                self.approvals.insert(request_id.clone(), call_id.clone());
            }
            ClientEvent::ApprovalResolved {
                request_id, outcome, ..
            } => {
                if let Some(call) = self.approvals.remove(request_id) {
                    if *outcome == ApprovalOutcome::Approved {
                        if let Some(c) = self.calls.get_mut(&call) {
                            c.approved = true;
                        }
                    }
                }
            }
            ClientEvent::Commitment { change, commitment } => self.fold(seq, *change, commitment),
            _ => {}
        }
    }

    /// Folds one commitment event (`commitment::merge`).
    fn fold(&mut self, seq: u64, change: Change, c: &Commitment) {
        let h = self.history.entry(c.item.clone()).or_default();
        if h.len() == HISTORY {
            h.pop_front();
        }
        h.push_back(Recorded {
            seq,
            change,
            commitment: c.clone(),
        });
        match self.rows.iter_mut().find(|r| r.item == c.item) {
            Some(row) => commitment::merge(row, c),
            None => {
                let mut c = c.clone();
                if c.created_seq == 0 {
                    c.created_seq = seq;
                }
                self.rows.push(c);
            }
        }
    }

    /// The commitment events an update_plan call makes, all or none: an
    /// error names the first item that cannot be applied.
    pub(crate) fn plan_update(
        &self,
        session_id: &str,
        items: Vec<ItemInput>,
        now: &str,
    ) -> Result<Vec<(Change, Commitment)>, String> {
        let mut out: Vec<(Change, Commitment)> = Vec::new();
        let mut taken: Vec<String> = self.rows.iter().map(|r| r.item.clone()).collect();
        // Ids first, so blocked_by may name an item created later in the
        // call. An item without one is numbered by its place: the plan's
        // length plus its position in the call (or the next number free).
        let mut ids = Vec::with_capacity(items.len());
        for (n, item) in items.iter().enumerate() {
            let id = match &item.id {
                Some(id) => id.clone(),
                None => {
                    let mut next = self.rows.len() + n + 1;
                    while taken.contains(&next.to_string()) {
                        next += 1;
                    }
                    next.to_string()
                }
            };
            if ids.contains(&id) {
                return Err(format!("item {id} appears twice in one call"));
            }
            taken.push(id.clone());
            ids.push(id);
        }
        let new = ids.iter().filter(|id| self.get(id).is_none()).count();
        if self.rows.len() + new > MAX_COMMITMENTS {
            return Err(format!(
                "a session keeps at most {MAX_COMMITMENTS} commitments; this call would make {}",
                self.rows.len() + new
            ));
        }
        for (item, id) in items.into_iter().zip(&ids) {
            let known = |b: &String| self.get(b).is_some() || ids.contains(b);
            if let Some(b) = item.blocked_by.iter().flatten().find(|b| !known(b) || *b == id) {
                return Err(format!(
                    "item {id}: blocked_by names {b}, which is not another item of this plan"
                ));
            }
            let (change, c) = match self.get(id) {
                Some(old) => {
                    if let Some(closed) = &old.closed {
                        return Err(format!(
                            "item {id} was closed as {}: a closed commitment does not change",
                            closed.verdict.as_str()
                        ));
                    }
                    let mut c = old.clone();
                    if let Some(t) = item.text {
                        c.text = t;
                    }
                    c.status = item.status;
                    for e in item.evidence {
                        if !c.evidence.contains(&e) {
                            c.evidence.push(e);
                        }
                    }
                    if let Some(r) = item.requires {
                        c.requires = r;
                    }
                    if let Some(s) = item.stakes {
                        c.stakes = s;
                    }
                    if item.due.is_some() {
                        c.due = item.due;
                    }
                    if let Some(b) = item.blocked_by {
                        c.blocked_by = b;
                    }
                    c.updated_at = now.to_string();
                    (Change::Updated, c)
                }
                None => {
                    let Some(text) = item.text else {
                        return Err(format!("item {id} is new: it needs `text`"));
                    };
                    let mut evidence: Vec<String> = Vec::new();
                    for e in item.evidence {
                        if !evidence.contains(&e) {
                            evidence.push(e);
                        }
                    }
                    let stakes = item.stakes.unwrap_or_else(|| commitment::stakes_of(&text).0);
                    (
                        Change::Created,
                        Commitment {
                            id: format!("{session_id}.{id}"),
                            item: id.clone(),
                            session_id: session_id.to_string(),
                            text,
                            status: item.status,
                            evidence,
                            requires: item.requires.unwrap_or_default(),
                            stakes,
                            due: item.due,
                            blocked_by: item.blocked_by.unwrap_or_default(),
                            created_at: now.to_string(),
                            updated_at: now.to_string(),
                            created_seq: 0,
                            closed: None,
                        },
                    )
                }
            };
            if c.evidence.len() > MAX_EVIDENCE {
                return Err(format!(
                    "item {id} would cite {} calls; at most {MAX_EVIDENCE}",
                    c.evidence.len()
                ));
            }
            out.push((change, c));
        }
        Ok(out)
    }

    /// The closed commitment a close makes, or why it is refused.
    /// `require_evidence` (`[commitment]`): whether a commitment with no
    /// requirements needs one cited successful call to be fulfilled.
    pub(crate) fn plan_close(
        &self,
        item: &str,
        verdict: Verdict,
        note: String,
        now: &str,
        require_evidence: bool,
    ) -> Result<Commitment, Refusal> {
        let Some(c) = self.get(item) else {
            return Err(Refusal::NotFound);
        };
        if let Some(closed) = &c.closed {
            return Err(Refusal::AlreadyClosed(closed.verdict));
        }
        if verdict == Verdict::Fulfilled {
            let missing = self.missing(c, require_evidence);
            if !missing.is_empty() {
                return Err(Refusal::EvidenceMissing {
                    missing,
                    cited: self.cited(c),
                });
            }
        }
        let mut c = c.clone();
        c.closed = Some(Closure {
            verdict,
            note,
            at: now.to_string(),
        });
        c.updated_at = now.to_string();
        Ok(c)
    }

    /// Each piece of evidence `c` needs and does not cite, in words: every
    /// requirement some cited call must meet, or, with none, one cited call
    /// that ended successfully (unless `require_evidence` is off).
    pub fn missing(&self, c: &Commitment, require_evidence: bool) -> Vec<String> {
        let cited: Vec<&CallFact> = c.evidence.iter().filter_map(|id| self.calls.get(id)).collect();
        if c.requires.is_empty() {
            return if !require_evidence || cited.iter().any(|f| f.ok == Some(true)) {
                Vec::new()
            } else {
                vec!["tool_ok: at least one cited tool call that ended successfully".into()]
            };
        }
        c.requires
            .iter()
            .filter(|r| !cited.iter().any(|f| meets(f, r)))
            .map(Requirement::describe)
            .collect()
    }

    /// What each cited call was: `id (tool, ok|failed|running|unknown)`.
    fn cited(&self, c: &Commitment) -> Vec<String> {
        c.evidence
            .iter()
            .map(|id| match self.calls.get(id) {
                None => format!("{id} (not a tool call of this session)"),
                Some(f) => {
                    let how = match f.ok {
                        Some(true) => "ended successfully",
                        Some(false) => "failed",
                        None => "has no result yet",
                    };
                    format!("{id} ({} call, {how})", f.tool)
                }
            })
            .collect()
    }

    /// The plan in words for the model: one line per commitment.
    pub(crate) fn describe(&self) -> String {
        let open = self.rows.iter().filter(|c| c.is_open()).count();
        let mut s = format!(
            "plan: {} ({open} open)",
            crate::text::count(self.rows.len(), "commitment")
        );
        for c in &self.rows {
            let state = match &c.closed {
                Some(closed) => format!("closed {}", closed.verdict.as_str()),
                None => c.status.as_str().to_string(),
            };
            s.push_str(&format!("\n- [{}] {state}: {}", c.item, c.text));
            if !c.evidence.is_empty() {
                s.push_str(&format!(" (cites {})", c.evidence.join(", ")));
            }
        }
        s
    }
}

/// Whether the call `f` meets requirement `r`.
fn meets(f: &CallFact, r: &Requirement) -> bool {
    match r {
        Requirement::ToolOk { tool, pattern } => {
            f.ok == Some(true)
                && tool.as_ref().is_none_or(|t| *t == f.tool)
                && pattern
                    .as_ref()
                    .is_none_or(|p| commitment::compile(p).is_ok_and(|re| re.is_match(&f.subject)))
        }
        Requirement::FileChanged { path } => {
            f.ok == Some(true)
                && matches!(f.tool.as_str(), "write_file" | "edit_file")
                && same_path(&f.subject, path)
        }
        Requirement::Approval => f.approved,
    }
}

/// Workspace paths compared by their components (`./a//b` is `a/b`).
fn same_path(a: &str, b: &str) -> bool {
    let parts = |p: &str| -> Vec<String> {
        Path::new(p)
            .components()
            .filter(|c| !matches!(c, Component::CurDir))
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect()
    };
    parts(a) == parts(b)
}

fn subject(tool: &str, input: &Value) -> String {
    let s = match tool {
        "bash" => input
            .get("command")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        "write_file" | "edit_file" => input
            .get("path")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        _ => input.to_string(),
    };
    let mut end = s.len().min(SUBJECT);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commitment::{parse_items, PlanStatus};
    use serde_json::json;

    const NOW: &str = "2026-12-05T12:00:00Z";

    fn call(plan: &mut Plan, seq: u64, id: &str, tool: &str, input: Value, ok: bool) {
        plan.apply(
            seq,
            &ClientEvent::ToolCall {
                call_id: id.into(),
                tool: tool.into(),
                input,
            },
        );
        plan.apply(
            seq + 1,
            &ClientEvent::ToolResult {
                call_id: id.into(),
                ok,
                output: String::new(),
            },
        );
    }

    fn update(plan: &mut Plan, seq: u64, items: Value) -> Result<(), String> {
        let items = parse_items(&json!({ "items": items }))?;
        for (change, c) in plan.plan_update("s", items, NOW)? {
            plan.apply(
                seq,
                &ClientEvent::Commitment {
                    change,
                    commitment: Box::new(c),
                },
            );
        }
        Ok(())
    }

    #[test]
    fn fulfilled_needs_each_requirement_met_by_a_cited_call() {
        let mut p = Plan::default();
        update(
            &mut p,
            1,
            json!([{"text": "tests pass", "status": "pending",
                    "requires": [{"kind": "tool_ok", "tool": "bash", "pattern": "^cargo test"},
                                 {"kind": "file_changed", "path": "README.md"}]}]),
        )
        .unwrap();
        let c = p.get("1").unwrap().clone();
        assert_eq!(c.id, "s.1");
        assert_eq!(c.created_seq, 1);
        let refused = p
            .plan_close("1", Verdict::Fulfilled, String::new(), NOW, true)
            .unwrap_err();
        let Refusal::EvidenceMissing { missing, .. } = refused else {
            panic!("{refused:?}")
        };
        assert_eq!(missing.len(), 2, "{missing:?}");
        assert!(missing[0].contains("`bash`") && missing[0].contains("/^cargo test/"));
        assert!(missing[1].contains("README.md"));
        // A failed run, a run of another command and a write elsewhere are not it.
        call(
            &mut p,
            2,
            "c_fail",
            "bash",
            json!({"command": "cargo test"}),
            false,
        );
        call(
            &mut p,
            4,
            "c_other",
            "bash",
            json!({"command": "echo cargo test"}),
            true,
        );
        call(
            &mut p,
            6,
            "c_w",
            "write_file",
            json!({"path": "./README.md", "content": ""}),
            true,
        );
        update(
            &mut p,
            8,
            json!([{"id": "1", "status": "done", "evidence": ["c_fail", "c_other", "c_w", "nope"]}]),
        )
        .unwrap();
        let Err(Refusal::EvidenceMissing { missing, cited }) =
            p.plan_close("1", Verdict::Fulfilled, String::new(), NOW, true)
        else {
            panic!()
        };
        assert_eq!(missing.len(), 1, "{missing:?}");
        assert!(
            cited.iter().any(|c| c == "c_fail (bash call, failed)"),
            "{cited:?}"
        );
        assert!(
            cited.iter().any(|c| c.starts_with("nope (not a tool call")),
            "{cited:?}"
        );
        call(
            &mut p,
            9,
            "c_ok",
            "bash",
            json!({"command": "cargo test -q"}),
            true,
        );
        update(
            &mut p,
            11,
            json!([{"id": "1", "status": "done", "evidence": ["c_ok"]}]),
        )
        .unwrap();
        assert_eq!(p.get("1").unwrap().evidence.len(), 5, "citations accumulate");
        let closed = p
            .plan_close("1", Verdict::Fulfilled, "ok".into(), NOW, true)
            .unwrap();
        assert_eq!(closed.closed.as_ref().unwrap().verdict, Verdict::Fulfilled);
    }

    #[test]
    fn without_requirements_one_successful_cited_call_is_enough_and_other_verdicts_always_close() {
        let mut p = Plan::default();
        update(
            &mut p,
            1,
            json!([{"text": "a", "status": "pending"}, {"text": "b", "status": "pending"}]),
        )
        .unwrap();
        assert!(matches!(
            p.plan_close("1", Verdict::Fulfilled, String::new(), NOW, true),
            Err(Refusal::EvidenceMissing { .. })
        ));
        let c = p
            .plan_close("2", Verdict::Abandoned, String::new(), NOW, true)
            .unwrap();
        p.apply(
            3,
            &ClientEvent::Commitment {
                change: Change::Closed,
                commitment: Box::new(c),
            },
        );
        assert_eq!(
            p.plan_close("2", Verdict::Superseded, String::new(), NOW, true),
            Err(Refusal::AlreadyClosed(Verdict::Abandoned))
        );
        assert_eq!(
            p.plan_close("9", Verdict::Abandoned, String::new(), NOW, true),
            Err(Refusal::NotFound)
        );
        let e = update(&mut p, 4, json!([{"id": "2", "status": "in_progress"}])).unwrap_err();
        assert!(e.contains("closed as abandoned"), "{e}");
    }

    #[test]
    fn approval_evidence_is_a_cited_call_a_person_approved() {
        let mut p = Plan::default();
        update(
            &mut p,
            1,
            json!([{"text": "ship it", "status": "pending", "requires": [{"kind": "approval"}]}]),
        )
        .unwrap();
        let ask = |rid: &str, call: &str| ClientEvent::ApprovalRequested {
            request_id: rid.into(),
            tool: "bash".into(),
            reason: String::new(),
            input: json!({}),
            call_id: call.into(),
        };
        let resolved = |rid: &str, outcome| ClientEvent::ApprovalResolved {
            request_id: rid.into(),
            outcome,
            reason: String::new(),
        };
        p.apply(
            2,
            &ClientEvent::ToolCall {
                call_id: "d".into(),
                tool: "bash".into(),
                input: json!({}),
            },
        );
        p.apply(3, &ask("ap_d", "d"));
        p.apply(4, &resolved("ap_d", ApprovalOutcome::Denied));
        p.apply(
            5,
            &ClientEvent::ToolCall {
                call_id: "a".into(),
                tool: "bash".into(),
                input: json!({}),
            },
        );
        p.apply(6, &ask("ap_a", "a"));
        p.apply(7, &resolved("ap_a", ApprovalOutcome::Approved));
        update(
            &mut p,
            8,
            json!([{"id": "1", "status": "done", "evidence": ["d"]}]),
        )
        .unwrap();
        assert!(p
            .plan_close("1", Verdict::Fulfilled, String::new(), NOW, true)
            .is_err());
        update(
            &mut p,
            9,
            json!([{"id": "1", "status": "done", "evidence": ["a"]}]),
        )
        .unwrap();
        assert!(p
            .plan_close("1", Verdict::Fulfilled, String::new(), NOW, true)
            .is_ok());
    }

    #[test]
    fn an_update_is_all_or_nothing_and_ids_are_assigned_in_order() {
        let mut p = Plan::default();
        update(&mut p, 1, json!([{"id": "t", "text": "x", "status": "pending"}, {"text": "y", "status": "pending", "blocked_by": ["t"]}])).unwrap();
        assert_eq!(
            p.rows().iter().map(|r| r.item.as_str()).collect::<Vec<_>>(),
            ["t", "2"]
        );
        let e = update(
            &mut p,
            2,
            json!([{"id": "t", "status": "done"}, {"id": "new", "status": "pending"}]),
        )
        .unwrap_err();
        assert!(e.contains("needs `text`"), "{e}");
        assert_eq!(p.get("t").unwrap().status, PlanStatus::Pending, "nothing applied");
        let e = update(
            &mut p,
            2,
            json!([{"text": "z", "status": "pending", "blocked_by": ["ghost"]}]),
        )
        .unwrap_err();
        assert!(e.contains("ghost"), "{e}");
        let e = update(
            &mut p,
            2,
            json!([{"id": "t", "status": "done"}, {"id": "t", "status": "done"}]),
        )
        .unwrap_err();
        assert!(e.contains("twice"), "{e}");
        assert_eq!(p.history("t").len(), 1);
    }

    #[test]
    fn a_close_folded_before_a_stale_update_stays_closed() {
        let mut p = Plan::default();
        update(&mut p, 1, json!([{"text": "x", "status": "pending"}])).unwrap();
        let stale = p
            .plan_update(
                "s",
                parse_items(&json!({"items": [{"id": "1", "status": "in_progress", "evidence": ["e"]}]}))
                    .unwrap(),
                NOW,
            )
            .unwrap();
        let closed = p
            .plan_close("1", Verdict::Abandoned, String::new(), NOW, true)
            .unwrap();
        p.apply(
            2,
            &ClientEvent::Commitment {
                change: Change::Closed,
                commitment: Box::new(closed),
            },
        );
        for (change, c) in stale {
            p.apply(
                3,
                &ClientEvent::Commitment {
                    change,
                    commitment: Box::new(c),
                },
            );
        }
        let row = p.get("1").unwrap();
        assert_eq!(row.closed.as_ref().unwrap().verdict, Verdict::Abandoned);
        assert_eq!(row.status, PlanStatus::Pending);
        assert_eq!(row.evidence, ["e"]);
        assert_eq!(p.history("1").len(), 3);
    }

    #[test]
    fn the_plan_caps_its_commitments_and_remembered_calls() {
        let mut p = Plan::default();
        let items: Vec<Value> = (0..crate::commitment::MAX_ITEMS)
            .map(|_| json!({"text": "x", "status": "pending"}))
            .collect();
        for n in 0..(MAX_COMMITMENTS / crate::commitment::MAX_ITEMS) {
            update(&mut p, n as u64 + 1, json!(items)).unwrap();
        }
        let e = update(&mut p, 99, json!([{"text": "x", "status": "pending"}])).unwrap_err();
        assert!(e.contains("at most 256"), "{e}");
        for n in 0..(REMEMBERED_CALLS + 10) {
            p.apply(
                0,
                &ClientEvent::ToolCall {
                    call_id: format!("c{n}"),
                    tool: "bash".into(),
                    input: json!({}),
                },
            );
        }
        assert_eq!(p.calls.len(), REMEMBERED_CALLS);
        assert!(!p.calls.contains_key("c0"));
    }
}
