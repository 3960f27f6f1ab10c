//! Reading a ledger end to end for `/doctor`: every line parses, the header comes first, and event seqs run without gaps (a recorded lost range or a snapshot accounts for one).
//!
//! Read-only and streaming (one line in memory at a time), so it can run
//! beside the session's writer: a last line still being written is only
//! incomplete, which the next load repairs anyway.

use crate::log::ledger::Record;
use std::io::{BufRead, BufReader};
use std::path::Path;

/// What reading a ledger found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct LedgerCheck {
    /// Lines read, the header included.
    pub lines: u64,
    /// The last event's seq (or the end of a lost range after it).
    pub last_seq: u64,
    /// The seq of the last snapshot (0: none).
    pub snapshot_seq: u64,
    /// Line numbers (from 1) that are not a ledger record, first few only.
    pub bad_lines: Vec<u64>,
    /// Bad lines in all.
    pub bad_count: u64,
    /// Where seqs jump: (expected, found), first few only.
    pub gaps: Vec<(u64, u64)>,
    /// No header on the first line.
    pub no_header: bool,
    /// The last line has no newline: a write in progress, or cut by a crash.
    pub torn_tail: bool,
}

/// How many bad lines or gaps a check names (it still counts them all).
const NAMED: usize = 5;

impl LedgerCheck {
    /// Whether the ledger is damaged (not merely torn at its end).
    pub fn damaged(&self) -> bool {
        self.no_header || self.bad_count > 0 || !self.gaps.is_empty()
    }
}

/// Reads the ledger at `path`. Blocking.
pub fn verify(path: &Path) -> std::io::Result<LedgerCheck> {
    let mut reader = BufReader::new(std::fs::File::open(path)?);
    let mut check = LedgerCheck::default();
    let mut line = Vec::new();
    loop {
        line.clear();
        if reader.read_until(b'\n', &mut line)? == 0 {
            break;
        }
        check.lines += 1;
        if line.last() != Some(&b'\n') {
            check.torn_tail = true;
            break;
        }
        let record = serde_json::from_slice::<Record>(&line);
        match record {
            Err(_) => {
                check.bad_count += 1;
                if check.bad_lines.len() < NAMED {
                    check.bad_lines.push(check.lines);
                }
                if check.lines == 1 {
                    check.no_header = true;
                }
            }
            Ok(Record::Header { .. }) if check.lines == 1 => {}
            Ok(_) if check.lines == 1 => check.no_header = true,
            Ok(Record::Event { seq, .. }) => {
                let expected = check.last_seq + 1;
                if seq != expected && check.gaps.len() < NAMED {
                    check.gaps.push((expected, seq));
                }
                check.last_seq = seq;
            }
            Ok(Record::Lost { to, .. }) => check.last_seq = check.last_seq.max(to),
            Ok(Record::Snapshot(s)) => {
                check.snapshot_seq = s.seq;
                check.last_seq = check.last_seq.max(s.seq);
            }
            Ok(_) => {}
        }
    }
    Ok(check)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{ClientEvent, Frame};
    use crate::log::ledger::{Ledger, Log};
    use crate::Durability;

    fn ledger(dir: &Path, events: u64) -> std::path::PathBuf {
        let path = dir.join("s.jsonl");
        let l = Ledger::create(&path, "s", "2026-12-04T00:00:00Z", Durability::Process).unwrap();
        for seq in 1..=events {
            l.append_event(&Frame::new(seq, "s".into(), ClientEvent::status(seq % 2 == 0)))
                .unwrap();
        }
        l.sync().unwrap();
        path
    }

    #[test]
    fn a_healthy_ledger_reads_to_its_last_seq() {
        let dir = tempfile::tempdir().unwrap();
        let c = verify(&ledger(dir.path(), 5)).unwrap();
        assert_eq!(
            (c.lines, c.last_seq, c.damaged(), c.torn_tail),
            (6, 5, false, false)
        );
    }

    #[test]
    fn a_bad_line_a_gap_and_a_torn_tail_are_each_found() {
        let dir = tempfile::tempdir().unwrap();
        let path = ledger(dir.path(), 3);
        let text = std::fs::read_to_string(&path).unwrap();
        let mut lines: Vec<&str> = text.lines().collect();
        lines[2] = "{not json";
        let gap = lines[3].replace("\"seq\":3", "\"seq\":7");
        lines[3] = &gap;
        std::fs::write(&path, lines.join("\n") + "\n{\"event\":").unwrap();
        let c = verify(&path).unwrap();
        assert_eq!(c.bad_lines, vec![3]);
        assert_eq!(c.gaps, vec![(2, 7)], "{c:?}");
        assert!(c.torn_tail && c.damaged());
    }

    #[test]
    fn no_header_is_damage() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.jsonl");
        std::fs::write(&path, "{\"lost\":{\"from\":1,\"to\":2}}\n").unwrap();
        assert!(verify(&path).unwrap().no_header);
    }
}
