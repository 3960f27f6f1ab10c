//! A session's life: the live session, its admission, the runtime sessions share and the restore from a ledger, the agent loop (seeing the session through `context.rs`), approvals, side chat, lifecycle files, waiting for an outcome, attachments and the system prompt.

pub mod admission;
pub(crate) mod agent;
pub mod approvals;
pub mod attachments;
pub(crate) mod context;
pub(crate) mod derived;
pub(crate) mod hooks;
pub(crate) mod lifecycle;
pub mod live;
pub mod plan;
pub mod prompt;
pub(crate) mod receipts;
pub(crate) mod restore;
pub(crate) mod runtime;
pub mod side;
pub(crate) mod skill_proposal;
pub(crate) mod skill_tool;
pub(crate) mod spawn_tool;
pub(crate) mod steer;
pub mod wait;
