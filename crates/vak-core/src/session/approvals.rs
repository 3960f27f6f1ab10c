//! Pending approvals: each tool call that needs permission parks on a oneshot until exactly one answer, or expiry, settles it.

use crate::error::{Error, Result};
use crate::event::{ApprovalOutcome, ClientEvent};
use crate::host::rules::Candidate;
use crate::log::folds::REMEMBERED_SETTLED;
use crate::PermissionMode;
use std::collections::{HashMap, VecDeque};

use std::sync::Mutex;
use tokio::sync::oneshot;

/// A client's answer to an approval request.
#[derive(Clone, Debug)]
pub struct Answer {
    pub approve: bool,
    pub reason: String,
    /// For an approved `exit_plan_mode`: the mode to leave plan mode for
    /// (`accept-edits` or `default`; None: `default`).
    pub mode: Option<PermissionMode>,
    /// With an approval: also store an always-allow rule for what the call does.
    pub always: bool,
}

impl Answer {
    pub fn new(approve: bool, reason: impl Into<String>) -> Answer {
        Answer {
            approve,
            reason: reason.into(),
            mode: None,
            always: false,
        }
    }
}

/// The tool whose approval carries a plan, and may carry a mode.
pub const PLAN_TOOL: &str = "exit_plan_mode";

struct Pending {
    tx: oneshot::Sender<Answer>,
    tool: String,
    /// What an always-allow answer would store (None: nothing can be).
    rule: Option<Candidate>,
}

#[derive(Default)]
pub struct Approvals {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    pending: HashMap<String, Pending>,
    settled: HashMap<String, ApprovalOutcome>,
    /// Settlement order, to forget the oldest past `REMEMBERED_SETTLED`.
    order: VecDeque<String>,
}

impl Inner {
    fn settle(&mut self, request_id: &str, outcome: ApprovalOutcome) {
        if self.settled.insert(request_id.to_string(), outcome).is_none() {
            self.order.push_back(request_id.to_string());
            if self.order.len() > REMEMBERED_SETTLED {
                if let Some(old) = self.order.pop_front() {
                    self.settled.remove(&old);
                }
            }
        }
    }
}

/// The pending request `answer` may settle: NotFound for an id never
/// issued, Conflict for one already settled, InvalidArgument for a `mode` on
/// anything but an approved exit_plan_mode or an `always` that is not an
/// approval of a call a rule can cover.
fn check<'a>(inner: &'a Inner, request_id: &str, answer: &Answer) -> Result<&'a Pending> {
    let Some(pending) = inner.pending.get(request_id) else {
        return Err(match inner.settled.get(request_id) {
            Some(o) => Error::conflict(format!(
                "approval {request_id} is already settled ({})",
                o.as_str()
            )),
            None => Error::not_found(format!("no approval request {request_id}")),
        });
    };
    if answer.mode.is_some() {
        if pending.tool != PLAN_TOOL {
            return Err(Error::invalid(format!(
                "mode answers only an {PLAN_TOOL} approval; {request_id} is for {}",
                pending.tool
            )));
        }
        if !answer.approve {
            return Err(Error::invalid(
                "mode goes with approve: true (denying keeps plan mode)",
            ));
        }
    }
    if answer.always {
        if !answer.approve {
            return Err(Error::invalid("always goes with approve: true"));
        }
        if pending.rule.is_none() {
            return Err(Error::invalid(if pending.tool == PLAN_TOOL {
                format!("a plan is approved once: always does not apply to {PLAN_TOOL}")
            } else {
                format!(
                    "no always-allow rule can cover this {} call: approve it once",
                    pending.tool
                )
            }));
        }
    }
    Ok(pending)
}

impl Approvals {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Parks a new request for a call of `tool`; the receiver yields the
    /// answer. `rule`: what `always` would store for it.
    pub fn register(
        &self,
        request_id: &str,
        tool: &str,
        rule: Option<Candidate>,
    ) -> oneshot::Receiver<Answer> {
        let (tx, rx) = oneshot::channel();
        self.lock().pending.insert(
            request_id.to_string(),
            Pending {
                tx,
                tool: tool.to_string(),
                rule,
            },
        );
        rx
    }

    /// Checks `answer` against the pending request without settling it: the
    /// rule an `always` answer stores (None without `always`). Errors as `answer`'s.
    pub fn prepare(&self, request_id: &str, answer: &Answer) -> Result<Option<Candidate>> {
        let inner = self.lock();
        let pending = check(&inner, request_id, answer)?;
        Ok(answer.always.then(|| pending.rule.clone()).flatten())
    }

    /// Records an approval settled in an earlier life of the session (reload).
    pub fn remember(&self, request_id: &str, outcome: ApprovalOutcome) {
        self.lock().settle(request_id, outcome);
    }

    /// Settles `request_id` with `answer`. `settle` runs under the lock with
    /// the request's tool, the answer and its approval_resolved event, so the
    /// event is published exactly once and whatever the answer changes (a plan's
    /// mode) is in effect before the waiting tool call resumes. Refusals
    /// (`check`'s) leave the request pending.
    pub fn answer(
        &self,
        request_id: &str,
        answer: Answer,
        settle: impl FnOnce(&str, &Answer, ClientEvent),
    ) -> Result<ApprovalOutcome> {
        let mut inner = self.lock();
        check(&inner, request_id, &answer)?;
        let Some(Pending { tx, tool, .. }) = inner.pending.remove(request_id) else {
            return Err(Error::internal("an approval vanished under its lock"));
        };
        let outcome = if answer.approve {
            ApprovalOutcome::Approved
        } else {
            ApprovalOutcome::Denied
        };
        inner.settle(request_id, outcome);
        counted(outcome);
        let event = ClientEvent::ApprovalResolved {
            request_id: request_id.to_string(),
            outcome,
            reason: answer.reason.clone(),
        };
        settle(&tool, &answer, event);
        let _ = tx.send(answer);
        Ok(outcome)
    }

    /// Denies every pending request with `reason` (the permission mode
    /// changed); how many there were.
    pub fn deny_all(&self, reason: &str, mut publish: impl FnMut(ClientEvent)) -> usize {
        let mut inner = self.lock();
        let ids: Vec<String> = inner.pending.keys().cloned().collect();
        for id in &ids {
            let Some(pending) = inner.pending.remove(id) else {
                continue;
            };
            inner.settle(id, ApprovalOutcome::Denied);
            counted(ApprovalOutcome::Denied);
            publish(ClientEvent::ApprovalResolved {
                request_id: id.clone(),
                outcome: ApprovalOutcome::Denied,
                reason: reason.to_string(),
            });
            let _ = pending.tx.send(Answer::new(false, reason));
        }
        ids.len()
    }

    /// Expires every pending request (its run ended or was cancelled).
    /// Expires the one pending approval `id` (nobody answered it in time);
    /// false when it was settled already.
    pub fn expire(&self, id: &str, reason: &str, publish: impl FnOnce(ClientEvent)) -> bool {
        let mut inner = self.lock();
        if inner.pending.remove(id).is_none() {
            return false;
        }
        inner.settle(id, ApprovalOutcome::Expired);
        counted(ApprovalOutcome::Expired);
        publish(ClientEvent::ApprovalResolved {
            request_id: id.to_string(),
            outcome: ApprovalOutcome::Expired,
            reason: reason.to_string(),
        });
        true
    }

    pub fn expire_all(&self, reason: &str, mut publish: impl FnMut(ClientEvent)) {
        let mut inner = self.lock();
        let ids: Vec<String> = inner.pending.keys().cloned().collect();
        for id in ids {
            inner.pending.remove(&id);
            inner.settle(&id, ApprovalOutcome::Expired);
            counted(ApprovalOutcome::Expired);
            publish(ClientEvent::ApprovalResolved {
                request_id: id,
                outcome: ApprovalOutcome::Expired,
                reason: reason.to_string(),
            });
        }
    }
}

/// Counts an approval settled now (not one remembered from the ledger).
fn counted(outcome: ApprovalOutcome) {
    metrics::counter!(crate::metrics_names::APPROVALS, "outcome" => outcome.as_str()).increment(1);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settled_approvals_are_remembered_up_to_a_bound() {
        let a = Approvals::default();
        for i in 0..REMEMBERED_SETTLED + 10 {
            a.remember(&format!("ap{i}"), ApprovalOutcome::Denied);
        }
        let inner = a.lock();
        assert_eq!(inner.settled.len(), REMEMBERED_SETTLED);
        assert!(!inner.settled.contains_key("ap0"), "the oldest is forgotten");
        assert!(inner
            .settled
            .contains_key(&format!("ap{}", REMEMBERED_SETTLED + 9)));
        assert_eq!(inner.order.len(), REMEMBERED_SETTLED);
    }

    #[test]
    fn an_approval_settles_exactly_once() {
        let a = Approvals::default();
        let mut rx = a.register("ap1", "write_file", None);
        let mut published = Vec::new();
        let yes = Answer::new(true, "");
        assert_eq!(
            a.answer("ap1", yes.clone(), |_, _, e| published.push(e)).unwrap(),
            ApprovalOutcome::Approved
        );
        assert!(rx.try_recv().unwrap().approve);
        assert_eq!(published.len(), 1);
        let again = a
            .answer("ap1", yes.clone(), |_, _, e| published.push(e))
            .unwrap_err();
        assert_eq!(again.kind, crate::error::ErrorKind::Conflict);
        let unknown = a
            .answer("nope", yes.clone(), |_, _, e| published.push(e))
            .unwrap_err();
        assert_eq!(unknown.kind, crate::error::ErrorKind::NotFound);
        assert_eq!(published.len(), 1);

        let _rx2 = a.register("ap2", "bash", None);
        a.expire_all("run ended", |e| published.push(e));
        assert!(matches!(
            &published[1],
            ClientEvent::ApprovalResolved {
                outcome: ApprovalOutcome::Expired,
                ..
            }
        ));
        let late = a.answer("ap2", yes, |_, _, e| published.push(e)).unwrap_err();
        assert_eq!(late.kind, crate::error::ErrorKind::Conflict);
    }

    #[test]
    fn a_mode_answers_only_an_approved_plan_and_a_refused_one_stays_pending() {
        let a = Approvals::default();
        let mut write = a.register("ap1", "write_file", None);
        let mut plan = a.register("ap2", PLAN_TOOL, None);
        let with_mode = |approve| Answer {
            mode: Some(PermissionMode::AcceptEdits),
            ..Answer::new(approve, "")
        };
        let mut published = Vec::new();
        for (id, answer) in [("ap1", with_mode(true)), ("ap2", with_mode(false))] {
            let e = a.answer(id, answer, |_, _, e| published.push(e)).unwrap_err();
            assert_eq!(e.kind, crate::error::ErrorKind::InvalidArgument, "{e:?}");
        }
        assert!(published.is_empty());
        assert!(
            write.try_recv().is_err() && plan.try_recv().is_err(),
            "both still pending"
        );
        let mut seen = None;
        a.answer("ap2", with_mode(true), |tool, answer, _| {
            seen = Some((tool.to_string(), answer.mode))
        })
        .unwrap();
        assert_eq!(
            seen,
            Some((PLAN_TOOL.to_string(), Some(PermissionMode::AcceptEdits)))
        );
        assert_eq!(plan.try_recv().unwrap().mode, Some(PermissionMode::AcceptEdits));
        // A mode change denies what is left, with its reason.
        assert_eq!(a.deny_all("the mode changed", |e| published.push(e)), 1);
        let denied = write.try_recv().unwrap();
        assert!(!denied.approve && denied.reason == "the mode changed");
        assert!(matches!(
            &published[..],
            [ClientEvent::ApprovalResolved {
                outcome: ApprovalOutcome::Denied,
                ..
            }]
        ));
    }

    #[test]
    fn always_needs_an_approval_of_a_call_a_rule_can_cover_and_a_refusal_stays_pending() {
        let a = Approvals::default();
        let rule = crate::host::rules::candidate("bash", &serde_json::json!({"command": "ls -la"}));
        let _bash = a.register("ap1", "bash", rule.clone());
        let _plan = a.register("ap2", PLAN_TOOL, None);
        let always = |approve| Answer {
            always: true,
            ..Answer::new(approve, "")
        };
        let refused = |id: &str, answer: Answer| {
            let e = a.prepare(id, &answer).unwrap_err();
            assert_eq!(e.kind, crate::error::ErrorKind::InvalidArgument, "{e:?}");
            e.message
        };
        assert!(refused("ap1", always(false)).contains("approve: true"));
        assert!(refused("ap2", always(true)).contains("a plan is approved once"));
        assert_eq!(a.prepare("ap1", &Answer::new(true, "")).unwrap(), None);
        assert_eq!(a.prepare("ap1", &always(true)).unwrap(), rule);
        assert_eq!(
            a.prepare("nope", &always(true)).unwrap_err().kind,
            crate::error::ErrorKind::NotFound
        );
        assert!(a.answer("ap1", always(true), |_, _, _| {}).is_ok());
    }
}
