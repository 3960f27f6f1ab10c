//! Several whole records in one message (`Vak-First`): a writer batch of small records costs JetStream one message, not one per record, and every read takes the pack apart again.
//!
//! A pack's payload is the records' JSON lines, exactly as the JSONL
//! ledger writes them, joined by newlines (JSON escapes every newline
//! inside a line). Its `Vak-Seq` or `Vak-Note` is the position of its last
//! record, as for a message of one record, so the subject's last message
//! still says where the log ends; `Vak-First` is its first record's
//! position (`n` for event n, `n.k` for the k-th note after it). The
//! records in between have the positions that follow: an event is the
//! next seq, a note the next k after the same event. A reader checks that
//! they do, from the first to the last: anything else is `Broken`, an
//! error, never shown. A pack is never cut in parts: it holds whole
//! records up to the payload room of one message, and a record larger than
//! that goes alone, in parts (`chunks.rs`).

use super::chunks::{Broken, H_PART};
use super::Position;
use crate::log::ledger::{parse_line, Record};
use async_nats::HeaderMap;

/// The first record's position in a pack.
pub(crate) const H_FIRST: &str = "Vak-First";

/// The first record's position if the message is a pack, None for a
/// message of one record (or of one record's parts).
pub(crate) fn first_of(headers: &HeaderMap) -> Result<Option<Position>, Broken> {
    let Some(value) = headers.get(H_FIRST) else {
        return Ok(None);
    };
    let bad = |why: &str| Broken::Pack(format!("{H_FIRST}: {:?} {why}", value.as_str()));
    let first = Position::parse(value.as_str()).ok_or_else(|| bad("is not a position"))?;
    if headers.get(H_PART).is_some() {
        return Err(bad("on a part of a record"));
    }
    Ok(Some(first))
}

/// The position of the record after one at `prev`: the next event if it
/// is one (`seq`), else the next note after the same event.
fn next_position(prev: Position, seq: Option<u64>) -> Position {
    match seq {
        Some(_) => Position {
            after: prev.after + 1,
            notes: 0,
        },
        None => Position {
            after: prev.after,
            notes: prev.notes + 1,
        },
    }
}

/// The records of a pack whose first record is at `first` and last at
/// `last`, each with its position; `Broken` if they are not what the
/// headers say (unreadable, an event out of sequence, fewer than two, or
/// ending elsewhere).
pub(crate) fn unpack(
    first: Position,
    last: Position,
    payload: &[u8],
) -> Result<Vec<(Position, Record)>, Broken> {
    let mut out: Vec<(Position, Record)> = Vec::new();
    for (i, line) in payload.split(|&b| b == b'\n').enumerate() {
        let record = parse_line(line)
            .map_err(|e| Broken::Pack(format!("record {} of the pack is unreadable: {e}", i + 1)))?;
        let seq = match &record {
            Record::Event { seq, .. } => Some(*seq),
            _ => None,
        };
        let at = match out.last() {
            None => first,
            Some((prev, _)) => next_position(*prev, seq),
        };
        let is_event = at.notes == 0;
        if seq.is_some() != is_event || seq.is_some_and(|s| s != at.after) {
            return Err(Broken::Pack(format!(
                "record {} of the pack is not at {} where it lies",
                i + 1,
                at.header()
            )));
        }
        out.push((at, record));
    }
    match out.last() {
        Some((end, _)) if out.len() >= 2 && *end == last => Ok(out),
        _ => Err(Broken::Pack(format!(
            "a pack of {} records from {} does not end at {}",
            out.len(),
            first.header(),
            last.header()
        ))),
    }
}

/// The events of a pack with seq > `after`, each with its seq, checked as a
/// replay reads them (the event lines only: a note's line is skipped by its
/// prefix, the events must follow each other); `mark` sees every event's
/// seq, read or not.
pub(crate) fn events_after(
    payload: &[u8],
    after: u64,
    mut mark: impl FnMut(u64),
) -> Result<Vec<(u64, crate::event::ClientEvent)>, Broken> {
    let mut out = Vec::new();
    let mut prev: Option<u64> = None;
    for line in payload.split(|&b| b == b'\n') {
        let Some(seq) = crate::log::ledger::event_seq(line) else {
            continue;
        };
        if prev.is_some_and(|p| seq != p + 1) {
            return Err(Broken::Pack(format!(
                "event {seq} of a pack follows event {prev:?}"
            )));
        }
        prev = Some(seq);
        mark(seq);
        if seq <= after {
            continue;
        }
        match parse_line(line) {
            Ok(Record::Event { seq: s, event }) if s == seq => out.push((seq, event)),
            _ => return Err(Broken::Pack(format!("event {seq} of a pack is unreadable"))),
        }
    }
    Ok(out)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::cluster::jetstream::plan;
    use crate::event::{ClientEvent, Frame};
    use crate::log::ledger::Batch;

    /// A text delta of session `s` (also the live path's tests').
    pub(in crate::cluster::jetstream) fn delta(seq: u64, text: &str) -> Frame {
        Frame::new(
            seq,
            "s".into(),
            ClientEvent::TextDelta {
                text: text.to_string(),
            },
        )
    }

    /// A note record (an admitted request id).
    pub(in crate::cluster::jetstream) fn note(id: &str) -> Record {
        Record::Admitted {
            request_id: id.to_string(),
        }
    }

    /// Every message of a plan read back as a reader does: packs unpacked,
    /// whole records parsed (no parts in these batches).
    fn read_back(batch: &Batch, from: Position, room: usize) -> Vec<(Position, Record)> {
        let (msgs, end, _) = plan("s", batch, from, room).unwrap();
        let mut out = Vec::new();
        for m in &msgs {
            assert!(m.part.is_none());
            assert!(m.payload.len() <= room, "a message over its room");
            let last = match (m.seq, m.note) {
                (Some(n), None) => Position { after: n, notes: 0 },
                (None, Some((after, notes))) => Position { after, notes },
                other => panic!("{other:?}"),
            };
            match m.first {
                Some(first) => out.extend(unpack(first, last, m.payload).unwrap()),
                None => out.push((last, parse_line(m.payload).unwrap())),
            }
        }
        assert_eq!(out.last().map(|(p, _)| *p), Some(end));
        out
    }

    #[test]
    fn a_batch_goes_as_few_packs_and_reads_back_as_every_record_at_its_position() {
        let mut b = Batch::default();
        b.push(&note("a"));
        for seq in 1..=40 {
            b.push_frame(&delta(seq, "word "));
            if seq % 7 == 0 {
                b.push(&note(&format!("n{seq}")));
                b.push(&note(&format!("m{seq}")));
            }
        }
        let lines: Vec<&[u8]> = b.records().map(|(_, l)| l).collect();
        // Every record, with the position it had as a message of its own.
        let mut pos = Position::default();
        let mut want = Vec::new();
        for (seq, line) in b.records() {
            pos = next_position(pos, seq);
            want.push((pos, parse_line(line).unwrap()));
        }
        for room in [lines.iter().map(|l| l.len()).max().unwrap(), 300, 1000, 1 << 20] {
            let got = read_back(&b, Position::default(), room);
            assert_eq!(got, want, "room {room}");
        }
        // Large room: one message for the whole batch, its id the last record's.
        let (msgs, _, sizes) = plan("s", &b, Position::default(), 1 << 20).unwrap();
        assert_eq!((msgs.len(), sizes), (1, vec![1]));
        assert_eq!(msgs[0].first, Some(Position { after: 0, notes: 1 }));
        assert_eq!((msgs[0].events, msgs[0].seq), (Some((1, 40)), Some(40)));
        assert_eq!(msgs[0].msg_id, "s:40");
        // A batch that goes on after notes: the next pack starts after them.
        let mut b2 = Batch::default();
        b2.push(&note("x"));
        b2.push_frame(&delta(41, "w"));
        let (msgs, end, _) = plan("s", &b2, Position { after: 40, notes: 0 }, 1 << 20).unwrap();
        assert_eq!(msgs[0].first, Some(Position { after: 40, notes: 1 }));
        assert_eq!(end, Position { after: 41, notes: 0 });
    }

    #[test]
    fn a_pack_that_is_not_what_its_headers_say_is_broken() {
        let mut b = Batch::default();
        b.push_frame(&delta(5, "a"));
        b.push(&note("x"));
        b.push_frame(&delta(6, "b"));
        let payload = &b.bytes()[..b.len() - 1];
        let at = |after, notes| Position { after, notes };
        assert_eq!(unpack(at(5, 0), at(6, 0), payload).unwrap().len(), 3);
        for (first, last) in [
            (at(4, 0), at(6, 0)),
            (at(5, 1), at(6, 0)),
            (at(5, 0), at(7, 0)),
            (at(5, 0), at(6, 1)),
        ] {
            assert!(
                matches!(unpack(first, last, payload), Err(Broken::Pack(_))),
                "{first:?}..{last:?}"
            );
        }
        // One record is no pack; an unreadable line is no record.
        let one = b.records().next().unwrap().1;
        assert!(unpack(at(5, 0), at(5, 0), one).is_err());
        assert!(unpack(at(5, 0), at(6, 0), b"{\"event\":{\"seq\":5\n{").is_err());
        // A replay takes the events after its cursor and sees every seq.
        let mut seen = Vec::new();
        let events = events_after(payload, 5, |s| seen.push(s)).unwrap();
        assert_eq!((seen, events.len(), events[0].0), (vec![5, 6], 1, 6));
        let mut gap = b.bytes().to_vec();
        gap.extend_from_slice(&b.bytes()[..b.records().next().unwrap().1.len()]);
        assert!(events_after(&gap, 0, |_| {}).is_err(), "event 5 after 6");
    }

    #[test]
    fn a_pack_header_is_a_position_and_never_on_a_part() {
        let mut h = HeaderMap::new();
        assert_eq!(first_of(&h), Ok(None));
        h.insert(H_FIRST, "12.3");
        assert_eq!(first_of(&h), Ok(Some(Position { after: 12, notes: 3 })));
        for bad in ["", "x", "0", "3.0", "-1", "1.2.3"] {
            let mut h = HeaderMap::new();
            h.insert(H_FIRST, bad);
            assert!(first_of(&h).is_err(), "{bad:?}");
        }
        h.insert(H_PART, "1/2");
        assert!(first_of(&h).is_err());
    }
}
