//! vak: a server for AI coding agents. One headless agent core, served to
//! every surface (gRPC, gRPC-web, REST/SSE) on one port.
//!
//! This package is the `vak` command line over the workspace's crates (ARCHITECTURE.md):
//! [`vak_proto`] (the wire contract and shared leaf types), [`vak_core`] (the agent
//! core), [`vak_server`] (the edge) and [`vak_term`] (the terminal client). [`cli`]
//! parses `vak serve`, prepares the home and binds the listener.
//!
//! The integration tests (tests/) reach the crates through the names below.

pub mod backup;
pub mod cli;
pub mod doctor;
pub mod open;
pub mod otlp;

pub use vak_core as core;
pub use vak_core::home;
pub use vak_proto as proto;
pub use vak_proto::{Error, ErrorKind, Result};
pub use vak_server as edge;
pub use vak_term as term;
