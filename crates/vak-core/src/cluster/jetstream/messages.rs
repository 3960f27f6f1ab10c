//! What a writer batch becomes on a session's subject: one planned message per record (or per part of a large one), each with its position `(n, k)`.

use super::chunks;
use super::{ATOMIC_MAX, H_NOTE, H_SEQ};
use crate::log::ledger::{Batch, Record};
use async_nats::HeaderMap;

/// Where the next note goes: after event `after`, as its `k`-th note.
/// Ordered as the messages of a subject are: by event, then by note.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Position {
    /// The last event's seq (0: none yet).
    pub after: u64,
    /// Notes already written after it.
    pub notes: u64,
}

/// One message to publish.
#[derive(Debug, PartialEq)]
pub(crate) struct Planned<'a> {
    /// `Vak-Seq` when the (last) record is an event; None for a note.
    pub seq: Option<u64>,
    /// `Vak-Note` when the (last) record is a note: (the event it follows, k).
    pub note: Option<(u64, u64)>,
    /// A pack of several whole records (`Vak-First`): the first one's
    /// position; `seq` or `note` is the last one's.
    pub first: Option<Position>,
    /// The first and last event seqs the message holds, if any.
    pub events: Option<(u64, u64)>,
    pub msg_id: String,
    pub payload: &'a [u8],
    /// A record larger than `room`: which part this is (`Vak-Part`, `Vak-Digest`).
    pub(crate) part: Option<chunks::Part>,
}

/// The messages of `batch` for `session`, starting at `pos`, consecutive
/// whole records packed into one message of at most `room` bytes (their
/// lines, newline-separated), a record larger than `room` cut in parts of
/// at most `room`; the position after them, and how many messages each
/// unit (a pack, a whole record or a record's parts) takes. Err for a
/// record that needs more parts than an atomic batch holds.
pub(crate) type Plan<'a> = (Vec<Planned<'a>>, Position, Vec<usize>);

/// Whole records gathered for one message.
struct Pack {
    first: Position,
    last: Position,
    events: Option<(u64, u64)>,
    bytes: std::ops::Range<usize>,
}

impl Pack {
    /// The message, under its last record's id (made here, once per
    /// message: a `format!` per record was 4% of a replica's CPU in a burst).
    fn planned<'a>(self, session: &str, bytes: &'a [u8]) -> Planned<'a> {
        let several = self.first != self.last;
        Planned {
            seq: (self.last.notes == 0).then_some(self.last.after),
            note: (self.last.notes > 0).then_some((self.last.after, self.last.notes)),
            first: several.then_some(self.first),
            events: self.events,
            msg_id: format!("{session}:{}", self.last.header()),
            payload: &bytes[self.bytes],
            part: None,
        }
    }
}

pub(crate) fn plan<'a>(
    session: &str,
    batch: &'a Batch,
    mut pos: Position,
    room: usize,
) -> std::result::Result<Plan<'a>, chunks::Oversize> {
    let bytes = batch.bytes();
    let (mut msgs, mut sizes) = (Vec::new(), Vec::new());
    let mut pack: Option<Pack> = None;
    for (seq, line) in batch.lines() {
        pos = match seq {
            Some(n) => Position { after: n, notes: 0 },
            None => Position {
                after: pos.after,
                notes: pos.notes + 1,
            },
        };
        let events = seq.map(|n| (n, n));
        let count = chunks::parts(line.len(), room);
        if count == 1 {
            match &mut pack {
                // The pack's lines and this one, newlines between, still fit.
                Some(p) if line.end - p.bytes.start <= room => {
                    p.last = pos;
                    p.bytes.end = line.end;
                    p.events = match (p.events, seq) {
                        (Some((first, _)), Some(n)) => Some((first, n)),
                        (None, Some(n)) => Some((n, n)),
                        (e, None) => e,
                    };
                }
                _ => {
                    if let Some(p) = pack.take() {
                        msgs.push(p.planned(session, bytes));
                        sizes.push(1);
                    }
                    pack = Some(Pack {
                        first: pos,
                        last: pos,
                        events,
                        bytes: line,
                    });
                }
            }
            continue;
        }
        if let Some(p) = pack.take() {
            msgs.push(p.planned(session, bytes));
            sizes.push(1);
        }
        if count > ATOMIC_MAX {
            return Err(chunks::Oversize {
                bytes: line.len(),
                room,
            });
        }
        let payload = &bytes[line];
        let digest = chunks::digest(payload);
        let msg_id = format!("{session}:{}", pos.header());
        for (i, piece) in payload.chunks(room).enumerate() {
            msgs.push(Planned {
                seq,
                note: seq.is_none().then_some((pos.after, pos.notes)),
                first: None,
                events,
                msg_id: format!("{msg_id}/{}", i + 1),
                payload: piece,
                part: Some(chunks::Part {
                    index: i + 1,
                    count,
                    digest: digest.clone(),
                }),
            });
        }
        sizes.push(count);
    }
    if let Some(p) = pack.take() {
        msgs.push(p.planned(session, bytes));
        sizes.push(1);
    }
    Ok((msgs, pos, sizes))
}

impl Position {
    /// How a position is written in `Vak-First` (and in message ids): `n`
    /// for event n, `n.k` for the k-th note after it.
    pub(crate) fn header(self) -> String {
        if self.notes == 0 {
            self.after.to_string()
        } else {
            format!("{}.{}", self.after, self.notes)
        }
    }

    /// A position written by `header`.
    pub(crate) fn parse(value: &str) -> Option<Position> {
        let (after, notes) = match value.split_once('.') {
            Some((after, k)) => (after.parse().ok()?, k.parse().ok().filter(|k| *k > 0)?),
            None => (value.parse().ok().filter(|n| *n > 0)?, 0),
        };
        Some(Position { after, notes })
    }

    /// Whether a message at `next` comes right after one at `self` on a
    /// subject: the next event, or the next note after the same event.
    pub fn followed_by(self, next: Position) -> bool {
        next == Position {
            after: self.after + 1,
            notes: 0,
        } || next
            == Position {
                after: self.after,
                notes: self.notes + 1,
            }
    }
}

/// One stored message of a session's subject, as a mirror applies it.
#[derive(Debug)]
pub struct Stored {
    pub stream_seq: u64,
    pub position: Position,
    pub record: Record,
}

/// The position a stored message leaves the log at, from its headers.
pub(crate) fn position_of(headers: &HeaderMap) -> Option<Position> {
    if let Some(seq) = headers.get(H_SEQ) {
        return Some(Position {
            after: seq.as_str().parse().ok()?,
            notes: 0,
        });
    }
    let note = headers.get(H_NOTE)?;
    let (after, k) = note.as_str().split_once('.')?;
    Some(Position {
        after: after.parse().ok()?,
        notes: k.parse().ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{ClientEvent, Frame};

    fn frame(seq: u64) -> Frame {
        Frame::new(
            seq,
            "s".into(),
            ClientEvent::TextDelta {
                text: format!("t{seq}"),
            },
        )
    }

    #[test]
    fn every_message_of_a_session_has_its_own_id_and_notes_count_on_across_batches() {
        let mut b1 = Batch::default();
        b1.push(&Record::Admitted {
            request_id: "r".into(),
        });
        b1.push_frame(&frame(1));
        b1.push_frame(&frame(2));
        b1.push(&Record::Signature {
            signature: "x".into(),
        });
        // Room for one record per message (no two of these lines fit in one).
        let one = |b: &Batch| b.records().map(|(_, l)| l.len()).max().unwrap();
        let (m1, pos, _) = plan("s", &b1, Position::default(), one(&b1)).unwrap();
        let ids: Vec<_> = m1.iter().map(|m| m.msg_id.as_str()).collect();
        assert_eq!(ids, ["s:0.1", "s:1", "s:2", "s:2.1"]);
        assert!(m1.iter().all(|m| m.first.is_none()));
        assert_eq!(m1[1].seq, Some(1));
        assert_eq!(m1[3].note, Some((2, 1)));
        assert_eq!(pos, Position { after: 2, notes: 1 });
        assert!(m1[1].payload.starts_with(br#"{"event":{"seq":1"#));
        assert!(!m1[1].payload.ends_with(b"\n"));

        // A batch of notes only goes on counting after the same event.
        let mut b2 = Batch::default();
        b2.push(&Record::Admitted {
            request_id: "q".into(),
        });
        let (m2, pos, _) = plan("s", &b2, pos, one(&b2)).unwrap();
        assert_eq!(m2[0].msg_id, "s:2.2");
        assert_eq!(pos, Position { after: 2, notes: 2 });
        let mut b3 = Batch::default();
        b3.push_frame(&frame(3));
        b3.push(&Record::Admitted {
            request_id: "z".into(),
        });
        let (m3, _, _) = plan("s", &b3, pos, one(&b3)).unwrap();
        let ids: Vec<_> = m3.iter().map(|m| m.msg_id.as_str()).collect();
        assert_eq!(ids, ["s:3", "s:3.1"]);

        // With room for all, the batch is one pack under its last record's id.
        let (m, pos, sizes) = plan("s", &b1, Position::default(), 1 << 20).unwrap();
        assert_eq!((m.len(), sizes, m[0].msg_id.as_str()), (1, vec![1], "s:2.1"));
        assert_eq!(
            (m[0].first, m[0].note, m[0].seq),
            (Some(Position { after: 0, notes: 1 }), Some((2, 1)), None)
        );
        assert_eq!(
            (m[0].events, pos),
            (Some((1, 2)), Position { after: 2, notes: 1 })
        );
        assert_eq!(m[0].payload, &b1.bytes()[..b1.len() - 1]);
    }

    #[test]
    fn a_position_is_read_back_from_the_headers_it_was_written_with() {
        let mut h = HeaderMap::new();
        h.insert(H_SEQ, "41");
        assert_eq!(position_of(&h), Some(Position { after: 41, notes: 0 }));
        let mut h = HeaderMap::new();
        h.insert(H_NOTE, "41.3");
        assert_eq!(position_of(&h), Some(Position { after: 41, notes: 3 }));
        assert_eq!(position_of(&HeaderMap::new()), None);
    }

    #[test]
    fn a_mirror_applies_only_the_message_right_after_the_last_and_orders_the_rest() {
        let at = |after, notes| Position { after, notes };
        // After event 4: event 5, or the first note after 4.
        assert!(at(4, 0).followed_by(at(5, 0)));
        assert!(at(4, 0).followed_by(at(4, 1)));
        // After a note: the next note, or the next event.
        assert!(at(4, 2).followed_by(at(4, 3)));
        assert!(at(4, 2).followed_by(at(5, 0)));
        // Anything further on is a gap to fill, never applied as it is.
        for gap in [at(6, 0), at(4, 3), at(5, 1)] {
            assert!(!at(4, 1).followed_by(gap), "{gap:?}");
        }
        // Duplicates (a message read already) order at or before the last.
        assert!(at(4, 1) <= at(4, 1) && at(3, 9) < at(4, 0) && at(4, 0) < at(4, 1));
    }
}
