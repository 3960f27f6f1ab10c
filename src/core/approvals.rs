//! Pending approvals: each tool call that needs permission parks on a oneshot until exactly one answer, or expiry, settles it.

use super::event::{ApprovalOutcome, ClientEvent};
use crate::error::{Error, Result};
use std::collections::{HashMap, VecDeque};

/// Settled approvals remembered per session (so a late second answer is a
/// 409, not a 404); the oldest are forgotten first.
pub const REMEMBERED_SETTLED: usize = 4096;
use std::sync::Mutex;
use tokio::sync::oneshot;

/// A client's answer to an approval request.
#[derive(Clone, Debug)]
pub struct Answer {
    pub approve: bool,
    pub reason: String,
}

#[derive(Default)]
pub struct Approvals {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    pending: HashMap<String, oneshot::Sender<Answer>>,
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

impl Approvals {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Parks a new request; the receiver yields the answer.
    pub fn register(&self, request_id: &str) -> oneshot::Receiver<Answer> {
        let (tx, rx) = oneshot::channel();
        self.lock().pending.insert(request_id.to_string(), tx);
        rx
    }

    /// Records an approval settled in an earlier life of the session (reload).
    pub fn remember(&self, request_id: &str, outcome: ApprovalOutcome) {
        self.lock().settle(request_id, outcome);
    }

    /// Settles `request_id` with `answer`. `publish` runs under the lock, so
    /// the approval_resolved event is published exactly once and before the
    /// waiting tool call resumes. NotFound for an id never issued, Conflict
    /// for one already answered or expired.
    pub fn answer(
        &self,
        request_id: &str,
        answer: Answer,
        publish: impl FnOnce(ClientEvent),
    ) -> Result<ApprovalOutcome> {
        let mut inner = self.lock();
        let Some(tx) = inner.pending.remove(request_id) else {
            return Err(match inner.settled.get(request_id) {
                Some(o) => Error::conflict(format!(
                    "approval {request_id} is already settled ({})",
                    o.as_str()
                )),
                None => Error::not_found(format!("no approval request {request_id}")),
            });
        };
        let outcome = if answer.approve {
            ApprovalOutcome::Approved
        } else {
            ApprovalOutcome::Denied
        };
        inner.settle(request_id, outcome);
        publish(ClientEvent::ApprovalResolved {
            request_id: request_id.to_string(),
            outcome,
            reason: answer.reason.clone(),
        });
        let _ = tx.send(answer);
        Ok(outcome)
    }

    /// Expires every pending request (its run ended or was cancelled).
    pub fn expire_all(&self, reason: &str, mut publish: impl FnMut(ClientEvent)) {
        let mut inner = self.lock();
        let ids: Vec<String> = inner.pending.keys().cloned().collect();
        for id in ids {
            inner.pending.remove(&id);
            inner.settle(&id, ApprovalOutcome::Expired);
            publish(ClientEvent::ApprovalResolved {
                request_id: id,
                outcome: ApprovalOutcome::Expired,
                reason: reason.to_string(),
            });
        }
    }
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
        let mut rx = a.register("ap1");
        let mut published = Vec::new();
        let yes = Answer {
            approve: true,
            reason: String::new(),
        };
        assert_eq!(
            a.answer("ap1", yes.clone(), |e| published.push(e)).unwrap(),
            ApprovalOutcome::Approved
        );
        assert!(rx.try_recv().unwrap().approve);
        assert_eq!(published.len(), 1);
        let again = a.answer("ap1", yes.clone(), |e| published.push(e)).unwrap_err();
        assert_eq!(again.kind, crate::error::ErrorKind::Conflict);
        let unknown = a.answer("nope", yes.clone(), |e| published.push(e)).unwrap_err();
        assert_eq!(unknown.kind, crate::error::ErrorKind::NotFound);
        assert_eq!(published.len(), 1);

        let _rx2 = a.register("ap2");
        a.expire_all("run ended", |e| published.push(e));
        assert!(matches!(
            &published[1],
            ClientEvent::ApprovalResolved {
                outcome: ApprovalOutcome::Expired,
                ..
            }
        ));
        let late = a.answer("ap2", yes, |e| published.push(e)).unwrap_err();
        assert_eq!(late.kind, crate::error::ErrorKind::Conflict);
    }
}
