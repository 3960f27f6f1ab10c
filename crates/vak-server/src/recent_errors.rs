//! The recent failed requests the operations console shows (GetAdminStatus): a bounded ring the access log feeds, newest first.

use std::collections::VecDeque;
use std::sync::Mutex;

/// How many failures are kept.
pub(crate) const KEPT: usize = 50;
/// The longest message kept, in bytes (cut at a character boundary).
const MESSAGE: usize = 512;

#[derive(Clone, Debug, PartialEq)]
pub struct RecentError {
    pub at: String,
    pub method: String,
    pub path: String,
    pub status: u16,
    pub grpc_status: Option<u16>,
    pub message: String,
}

#[derive(Default)]
pub struct RecentErrors {
    ring: Mutex<VecDeque<RecentError>>,
}

/// Whether an answer is worth an operator's attention: a server-side failure or a
/// refusal at a cap. Other 4xx are the client's business (and an unauthenticated
/// prober would otherwise flood the ring).
pub(crate) fn noteworthy(status: u16, grpc_status: Option<u16>) -> bool {
    // UNKNOWN, RESOURCE_EXHAUSTED, INTERNAL, UNAVAILABLE, DATA_LOSS.
    status >= 500 || status == 429 || grpc_status.is_some_and(|c| matches!(c, 2 | 8 | 13 | 14 | 15))
}

impl RecentErrors {
    pub fn record(&self, mut e: RecentError) {
        if e.message.len() > MESSAGE {
            let mut end = MESSAGE;
            while !e.message.is_char_boundary(end) {
                end -= 1;
            }
            e.message.truncate(end);
        }
        let mut ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        if ring.len() == KEPT {
            ring.pop_back();
        }
        ring.push_front(e);
    }

    /// Newest first.
    pub fn list(&self) -> Vec<RecentError> {
        self.ring
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(i: usize, message: &str) -> RecentError {
        RecentError {
            at: String::new(),
            method: "GET".into(),
            path: format!("/x/{i}"),
            status: 500,
            grpc_status: None,
            message: message.into(),
        }
    }

    #[test]
    fn keeps_the_newest_fifty_first_and_bounds_messages() {
        let r = RecentErrors::default();
        for i in 0..(KEPT + 7) {
            r.record(err(i, ""));
        }
        let l = r.list();
        assert_eq!(l.len(), KEPT);
        assert_eq!(l[0].path, format!("/x/{}", KEPT + 6));
        assert_eq!(l[KEPT - 1].path, "/x/7");
        r.record(err(0, &"é".repeat(400)));
        let m = &r.list()[0].message;
        assert!(m.len() <= MESSAGE && m.chars().all(|c| c == 'é'), "{}", m.len());
    }

    #[test]
    fn only_server_failures_and_caps_are_noteworthy() {
        assert!(noteworthy(500, None) && noteworthy(503, None) && noteworthy(429, None));
        assert!(noteworthy(200, Some(13)) && noteworthy(200, Some(8)) && noteworthy(200, Some(14)));
        assert!(!noteworthy(401, None) && !noteworthy(404, None) && !noteworthy(400, None));
        assert!(!noteworthy(200, Some(0)) && !noteworthy(200, Some(5)) && !noteworthy(200, Some(16)));
    }
}
