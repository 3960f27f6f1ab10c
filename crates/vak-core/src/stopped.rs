//! Why a session's writes stopped for good: the one failure type carried from the log through the writer to the session, turned into text only where a client reads it.

use crate::error::{Error, ErrorKind};
use std::fmt;

/// The reason a session stops when its lease went to another replica.
pub const LEASE_LOST: &str = "lease_lost";
/// The text every append of a fenced log fails with.
pub const ANOTHER_WRITER: &str = "another writer appended to this session";
/// The text an append fails with once this replica lost the lease
/// (`JetStreamLog::stop`); it starts like the lost lease's own reason.
pub const LEASE_STOPPED: &str = "lease_lost: this replica no longer holds the session's lease";

/// Why a session's writer stopped. A log's append fails with an
/// `io::Error` carrying one of these (`Fenced`, `LeaseGoneAtAppend`) when it
/// refuses for good, so the writer and the hub read the cause from its
/// type, never from its text. `Display` is the cause alone; `reason` is
/// what clients see (`session_closed`, 503s, `/healthz`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stopped {
    /// An append failed (ENOSPC, EIO, EFBIG, a read-only home, a record too
    /// large for the bus, JetStream not answering): the error's kind and text.
    Storage {
        kind: std::io::ErrorKind,
        message: String,
    },
    /// The owner's renewal found the session's lease gone: `why`.
    LeaseLost { why: String },
    /// The log refused an append because the lease was lost meanwhile.
    LeaseGoneAtAppend { session: String },
    /// Another writer appended to the session's log: this one is fenced.
    /// `again`: the log was already fenced before this append.
    Fenced { session: String, again: bool },
    /// The session's writer task ended before it answered.
    WriterGone,
    /// A mirror's live path ended: it is followed afresh on its next use.
    LiveEnded,
    /// A mirror's session was deleted on the replica that wrote it.
    Deleted,
    /// A mirror never writes: every write is refused with `why` (the
    /// replica that does). Not a stop: one of the above replaces it.
    ReadOnly { why: String },
}

impl Stopped {
    /// A failed append as a stop: the cause it carries when the log refused
    /// for good, else a storage failure of the error's kind.
    pub fn from_append(e: std::io::Error) -> Stopped {
        let kind = e.kind();
        let message = e.to_string();
        match e.into_inner().map(|inner| inner.downcast::<Stopped>()) {
            Some(Ok(stopped)) => *stopped,
            _ => Stopped::Storage { kind, message },
        }
    }

    /// This stop as the error an append fails with (read back by `from_append`).
    pub fn into_io(self) -> std::io::Error {
        std::io::Error::other(self)
    }

    /// The stop an append's error carries, if the log refused for good.
    pub fn of_io(e: &std::io::Error) -> Option<&Stopped> {
        e.get_ref().and_then(|inner| inner.downcast_ref::<Stopped>())
    }

    /// Whether another replica writes the session now (the lease went, or
    /// another writer appended): it is looked up afresh at once rather
    /// than answering with this failure for a while.
    pub fn moved(&self) -> bool {
        matches!(
            self,
            Stopped::LeaseLost { .. } | Stopped::LeaseGoneAtAppend { .. } | Stopped::Fenced { .. }
        )
    }

    /// The reason clients see: a failed or refused append is `storage_failed: <cause>`.
    pub fn reason(&self) -> String {
        match self {
            Stopped::Storage { .. } | Stopped::LeaseGoneAtAppend { .. } | Stopped::Fenced { .. } => {
                format!("storage_failed: {self}")
            }
            Stopped::LeaseLost { .. }
            | Stopped::WriterGone
            | Stopped::LiveEnded
            | Stopped::Deleted
            | Stopped::ReadOnly { .. } => self.to_string(),
        }
    }
}

impl fmt::Display for Stopped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Stopped::Storage { message, .. } => f.write_str(message),
            Stopped::LeaseLost { why } => write!(f, "{LEASE_LOST}: {why}"),
            Stopped::LeaseGoneAtAppend { session } => {
                write!(f, "{LEASE_STOPPED} ({session}): it stops writing it")
            }
            Stopped::Fenced { session, again } => {
                let tense = if *again { "stopped" } else { "stops" };
                write!(f, "{ANOTHER_WRITER} ({session}): this replica {tense} writing it")
            }
            Stopped::WriterGone => f.write_str("the session's writer stopped"),
            Stopped::LiveEnded => {
                f.write_str("the live path of this session ended; it is followed afresh on its next use")
            }
            Stopped::Deleted => f.write_str("the session was deleted"),
            Stopped::ReadOnly { why } => f.write_str(why),
        }
    }
}

impl std::error::Error for Stopped {}

/// A session that stopped refuses work as unavailable, with the reason.
impl From<Stopped> for Error {
    fn from(s: Stopped) -> Error {
        Error::new(ErrorKind::Unavailable, s.reason())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_stop_reads_as_today() {
        let cases = [
            (
                Stopped::Storage {
                    kind: std::io::ErrorKind::StorageFull,
                    message: "No space left on device (os error 28)".into(),
                },
                "storage_failed: No space left on device (os error 28)",
            ),
            (
                Stopped::LeaseLost {
                    why: "another replica took the lease".into(),
                },
                "lease_lost: another replica took the lease",
            ),
            (
                Stopped::LeaseGoneAtAppend { session: "s1".into() },
                "storage_failed: lease_lost: this replica no longer holds the session's lease (s1): it stops writing it",
            ),
            (
                Stopped::Fenced {
                    session: "s1".into(),
                    again: false,
                },
                "storage_failed: another writer appended to this session (s1): this replica stops writing it",
            ),
            (
                Stopped::Fenced {
                    session: "s1".into(),
                    again: true,
                },
                "storage_failed: another writer appended to this session (s1): this replica stopped writing it",
            ),
            (Stopped::WriterGone, "the session's writer stopped"),
            (
                Stopped::LiveEnded,
                "the live path of this session ended; it is followed afresh on its next use",
            ),
            (Stopped::Deleted, "the session was deleted"),
            (
                Stopped::ReadOnly {
                    why: "session s is written by replica r".into(),
                },
                "session s is written by replica r",
            ),
        ];
        for (stopped, reason) in cases {
            assert_eq!(stopped.reason(), reason);
            let moved = matches!(
                stopped,
                Stopped::LeaseLost { .. } | Stopped::LeaseGoneAtAppend { .. } | Stopped::Fenced { .. }
            );
            assert_eq!(stopped.moved(), moved, "{stopped:?}");
            let e = Error::from(stopped);
            assert_eq!((e.kind, e.message.as_str()), (ErrorKind::Unavailable, reason));
        }
    }

    #[test]
    fn an_append_error_keeps_its_cause_through_io() {
        let fenced = Stopped::Fenced {
            session: "s".into(),
            again: false,
        };
        let e = fenced.clone().into_io();
        assert_eq!(Stopped::of_io(&e), Some(&fenced));
        assert!(e.to_string().starts_with(ANOTHER_WRITER), "{e}");
        assert_eq!(Stopped::from_append(e), fenced);

        let disk = std::io::Error::new(std::io::ErrorKind::StorageFull, "disk full");
        assert_eq!(Stopped::of_io(&disk), None);
        assert_eq!(
            Stopped::from_append(disk),
            Stopped::Storage {
                kind: std::io::ErrorKind::StorageFull,
                message: "disk full".into()
            }
        );
        // An error wrapping some other error is a storage failure too.
        let other = std::io::Error::other(std::fmt::Error);
        assert!(matches!(
            Stopped::from_append(other),
            Stopped::Storage {
                kind: std::io::ErrorKind::Other,
                ..
            }
        ));
    }
}
