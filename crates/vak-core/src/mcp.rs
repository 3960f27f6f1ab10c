//! MCP servers (through the official Rust SDK, rmcp): one connection per configured server for the whole vak server, shared by every session, their tools offered to the model as `mcp__<server>__<tool>` and called through the same permission path as bash.

pub mod config;
mod env;
pub(crate) mod names;
mod result;
mod server;
mod servers;

pub use server::McpState;
pub use servers::{Mcp, ServerStatus};
