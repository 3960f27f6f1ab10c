//! Background results: what work done without a person watching hands to a session, delivered when the session is idle.

use serde::{Deserialize, Serialize};

/// Where a background result came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackgroundSource {
    Task,
    Script,
    Budget,
    Worker,
}

impl BackgroundSource {
    pub fn as_str(self) -> &'static str {
        match self {
            BackgroundSource::Task => "task",
            BackgroundSource::Script => "script",
            BackgroundSource::Budget => "budget",
            BackgroundSource::Worker => "worker",
        }
    }
}

/// Why a background result is an alert.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackgroundReason {
    ScriptFailed,
    ScriptTimeout,
    #[serde(rename = "budget_80")]
    Budget80,
    #[serde(rename = "budget_100")]
    Budget100,
}

impl BackgroundReason {
    pub fn as_str(self) -> &'static str {
        match self {
            BackgroundReason::ScriptFailed => "script_failed",
            BackgroundReason::ScriptTimeout => "script_timeout",
            BackgroundReason::Budget80 => "budget_80",
            BackgroundReason::Budget100 => "budget_100",
        }
    }
}

/// One result on its way to a session.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BackgroundResult {
    /// Its own id, "bg_" and 12 hex digits: what exactly-once delivery keys on.
    pub result_id: String,
    pub source: BackgroundSource,
    /// What it came from: a task id, or "budget:<date>:<level>".
    pub id: String,
    pub text: String,
    /// Why it is an alert; None when it is not one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<BackgroundReason>,
    /// RFC 3339, UTC.
    pub arrived_at: String,
}

impl BackgroundResult {
    /// A new result with a fresh id, arriving now.
    pub fn new(source: BackgroundSource, id: String, text: String, reason: Option<BackgroundReason>) -> Self {
        BackgroundResult {
            result_id: format!("bg_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]),
            source,
            id,
            text,
            reason,
            arrived_at: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
        }
    }

    pub fn alert(&self) -> bool {
        self.reason.is_some()
    }
}

/// Where background results go: the host's sessions (`Hub`), or a test's
/// recorder. `deliver` returns once the result is durable in the session's
/// ledger (it is shown later, when the session is idle).
pub trait BackgroundSink: Send + Sync + 'static {
    fn deliver(
        &self,
        session_id: &str,
        result: BackgroundResult,
    ) -> futures_util::future::BoxFuture<'_, crate::Result<()>>;
}

/// The most results a session holds undelivered; past it the two oldest
/// are summarised into one (never dropped).
pub const MAX_PENDING: usize = 64;

/// The longest a summary's text grows; past it, only the count goes up.
const MAX_SUMMARY_TEXT: usize = 4096;

/// One undelivered result: its number in the session (`upto` of the
/// delivering event), and how many results it summarises (0: just itself).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Pending {
    pub n: u64,
    pub result: BackgroundResult,
    #[serde(default)]
    pub summarised: u32,
}

/// A session's undelivered background results, in order of arrival,
/// bounded. The same fold runs live and over the ledger on a reload, so both
/// agree on what is pending and how it was summarised.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct BackgroundQueue {
    /// The number the next queued result gets.
    pub next_n: u64,
    pending: std::collections::VecDeque<Pending>,
}

impl BackgroundQueue {
    /// Queues result number `n` (numbers only grow).
    pub fn queue(&mut self, n: u64, result: BackgroundResult) {
        self.next_n = self.next_n.max(n + 1);
        self.pending.push_back(Pending {
            n,
            result,
            summarised: 0,
        });
        if self.pending.len() > MAX_PENDING {
            let (Some(a), Some(b)) = (self.pending.pop_front(), self.pending.pop_front()) else {
                return;
            };
            self.pending.push_front(summarise(a, b));
        }
    }

    /// Everything numbered up to `upto` was delivered.
    pub fn delivered(&mut self, upto: u64) {
        self.pending.retain(|p| p.n > upto);
    }

    /// Takes every pending result, oldest first.
    pub fn take(&mut self) -> Vec<Pending> {
        self.pending.drain(..).collect()
    }

    pub fn len(&self) -> usize {
        self.pending.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }
}

/// The first line of a result, cut to a readable length.
fn headline(r: &BackgroundResult) -> String {
    let line = r.text.lines().next().unwrap_or("");
    let mut end = line.len().min(160);
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    let cut = if end < line.len() { "…" } else { "" };
    format!("[{} {}] {}{cut}", r.source.as_str(), r.id, &line[..end])
}

/// Two neighbouring pending results as one: `b` (the later) keeps its number,
/// so delivering the summary delivers both.
fn summarise(a: Pending, b: Pending) -> Pending {
    let count = a.summarised.max(1) + b.summarised.max(1);
    let lines = |p: &Pending| {
        if p.summarised > 0 {
            // Already a summary: its lines follow its first one.
            p.result
                .text
                .split_once('\n')
                .map(|(_, rest)| rest.to_string())
                .unwrap_or_default()
        } else {
            headline(&p.result)
        }
    };
    let mut body = lines(&a);
    let more = lines(&b);
    if body.len() + more.len() < MAX_SUMMARY_TEXT {
        body.push('\n');
        body.push_str(&more);
    }
    let result = BackgroundResult {
        result_id: b.result.result_id.clone(),
        source: a.result.source,
        id: "summary".to_string(),
        text: format!(
            "{count} background results arrived while this session was busy past its queue of {MAX_PENDING}; summarised:\n{}",
            body.trim_start_matches('\n')
        ),
        reason: a.result.reason.or(b.result.reason),
        arrived_at: a.result.arrived_at.clone(),
    };
    Pending {
        n: b.n,
        result,
        summarised: count,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(i: u64) -> BackgroundResult {
        BackgroundResult::new(
            BackgroundSource::Script,
            format!("task_{i}"),
            format!("out {i}\nmore"),
            None,
        )
    }

    #[test]
    fn a_queue_past_its_bound_summarises_the_oldest_and_loses_no_count() {
        let mut q = BackgroundQueue::default();
        let total = MAX_PENDING as u64 + 10;
        for i in 0..total {
            q.queue(i, r(i));
        }
        assert_eq!(q.len(), MAX_PENDING);
        let all = q.take();
        let first = &all[0];
        assert_eq!(first.summarised, 11, "{first:?}");
        assert!(
            first.result.text.starts_with("11 background results"),
            "{}",
            first.result.text
        );
        assert!(first.result.text.contains("[script task_0] out 0"));
        assert!(first.result.text.contains("[script task_10] out 10"));
        // Every result is either itself or counted in the summary.
        let counted: u32 = all.iter().map(|p| p.summarised.max(1)).sum();
        assert_eq!(counted as u64, total);
        // Numbers stay in order, the summary carrying its newest one.
        assert!(all.windows(2).all(|w| w[0].n < w[1].n));
        assert_eq!(first.n, 10);
    }

    #[test]
    fn delivered_up_to_a_number_leaves_only_the_later_ones() {
        let mut q = BackgroundQueue::default();
        for i in 0..5 {
            q.queue(i, r(i));
        }
        q.delivered(2);
        let left: Vec<u64> = q.take().iter().map(|p| p.n).collect();
        assert_eq!(left, [3, 4]);
        assert_eq!(q.next_n, 5);
    }
}
