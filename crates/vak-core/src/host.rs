//! What the server holds besides sessions' logs: the hub, with its registry of live sessions and their recovery and its control plane; config and keys, rules, memory, search, workspaces, the session index, files, diffs, terminals, dev servers and the PR view.

pub mod agent_settings;
pub mod backup;
pub mod children;
pub mod config;
pub mod control;
pub mod diff;
pub mod doctor;
pub mod files;
pub mod hooks;
pub mod hub;
pub(crate) mod index;
pub mod launch;
pub mod memory;
pub mod portfolio;
pub mod pr;
pub mod receipts;
pub(crate) mod recovery;
pub mod registry;
pub mod rules;
pub(crate) mod runtimes;
pub mod search;
pub(crate) mod secrets;
pub mod tasks;
pub mod terminal;
pub mod workspaces;
pub mod worktree;
