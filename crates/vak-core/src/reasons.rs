//! Closed sets a stream's frames name (why a resync, why a stream closed, which surface a client came from): core branches on these types; their wire strings (`as_str`) are made only at the edge.

use super::stopped::Stopped;

/// Why a subscription resyncs instead of going on from its cursor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResyncReason {
    /// The cursor is past the session's latest seq.
    CursorAhead,
    /// The cursor is older than the ring and the log can no longer serve it.
    CursorTooOld,
    /// The ledger recorded losing the seqs after the cursor (`Record::Lost`).
    HistoryLost,
    /// History after the cursor is missing without such a record.
    HistoryUnavailable,
}

impl ResyncReason {
    pub fn as_str(self) -> &'static str {
        match self {
            ResyncReason::CursorAhead => "cursor_ahead",
            ResyncReason::CursorTooOld => "cursor_too_old",
            ResyncReason::HistoryLost => "history_lost",
            ResyncReason::HistoryUnavailable => "history_unavailable",
        }
    }
}

/// Why a session's streams end (`session_closed`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CloseReason {
    /// The server is shutting down.
    ShuttingDown,
    /// The session was deleted.
    Deleted,
    /// The session's writes stopped (a storage failure, a lost lease, a fence).
    Stopped(Stopped),
}

impl CloseReason {
    /// The reason a client reads (`session_closed {reason}`).
    pub fn as_str(&self) -> std::borrow::Cow<'static, str> {
        match self {
            CloseReason::ShuttingDown => "server shutting down".into(),
            CloseReason::Deleted => "deleted".into(),
            CloseReason::Stopped(s) => s.reason().into(),
        }
    }
}

/// Which surface a client's stream came through, for coworking frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Surface {
    /// A REST/SSE stream.
    Sse,
    /// A gRPC (or gRPC-web) stream.
    Grpc,
    /// The multiplexed `GET /stream` (or `Stream` RPC).
    Stream,
}

impl Surface {
    pub fn as_str(self) -> &'static str {
        match self {
            Surface::Sse => "sse",
            Surface::Grpc => "grpc",
            Surface::Stream => "stream",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_resync_reason_has_its_wire_string() {
        let all = [
            (ResyncReason::CursorAhead, "cursor_ahead"),
            (ResyncReason::CursorTooOld, "cursor_too_old"),
            (ResyncReason::HistoryLost, "history_lost"),
            (ResyncReason::HistoryUnavailable, "history_unavailable"),
        ];
        for (r, s) in all {
            assert_eq!(r.as_str(), s);
        }
    }

    #[test]
    fn every_close_reason_has_its_wire_string() {
        let all = [
            (CloseReason::ShuttingDown, "server shutting down".to_string()),
            (CloseReason::Deleted, "deleted".to_string()),
            (
                CloseReason::Stopped(Stopped::LeaseLost { why: "gone".into() }),
                "lease_lost: gone".to_string(),
            ),
            (
                CloseReason::Stopped(Stopped::Storage {
                    kind: std::io::ErrorKind::Other,
                    message: "EIO".into(),
                }),
                "storage_failed: EIO".to_string(),
            ),
        ];
        for (r, s) in all {
            assert_eq!(r.as_str(), s);
        }
    }

    #[test]
    fn every_surface_has_its_wire_string() {
        let all = [
            (Surface::Sse, "sse"),
            (Surface::Grpc, "grpc"),
            (Surface::Stream, "stream"),
        ];
        for (r, s) in all {
            assert_eq!(r.as_str(), s);
        }
    }
}
