//! Reading a session's receipts from its ledger: one pass over the committed lines, keeping the newest within a count and a prompt budget.

use crate::log::ledger::{self, Record};
use crate::receipt::{Call, Expander, Receipt, PROMPT_CAP};
use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::path::Path;

/// The most receipts one listing holds: the newest.
pub const MAX_LISTED: usize = 1000;
/// The most prompt text one listing holds: past it the older receipts come
/// without their prompt (the newest keep theirs).
pub const PROMPT_BUDGET: usize = 2 * 1024 * 1024;

/// How a receipt line starts (`Record::Receipt`, externally tagged).
const RECEIPT_PREFIX: &[u8] = b"{\"receipt\":";

/// A receipt with the session's latest seq when it was recorded.
#[derive(Clone, Debug, PartialEq)]
pub struct Listed {
    pub seq: u64,
    pub receipt: Receipt,
}

/// The newest `MAX_LISTED` receipts of the ledger at `path`, oldest first,
/// with their prompts only when `prompts` (within `PROMPT_BUDGET`, newest
/// first). Reads only whole lines: a line the writer is still appending is
/// not committed yet. Blocking: call it off the runtime.
pub fn read(path: &Path, prompts: bool) -> std::io::Result<Vec<Listed>> {
    read_bounded(path, prompts, MAX_LISTED, PROMPT_BUDGET)
}

fn read_bounded(path: &Path, prompts: bool, max: usize, budget: usize) -> std::io::Result<Vec<Listed>> {
    let mut reader = BufReader::new(std::fs::File::open(path)?);
    let mut kept = Collector::new(prompts, max, budget);
    let mut line = Vec::new();
    loop {
        line.clear();
        if reader.read_until(b'\n', &mut line)? == 0 || line.last() != Some(&b'\n') {
            break;
        }
        if let Some(seq) = ledger::event_seq(&line) {
            kept.event(seq);
            continue;
        }
        if !line.starts_with(RECEIPT_PREFIX) {
            continue;
        }
        // A damaged line is not ours to judge here: /doctor reports it.
        if let Ok(Record::Receipt(receipt)) = serde_json::from_slice::<Record>(&line) {
            kept.receipt(*receipt);
        }
    }
    Ok(kept.finish())
}

/// The receipts of `records` (a replicated log's, read whole), bounded like `read`.
pub fn of_records(records: Vec<Record>, prompts: bool) -> Vec<Listed> {
    let mut kept = Collector::new(prompts, MAX_LISTED, PROMPT_BUDGET);
    for r in records {
        match r {
            Record::Event { seq, .. } => kept.event(seq),
            Record::Receipt(receipt) => kept.receipt(*receipt),
            _ => {}
        }
    }
    kept.finish()
}

/// The newest receipts seen so far, within the count and the prompt budget.
struct Collector {
    prompts: bool,
    max: usize,
    budget: usize,
    kept: VecDeque<Listed>,
    /// Prompt bytes held in `kept`.
    held: usize,
    /// The index in `kept` from which prompts are still held.
    first_with_prompt: usize,
    latest: u64,
    /// Rebuilds each stored prompt (what changed since the one before) into its request.
    prompts_so_far: Expander,
}

impl Collector {
    fn new(prompts: bool, max: usize, budget: usize) -> Collector {
        Collector {
            prompts,
            max,
            budget,
            kept: VecDeque::new(),
            held: 0,
            first_with_prompt: 0,
            latest: 0,
            prompts_so_far: Expander::default(),
        }
    }

    fn event(&mut self, seq: u64) {
        self.latest = seq;
    }

    fn receipt(&mut self, mut receipt: Receipt) {
        if let Call::ModelCall(c) = &mut receipt.call {
            c.prompt = match c.prompt.take() {
                Some(stored) if self.prompts => self.prompts_so_far.expand(&stored, PROMPT_CAP),
                _ => None,
            };
        }
        let listed = Listed {
            seq: self.latest,
            receipt,
        };
        self.held += prompt_len(&listed);
        self.kept.push_back(listed);
        if self.kept.len() > self.max {
            if let Some(gone) = self.kept.pop_front() {
                self.held -= prompt_len(&gone);
            }
            self.first_with_prompt = self.first_with_prompt.saturating_sub(1);
        }
        // Over the budget: the oldest prompts go first.
        while self.held > self.budget && self.first_with_prompt < self.kept.len() {
            if let Call::ModelCall(c) = &mut self.kept[self.first_with_prompt].receipt.call {
                self.held -= c.prompt.take().map_or(0, |p| p.as_str().len());
            }
            self.first_with_prompt += 1;
        }
    }

    fn finish(self) -> Vec<Listed> {
        self.kept.into()
    }
}

fn prompt_len(l: &Listed) -> usize {
    match &l.receipt.call {
        Call::ModelCall(c) => c.prompt.as_ref().map_or(0, |p| p.as_str().len()),
        Call::ToolCall(_) => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::ClientEvent;
    use crate::provider::{TurnOutput, TurnRequest};
    use crate::receipt::{ModelCallRecorder, Outcome, PromptBase, ToolCallReceipt};
    use std::io::Write;

    fn model_call(n: usize) -> Receipt {
        let mut r = ModelCallRecorder::new(Some("r"), "openai", "m", "rev", &[]);
        r.sending(&TurnRequest {
            system: format!("{n}:{}", "p".repeat(100)),
            ..TurnRequest::default()
        });
        r.ended(&Ok(TurnOutput::default()));
        r.finish(&mut PromptBase::default()).unwrap()
    }

    fn line(record: &Record) -> String {
        serde_json::to_string(record).unwrap() + "\n"
    }

    #[test]
    fn receipts_carry_the_seq_before_them_keep_the_newest_and_skip_an_unfinished_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.jsonl");
        let mut f = std::fs::File::create(&path).unwrap();
        let event = |seq| Record::Event {
            seq,
            event: ClientEvent::TextDelta { text: "x".into() },
        };
        write!(
            f,
            "{}",
            line(&Record::Header {
                session_id: "s".into(),
                created_at: "t".into(),
                workspace: String::new(),
            })
        )
        .unwrap();
        write!(f, "{}", line(&Record::Receipt(Box::new(model_call(0))))).unwrap();
        for n in 1..=5u64 {
            write!(f, "{}", line(&event(n))).unwrap();
            write!(f, "{}", line(&Record::Receipt(Box::new(model_call(n as usize))))).unwrap();
        }
        let tool = Receipt {
            request_id: "r".into(),
            started_at: "t".into(),
            call: Call::ToolCall(ToolCallReceipt {
                call_id: "c".into(),
                tool: "bash".into(),
                duration_ms: 3,
                exit_code: Some(2),
                output_bytes: 10,
                outcome: Outcome::Failed,
            }),
        };
        write!(f, "{}", line(&Record::Receipt(Box::new(tool.clone())))).unwrap();
        // A receipt the writer is still appending: not committed.
        let partial = line(&Record::Receipt(Box::new(model_call(9))));
        write!(f, "{}", &partial[..partial.len() / 2]).unwrap();
        drop(f);

        let all = read(&path, false).unwrap();
        assert_eq!(all.len(), 7);
        assert_eq!(
            all.iter().map(|l| l.seq).collect::<Vec<_>>(),
            [0, 1, 2, 3, 4, 5, 5]
        );
        assert_eq!(all[6].receipt, tool);
        assert!(all.iter().all(|l| prompt_len(l) == 0), "no prompt unless asked");

        // Bounded by count: the newest stay.
        let newest = read_bounded(&path, true, 3, usize::MAX).unwrap();
        assert_eq!(newest.iter().map(|l| l.seq).collect::<Vec<_>>(), [4, 5, 5]);
        assert!(prompt_len(&newest[0]) > 0);

        // Bounded by prompt bytes: the newest keep theirs.
        let one = prompt_len(&all_with_prompts(&path)[1]);
        let budgeted = read_bounded(&path, true, 100, 2 * one + one / 2).unwrap();
        let with: Vec<bool> = budgeted.iter().map(|l| prompt_len(l) > 0).collect();
        assert_eq!(with, [false, false, false, false, true, true, false]);
    }

    fn all_with_prompts(path: &Path) -> Vec<Listed> {
        read(path, true).unwrap()
    }
}
