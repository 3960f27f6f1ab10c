//! What the server holds besides sessions' logs: the hub of live sessions and their recovery, config and keys, rules, memory, search, workspaces, the session index, files, diffs and terminals.

pub mod config;
pub mod diff;
pub mod files;
pub mod hub;
pub mod index;
pub mod memory;
pub(crate) mod recovery;
pub mod rules;
pub mod search;
pub mod secrets;
pub mod terminal;
pub mod workspaces;
