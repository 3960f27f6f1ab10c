//! The live path (`vak.live.<session>`, the stream's RePublish) as a mirror reads it: each message put back into the records it holds (one, a pack's, or a record's last part), or a gap to fill from the subject.

use super::chunks::{part_of, Assembler};
use super::{packs, position_of, Position, Stored};

/// What one message of the live path is to a mirror.
pub(crate) enum Live {
    /// The records of the message right after the last one applied (one,
    /// or a pack's), complete.
    Records(Vec<Stored>),
    /// Nothing to apply yet: a duplicate (at or before the last applied)
    /// or a part of the next record.
    Wait,
    /// Not what comes next (messages were missed, or it is unreadable):
    /// the subject is to be read after the last applied.
    Gap,
}

/// The live path's messages (`vak.live.<session>`) put back into records, for a mirror.
#[derive(Default)]
pub(crate) struct LiveRecords {
    parts: Assembler<Position>,
}

impl LiveRecords {
    /// What `msg` is after the record at `applied`.
    pub(crate) fn next(&mut self, msg: &async_nats::Message, applied: Position) -> Live {
        let Some(headers) = msg.headers.as_ref() else {
            return Live::Gap;
        };
        let stream_seq = headers.get("Nats-Sequence").and_then(|v| v.as_str().parse().ok());
        let (Some(stream_seq), Some(position)) = (stream_seq, position_of(headers)) else {
            return Live::Gap;
        };
        if position <= applied {
            return Live::Wait;
        }
        let first = match packs::first_of(headers) {
            Ok(first) => first,
            Err(_) => return Live::Gap,
        };
        if !applied.followed_by(first.unwrap_or(position)) {
            self.parts.reset();
            return Live::Gap;
        }
        if let Some(first) = first {
            return match packs::unpack(first, position, &msg.payload) {
                Ok(records) => Live::Records(
                    records
                        .into_iter()
                        .map(|(position, record)| Stored {
                            stream_seq,
                            position,
                            record,
                        })
                        .collect(),
                ),
                Err(broken) => {
                    tracing::debug!(
                        stream_seq,
                        "reading the subject instead of the live path: {broken}"
                    );
                    Live::Gap
                }
            };
        }
        let whole = part_of(headers).and_then(|part| self.parts.push(position, part, msg.payload.clone()));
        match whole {
            Ok(None) => Live::Wait,
            Ok(Some(bytes)) => match serde_json::from_slice(&bytes) {
                Ok(record) => Live::Records(vec![Stored {
                    stream_seq,
                    position,
                    record,
                }]),
                Err(_) => Live::Gap,
            },
            Err(broken) => {
                tracing::debug!(
                    stream_seq,
                    "reading the subject instead of the live path: {broken}"
                );
                self.parts.reset();
                Live::Gap
            }
        }
    }

    /// Forgets a record begun (the subject was read instead).
    pub(crate) fn reset(&mut self) {
        self.parts.reset();
    }
}

#[cfg(test)]
mod tests {
    use super::super::chunks::{digest, H_DIGEST, H_PART};
    use super::super::packs::tests::{delta, note};
    use super::super::plan;
    use super::packs::H_FIRST;
    use super::*;
    use crate::log::ledger::{Batch, Record};
    use async_nats::HeaderMap;
    use bytes::Bytes;

    #[test]
    fn a_mirror_applies_a_record_in_parts_once_its_last_part_came_and_reads_the_subject_for_a_broken_one() {
        let record = Record::Admitted {
            request_id: "r".repeat(50),
        };
        let line = serde_json::to_vec(&record).unwrap();
        // Republished messages: the position, the part, the stream sequence.
        let live = |stream_seq: u64, note: &str, part: Option<(usize, usize)>, payload: &[u8]| {
            let mut h = HeaderMap::new();
            h.insert("Nats-Sequence", stream_seq.to_string().as_str());
            h.insert(super::super::H_NOTE, note);
            if let Some((i, n)) = part {
                h.insert(H_PART, format!("{i}/{n}").as_str());
                h.insert(H_DIGEST, digest(&line).as_str());
            }
            async_nats::Message {
                subject: "vak.live.s".into(),
                reply: None,
                payload: Bytes::copy_from_slice(payload),
                headers: Some(h),
                status: None,
                description: None,
                length: 0,
            }
        };
        let pieces: Vec<&[u8]> = line.chunks(30).collect();
        assert_eq!(pieces.len(), 3);
        let at = |notes| Position { after: 4, notes };
        let mut r = LiveRecords::default();

        // Parts 1 and 2 wait, part 3 gives the record at its own stream sequence.
        assert!(matches!(
            r.next(&live(10, "4.1", Some((1, 3)), pieces[0]), at(0)),
            Live::Wait
        ));
        assert!(matches!(
            r.next(&live(11, "4.1", Some((2, 3)), pieces[1]), at(0)),
            Live::Wait
        ));
        match r.next(&live(12, "4.1", Some((3, 3)), pieces[2]), at(0)) {
            Live::Records(m) => {
                assert_eq!(m.len(), 1);
                assert_eq!((m[0].stream_seq, m[0].position), (12, at(1)));
                assert_eq!(m[0].record, record);
            }
            _ => panic!("the record, once whole"),
        }
        // A part read again (a duplicate) waits; a whole next note applies.
        assert!(matches!(
            r.next(&live(11, "4.1", Some((2, 3)), pieces[1]), at(1)),
            Live::Wait
        ));
        let small = serde_json::to_vec(&Record::Admitted {
            request_id: "s".into(),
        })
        .unwrap();
        assert!(matches!(
            r.next(&live(13, "4.2", None, &small), at(1)),
            Live::Records(_)
        ));

        // A part missing: the next message is a gap, and nothing partial is applied.
        assert!(matches!(
            r.next(&live(14, "4.3", Some((1, 3)), pieces[0]), at(2)),
            Live::Wait
        ));
        assert!(matches!(
            r.next(&live(16, "4.3", Some((3, 3)), pieces[2]), at(2)),
            Live::Gap
        ));
        // An altered part: a gap too.
        assert!(matches!(
            r.next(&live(14, "4.3", Some((1, 3)), pieces[0]), at(2)),
            Live::Wait
        ));
        assert!(matches!(
            r.next(&live(15, "4.3", Some((2, 3)), pieces[0]), at(2)),
            Live::Wait
        ));
        assert!(matches!(
            r.next(&live(16, "4.3", Some((3, 3)), pieces[2]), at(2)),
            Live::Gap
        ));
        // A message further on than the next: a gap, whatever was begun.
        assert!(matches!(r.next(&live(20, "4.5", None, &small), at(2)), Live::Gap));
    }

    #[test]
    fn a_mirror_applies_a_pack_that_follows_whole_skips_one_it_has_and_reads_past_a_gap() {
        let mut b = Batch::default();
        for seq in 3..=5 {
            b.push_frame(&delta(seq, "w"));
        }
        b.push(&note("n"));
        let (msgs, _, _) = plan("s", &b, Position { after: 2, notes: 0 }, 1 << 20).unwrap();
        let m = &msgs[0];
        let mut h = HeaderMap::new();
        h.insert("Nats-Sequence", "9");
        h.insert("Vak-Note", "5.1");
        h.insert(H_FIRST, m.first.unwrap().header().as_str());
        let msg = async_nats::Message {
            subject: "vak.live.s".into(),
            reply: None,
            payload: bytes::Bytes::copy_from_slice(m.payload),
            headers: Some(h),
            status: None,
            description: None,
            length: 0,
        };
        let at = |after, notes| Position { after, notes };
        let mut r = LiveRecords::default();
        match r.next(&msg, at(2, 0)) {
            Live::Records(got) => {
                let pos: Vec<_> = got.iter().map(|s| (s.stream_seq, s.position)).collect();
                assert_eq!(pos, [(9, at(3, 0)), (9, at(4, 0)), (9, at(5, 0)), (9, at(5, 1))]);
            }
            _ => panic!("the pack, whole"),
        }
        // Had already (read from the subject): waits; further on: a gap.
        assert!(matches!(r.next(&msg, at(5, 1)), Live::Wait));
        assert!(matches!(r.next(&msg, at(1, 0)), Live::Gap));
        assert!(
            matches!(r.next(&msg, at(3, 0)), Live::Gap),
            "overlapping: read from the subject"
        );
    }
}
