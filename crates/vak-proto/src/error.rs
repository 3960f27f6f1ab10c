//! The crate-wide error: a kind the edges branch on (to pick an HTTP status and a gRPC code) plus a message for humans.

use std::fmt;

/// What went wrong, in the terms a client can act on. The edge maps each kind
/// to exactly one HTTP status and one gRPC code (`edge::errors`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The request is malformed or misses a required field.
    InvalidArgument,
    /// The named session, approval or resource does not exist.
    NotFound,
    /// The request is well-formed but conflicts with the current state.
    Conflict,
    /// The server failed; the message says how.
    Internal,
    /// The server is shutting down.
    Unavailable,
    /// A bound was reached (a full queue); the message starts with the reason.
    ResourceExhausted,
    /// No model service is reachable for the provider asked for: no API key
    /// (in the environment or the key store) and no base URL of a local server.
    NoAiService,
    /// The model service was asked and failed; `reason` says how (`network`,
    /// `auth`, `rate_limit`, …).
    Upstream,
    /// A file or content is larger than the cap of the operation (a file read
    /// or written through the files API); the message names both sizes.
    TooLarge,
    /// The request is understood but this server will not do it for anyone
    /// (a path outside the configured roots, a feature turned off or
    /// limited to this machine); the message says which rule refused it.
    PermissionDenied,
    /// The operation ran past its time limit and was stopped (a search
    /// past its deadline); the message names the limit.
    DeadlineExceeded,
}

impl ErrorKind {
    /// The stable, snake_case code carried in `{"error": {"code"}}`.
    pub fn code(self) -> &'static str {
        match self {
            ErrorKind::InvalidArgument => "invalid_argument",
            ErrorKind::NotFound => "not_found",
            ErrorKind::Conflict => "conflict",
            ErrorKind::Internal => "internal",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::ResourceExhausted => "resource_exhausted",
            ErrorKind::NoAiService => "no_ai_service",
            ErrorKind::Upstream => "bad_gateway",
            // The same code as a request body over the limit: one code per status.
            ErrorKind::TooLarge => "payload_too_large",
            ErrorKind::PermissionDenied => "forbidden",
            ErrorKind::DeadlineExceeded => "deadline_exceeded",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    pub kind: ErrorKind,
    pub message: String,
    /// A machine-readable why, for kinds that have several (an upstream
    /// failure's `network`, `auth`, …); carried as `reason` in JSON bodies.
    pub reason: Option<&'static str>,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into(),
            reason: None,
        }
    }
    pub fn with_reason(mut self, reason: &'static str) -> Self {
        self.reason = Some(reason);
        self
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidArgument, message)
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, message)
    }
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Conflict, message)
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, message)
    }
    pub fn too_large(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::TooLarge, message)
    }
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::PermissionDenied, message)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::internal(format!("i/o error: {e}"))
    }
}
