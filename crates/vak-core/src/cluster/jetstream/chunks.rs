//! Records larger than a NATS message: cut into parts at write (`Vak-Part: i/n`, `Vak-Digest`), put back together and checked at every read.
//!
//! A NATS server refuses any message over its `max_payload` (1 MiB unless
//! configured), and a ledger record has no such bound: a tool result, a
//! padded delta or a snapshot of a long session can be several MiB. Such a
//! record is stored as `n` consecutive messages on its session's subject,
//! each with the record's own position headers (`Vak-Seq` or `Vak-Note`),
//! `Vak-Part: i/n` (i from 1) and `Vak-Digest: <sha256 of the whole record,
//! lowercase hex>`, all in the same atomic batch, so a reader finds all of
//! them or none. A reader shows a record only when its parts came in order,
//! complete, and their concatenation has the digest; anything else is a
//! `Broken` set, an error, never a partial record.

use super::Position;
use async_nats::HeaderMap;
use bytes::Bytes;
use std::fmt;

/// `i/n`: this message is part i (from 1) of a record cut into n.
pub(crate) const H_PART: &str = "Vak-Part";
/// The SHA-256 of the whole record (its JSON line), lowercase hex.
pub(crate) const H_DIGEST: &str = "Vak-Digest";

/// What the headers of one message take at most, as NATS counts them
/// against `max_payload` (`NATS/1.0\r\n`, every `name: value\r\n`, `\r\n`),
/// with every value at its longest: a 128-byte session id in
/// `Nats-Msg-Id`, 20-digit numbers, a pack's first position, a batch id
/// and sequence, a part and a digest (`a_message_s_headers_fit_in_their_room` checks it). A message's
/// payload gets `max_payload` minus this.
pub(crate) const HEADER_ROOM: usize = 1024;

/// The payload room of a message under `max_payload`: what a record (or
/// one part of it) may take. 0 when the server's limit leaves none.
pub(crate) fn room(max_payload: usize) -> usize {
    max_payload.saturating_sub(HEADER_ROOM)
}

/// How many messages a record of `len` bytes takes with `room` bytes per message.
pub(crate) fn parts(len: usize, room: usize) -> usize {
    if len <= room {
        1
    } else if room == 0 {
        usize::MAX
    } else {
        len.div_ceil(room)
    }
}

/// The SHA-256 of `bytes`, lowercase hex.
pub(crate) fn digest(bytes: &[u8]) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, bytes);
    d.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// The wire size of `headers` as NATS counts it against `max_payload`
/// (async-nats keeps its own count private).
pub(crate) fn wire_len(headers: &HeaderMap) -> usize {
    let mut len = b"NATS/1.0\r\n".len() + b"\r\n".len();
    for (name, values) in headers.iter() {
        let name: &str = name.as_ref();
        for v in values {
            len += name.len() + 2 + v.as_str().len() + 2;
        }
    }
    len
}

/// One message's part of a record cut in several.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Part {
    /// From 1.
    pub index: usize,
    /// At least 2.
    pub count: usize,
    /// `H_DIGEST`.
    pub digest: String,
}

impl Part {
    /// The `H_PART` value.
    pub(crate) fn header(&self) -> String {
        format!("{}/{}", self.index, self.count)
    }
}

/// The part a stored message is, from its headers: None for a whole record.
pub(crate) fn part_of(headers: &HeaderMap) -> Result<Option<Part>, Broken> {
    let Some(value) = headers.get(H_PART) else {
        return Ok(None);
    };
    let bad = || Broken::BadHeader(value.as_str().to_string());
    let (i, n) = value.as_str().split_once('/').ok_or_else(bad)?;
    let (index, count): (usize, usize) = (i.parse().map_err(|_| bad())?, n.parse().map_err(|_| bad())?);
    // A writer never cuts a record in more parts than an atomic batch holds.
    if !(2..=super::ATOMIC_MAX).contains(&count) || !(1..=count).contains(&index) {
        return Err(bad());
    }
    let digest = headers
        .get(H_DIGEST)
        .map(|d| d.as_str().to_string())
        .filter(|d| d.len() == 64)
        .ok_or(Broken::NoDigest)?;
    Ok(Some(Part { index, count, digest }))
}

/// Why the parts read cannot be shown as a record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Broken {
    /// A `Vak-Part` that is not `i/n` with 1 ≤ i ≤ n and 2 ≤ n ≤ 1000.
    BadHeader(String),
    /// A part with no 64-hex-digit `Vak-Digest`.
    NoDigest,
    /// A part other than the first with no record begun before it (the
    /// stream's retention dropped the first parts, or they are missing).
    Orphan { index: usize, count: usize },
    /// A record begun whose next part is not what came next.
    Incomplete { have: usize, count: usize },
    /// All parts, but their concatenation has another digest.
    DigestMismatch,
    /// A pack of records (`packs.rs`) that is not what its headers say.
    Pack(String),
}

impl fmt::Display for Broken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Broken::BadHeader(v) => write!(f, "a {H_PART} header {v:?} that is not i/n"),
            Broken::NoDigest => write!(f, "a part with no {H_DIGEST}"),
            Broken::Orphan { index, count } => {
                write!(f, "part {index} of {count} with no part 1 before it")
            }
            Broken::Incomplete { have, count } => {
                write!(f, "a record cut in {count} parts broken off after part {have}")
            }
            Broken::DigestMismatch => {
                write!(f, "a record whose parts do not match their {H_DIGEST}")
            }
            Broken::Pack(why) => write!(f, "a pack of records: {why}"),
        }
    }
}

/// The most a record begun reserves at once for its parts.
const PREALLOCATE: usize = 16 << 20;

/// A record begun and not yet complete.
struct Begun<K> {
    key: K,
    count: usize,
    digest: String,
    have: usize,
    bytes: Vec<u8>,
}

/// Puts records back together from the messages of a subject, read in
/// order: each message is a whole record or the next part of one. `K` is
/// what every part of one record shares (its position on the subject).
pub(crate) struct Assembler<K> {
    begun: Option<Begun<K>>,
}

impl<K: PartialEq> Default for Assembler<K> {
    fn default() -> Self {
        Assembler { begun: None }
    }
}

impl<K: PartialEq> Assembler<K> {
    /// Takes the next message: the record it completes (a whole record is
    /// complete at once), None while parts are missing, or why what was
    /// read cannot be a record (the parts so far are then dropped).
    pub(super) fn push(
        &mut self,
        key: K,
        part: Option<Part>,
        payload: Bytes,
    ) -> Result<Option<Bytes>, Broken> {
        let Some(part) = part else {
            return match self.begun.take() {
                None => Ok(Some(payload)),
                Some(b) => Err(Broken::Incomplete {
                    have: b.have,
                    count: b.count,
                }),
            };
        };
        let mut begun = match self.begun.take() {
            None if part.index == 1 => {
                // Every part but the last is as large as the first; what
                // headers claim is not trusted past `PREALLOCATE`.
                let guess = payload.len().saturating_mul(part.count).min(PREALLOCATE);
                let mut bytes = Vec::with_capacity(guess);
                bytes.extend_from_slice(&payload);
                self.begun = Some(Begun {
                    key,
                    count: part.count,
                    digest: part.digest,
                    have: 1,
                    bytes,
                });
                return Ok(None);
            }
            None => {
                return Err(Broken::Orphan {
                    index: part.index,
                    count: part.count,
                })
            }
            Some(b) => b,
        };
        if begun.key != key
            || begun.count != part.count
            || begun.digest != part.digest
            || part.index != begun.have + 1
        {
            return Err(Broken::Incomplete {
                have: begun.have,
                count: begun.count,
            });
        }
        begun.bytes.extend_from_slice(&payload);
        begun.have += 1;
        if begun.have < begun.count {
            self.begun = Some(begun);
            return Ok(None);
        }
        if digest(&begun.bytes) != begun.digest {
            return Err(Broken::DigestMismatch);
        }
        Ok(Some(Bytes::from(begun.bytes)))
    }

    /// Drops a record begun.
    pub(super) fn reset(&mut self) {
        self.begun = None;
    }

    /// A message that is no part comes next: an error if a record's parts
    /// were begun and not finished (the parts so far are then dropped).
    fn whole_next(&mut self) -> Result<(), Broken> {
        match self.begun.take() {
            None => Ok(()),
            Some(b) => Err(Broken::Incomplete {
                have: b.have,
                count: b.count,
            }),
        }
    }
}

/// Records read back from a subject's messages, read in order from a
/// record's first message on (`stored_after`, replays).
#[derive(Default)]
pub(crate) struct Records {
    parts: Assembler<Position>,
    /// Whether a record began: parts before the first are what the
    /// stream's retention (`max_msgs_per_subject`) left of an older record.
    started: bool,
}

impl Records {
    /// A pack (`packs.rs`) comes next: an error if a record's parts were
    /// begun and not finished.
    pub(super) fn pack_next(&mut self) -> Result<(), Broken> {
        self.started = true;
        self.parts.whole_next()
    }

    /// The record the message at `position` completes, None while its
    /// parts are missing, or why what was read is no record.
    pub(super) fn push(
        &mut self,
        position: Position,
        headers: &HeaderMap,
        payload: Bytes,
    ) -> Result<Option<Bytes>, Broken> {
        let part = part_of(headers)?;
        match self.parts.push(position, part, payload) {
            Err(Broken::Orphan { .. }) if !self.started => Ok(None),
            r => {
                self.started = true;
                r
            }
        }
    }
}

/// A record that cannot be stored: more parts than an atomic batch holds.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Oversize {
    /// The record's size.
    pub bytes: usize,
    /// The payload room of one message.
    pub room: usize,
}

impl fmt::Display for Oversize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "a record of {} bytes would take {} messages of at most {} bytes (the NATS server's \
             max_payload less {HEADER_ROOM} for headers), more than the {} an atomic batch holds",
            self.bytes,
            parts(self.bytes, self.room),
            self.room,
            super::ATOMIC_MAX
        )
    }
}

/// The atomic batches a writer batch goes as: consecutive ranges of its
/// messages, each at most `max` long, never cutting a record's parts
/// apart. `sizes` is how many messages each record takes, in order (each
/// at most `max`: `plan` refuses a larger record).
pub(crate) fn atomic_groups(
    sizes: impl IntoIterator<Item = usize>,
    max: usize,
) -> Vec<std::ops::Range<usize>> {
    let mut groups = Vec::new();
    let (mut start, mut end) = (0, 0);
    for n in sizes {
        if end - start + n > max && end > start {
            groups.push(start..end);
            start = end;
        }
        end += n;
    }
    if end > start {
        groups.push(start..end);
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The parts `payload` is written as with `room` bytes each, as headers and payloads.
    fn cut(payload: &[u8], room: usize) -> Vec<(Option<Part>, Bytes)> {
        let n = parts(payload.len(), room);
        if n == 1 {
            return vec![(None, Bytes::copy_from_slice(payload))];
        }
        let d = digest(payload);
        payload
            .chunks(room)
            .enumerate()
            .map(|(i, c)| {
                let part = Part {
                    index: i + 1,
                    count: n,
                    digest: d.clone(),
                };
                (Some(part), Bytes::copy_from_slice(c))
            })
            .collect()
    }

    fn assemble(msgs: Vec<(u64, Option<Part>, Bytes)>) -> Vec<Result<Bytes, Broken>> {
        let mut a = Assembler::default();
        msgs.into_iter()
            .filter_map(|(key, part, payload)| a.push(key, part, payload).transpose())
            .collect()
    }

    #[test]
    fn a_record_cut_in_parts_is_put_back_together_exactly() {
        let record: Vec<u8> = (0..10_000u32).flat_map(|i| i.to_le_bytes()).collect();
        for room in [1, 7, 4096, 39_999, 40_000, 1 << 20] {
            let parts = cut(&record, room);
            assert_eq!(parts.len(), record.len().div_ceil(room), "room {room}");
            assert!(parts.iter().all(|(_, p)| p.len() <= room));
            let got = assemble(parts.into_iter().map(|(part, p)| (7, part, p)).collect());
            assert_eq!(got, vec![Ok(Bytes::from(record.clone()))], "room {room}");
        }
        // Whole records on either side of a cut one come out in order.
        let mut msgs = vec![(1, None, Bytes::from_static(b"first"))];
        msgs.extend(cut(b"0123456789", 3).into_iter().map(|(part, p)| (2, part, p)));
        msgs.push((3, None, Bytes::from_static(b"last")));
        let got: Vec<_> = assemble(msgs).into_iter().map(Result::unwrap).collect();
        assert_eq!(got, [&b"first"[..], b"0123456789", b"last"]);
    }

    #[test]
    fn a_pack_after_parts_begun_and_not_finished_is_an_error() {
        let mut r = Records::default();
        let mut h = HeaderMap::new();
        h.insert(H_PART, "1/2");
        h.insert(H_DIGEST, digest(b"xy").as_str());
        let at = Position { after: 1, notes: 0 };
        assert_eq!(r.push(at, &h, Bytes::from_static(b"x")), Ok(None));
        assert_eq!(r.pack_next(), Err(Broken::Incomplete { have: 1, count: 2 }));
        // The parts so far are dropped: the next pack reads on.
        assert_eq!(r.pack_next(), Ok(()));
    }

    #[test]
    fn missing_reordered_or_altered_parts_are_an_error_never_a_partial_record() {
        let record = b"abcdefghijklmnopqrstuvwxyz";
        let parts = |key| -> Vec<(u64, Option<Part>, Bytes)> {
            cut(record, 10)
                .into_iter()
                .map(|(part, p)| (key, part, p))
                .collect()
        };
        assert_eq!(parts(1).len(), 3);

        // The last part missing, then the next record.
        let mut msgs = parts(1);
        msgs.pop();
        msgs.push((2, None, Bytes::from_static(b"next")));
        assert_eq!(
            assemble(msgs),
            vec![Err(Broken::Incomplete { have: 2, count: 3 })]
        );

        // A part in the middle missing.
        let mut msgs = parts(1);
        msgs.remove(1);
        assert_eq!(
            assemble(msgs),
            vec![Err(Broken::Incomplete { have: 1, count: 3 })]
        );

        // Two parts swapped.
        let mut msgs = parts(1);
        msgs.swap(1, 2);
        assert_eq!(assemble(msgs)[0], Err(Broken::Incomplete { have: 1, count: 3 }));

        // A part of another record (another position) in between.
        let mut msgs = parts(1);
        msgs.insert(1, parts(2).remove(1));
        assert_eq!(assemble(msgs)[0], Err(Broken::Incomplete { have: 1, count: 3 }));

        // The first part missing: the rest are orphans.
        let mut msgs = parts(1);
        msgs.remove(0);
        assert_eq!(assemble(msgs)[0], Err(Broken::Orphan { index: 2, count: 3 }));

        // One byte changed.
        let mut msgs = parts(1);
        let mut altered = msgs[1].2.to_vec();
        altered[0] ^= 1;
        msgs[1].2 = altered.into();
        assert_eq!(assemble(msgs), vec![Err(Broken::DigestMismatch)]);

        // Nothing is left begun after an error: the next whole record reads.
        let mut a = Assembler::default();
        for (key, part, p) in parts(1).into_iter().take(2) {
            assert_eq!(a.push(key, part, p), Ok(None));
        }
        a.reset();
        assert_eq!(
            a.push(5, None, Bytes::from_static(b"x")),
            Ok(Some(Bytes::from_static(b"x")))
        );
    }

    #[test]
    fn part_headers_are_read_back_and_bad_ones_refused() {
        let d = digest(b"x");
        assert_eq!(d.len(), 64);
        let headers = |part: &str, digest: Option<&str>| {
            let mut h = HeaderMap::new();
            h.insert(H_PART, part);
            if let Some(d) = digest {
                h.insert(H_DIGEST, d);
            }
            h
        };
        assert_eq!(part_of(&HeaderMap::new()), Ok(None));
        assert_eq!(
            part_of(&headers("2/3", Some(&d))),
            Ok(Some(Part {
                index: 2,
                count: 3,
                digest: d.clone()
            }))
        );
        for bad in [
            "0/3",
            "4/3",
            "1/1",
            "1",
            "a/b",
            "1/-2",
            "",
            "1/1001",
            "1/99999999999",
        ] {
            assert_eq!(
                part_of(&headers(bad, Some(&d))),
                Err(Broken::BadHeader(bad.into())),
                "{bad}"
            );
        }
        assert_eq!(part_of(&headers("1/2", None)), Err(Broken::NoDigest));
        assert_eq!(part_of(&headers("1/2", Some("abc"))), Err(Broken::NoDigest));
    }

    #[test]
    fn a_message_s_headers_fit_in_their_room() {
        // Every header a message can carry, each value at its longest.
        let max = u64::MAX.to_string();
        let mut h = HeaderMap::new();
        let id = format!("{}:{max}.{max}/{max}", "s".repeat(128));
        h.insert("Nats-Msg-Id", id.as_str());
        h.insert("Vak-Writer", "0".repeat(32).as_str());
        // A replica name is a subject token of at most 128 bytes (owners.rs).
        h.insert("Vak-Replica", "r".repeat(128).as_str());
        h.insert("Vak-Seq", max.as_str());
        h.insert("Vak-Note", format!("{max}.{max}").as_str());
        h.insert(super::super::packs::H_FIRST, format!("{max}.{max}").as_str());
        h.insert(H_PART, format!("{max}/{max}").as_str());
        h.insert(H_DIGEST, digest(b"").as_str());
        h.insert("Nats-Expected-Last-Subject-Sequence", max.as_str());
        h.insert("Nats-Batch-Id", "0".repeat(32).as_str());
        h.insert("Nats-Batch-Sequence", max.as_str());
        h.insert("Nats-Batch-Commit", "1");
        let len = wire_len(&h);
        assert!(len <= HEADER_ROOM, "{len}");
        assert_eq!(room(HEADER_ROOM + 10), 10);
        assert_eq!(room(100), 0);
    }

    #[test]
    fn a_batch_is_planned_with_its_large_records_in_parts_under_their_own_ids() {
        use crate::log::ledger::{Batch, Record};
        let mut b = Batch::default();
        b.push(&Record::Admitted {
            request_id: "small".into(),
        });
        let big = Record::Admitted {
            request_id: "x".repeat(2500),
        };
        b.push(&big);
        let line = serde_json::to_vec(&big).unwrap();
        let (msgs, pos, sizes) = super::super::plan("s", &b, Position::default(), 1000).unwrap();
        assert_eq!(sizes, [1, 3]);
        assert_eq!(pos, Position { after: 0, notes: 2 });
        let ids: Vec<_> = msgs.iter().map(|m| m.msg_id.as_str()).collect();
        assert_eq!(ids, ["s:0.1", "s:0.2/1", "s:0.2/2", "s:0.2/3"]);
        assert!(msgs[0].part.is_none());
        let mut a = Assembler::default();
        let mut whole = None;
        for m in &msgs[1..] {
            assert_eq!(m.note, Some((0, 2)));
            let part = m.part.clone().unwrap();
            assert_eq!((part.count, part.digest.as_str()), (3, digest(&line).as_str()));
            whole = a
                .push(m.note, Some(part), Bytes::copy_from_slice(m.payload))
                .unwrap();
        }
        assert_eq!(whole.as_deref(), Some(&line[..]));
        // A record needing more parts than an atomic batch holds is refused whole.
        let err = super::super::plan("s", &b, Position::default(), 2).unwrap_err();
        assert_eq!(
            err,
            Oversize {
                bytes: line.len(),
                room: 2
            }
        );
    }

    #[test]
    fn parts_per_record() {
        assert_eq!(parts(0, 10), 1);
        assert_eq!(parts(10, 10), 1);
        assert_eq!(parts(11, 10), 2);
        assert_eq!(parts(5_000_000, 64 * 1024 - HEADER_ROOM), 78);
        assert_eq!(parts(11, 0), usize::MAX);
    }

    #[test]
    fn atomic_batches_hold_whole_records_and_at_most_max_messages() {
        assert_eq!(atomic_groups([1, 1, 1], 1000), vec![0..3]);
        assert!(atomic_groups([], 1000).is_empty());
        // A record's parts are never split across two batches.
        assert_eq!(atomic_groups([2, 3, 1, 4], 5), vec![0..5, 5..10]);
        assert_eq!(atomic_groups([2, 4, 1], 5), vec![0..2, 2..7]);
        assert_eq!(atomic_groups([5, 5], 5), vec![0..5, 5..10]);
        // 2500 single records: batches of 1000.
        assert_eq!(
            atomic_groups(std::iter::repeat_n(1, 2500), 1000),
            vec![0..1000, 1000..2000, 2000..2500]
        );
        let too_many = Oversize {
            bytes: 5_000_000,
            room: 1000,
        };
        assert!(too_many
            .to_string()
            .starts_with("a record of 5000000 bytes would take 5000 messages of at most 1000 bytes"));
    }
}
