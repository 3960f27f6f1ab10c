//! vak: a server for AI coding agents. One headless agent core, served to
//! every surface (gRPC, gRPC-web, REST/SSE) on one port.
//!
//! # Layout
//!
//! The modules follow the data path of a request and of the events it causes:
//!
//! - [`cli`]: `vak serve` parses flags, prepares the home, binds the listener.
//! - [`edge::listener`]: the accept loop (plain or TLS via [`edge::tls`]), timeouts.
//! - [`edge::server`]: the one router; gRPC, gRPC-web and REST/SSE share it.
//! - [`edge::auth`]: every request passes Host pinning, the origin rules and
//!   the credential check; [`edge::limits`] caps open streams.
//! - [`edge::grpc`]: the tonic `AgentService`, the only service implementation;
//!   [`edge::grpc::convert`] holds every core-to-wire conversion.
//! - [`edge::http`]: REST routes and SSE framing, translated onto that service;
//!   [`edge::http::json`] is the proto3 JSON mapping.
//! - [`edge::errors`]: the one table from core errors to gRPC codes and HTTP statuses.
//! - [`core`]: knows nothing of the wire. [`core::hub`] holds the sessions,
//!   [`core::session`] admits input into turn chains, [`core::agent`] runs a leg
//!   against a [`core::provider`] and [`core::tools`], [`core::approvals`] parks
//!   permission asks, and events flow through [`core::bus`] (numbered, persisted
//!   by [`core::ledger`], folded into [`core::transcript`] and
//!   [`core::presentation`]) to every subscriber; [`core::mux`] puts many
//!   sessions on one stream under one [`core::cursor`] vector.
//! - [`proto`]: the code build.rs generates from proto/.
//! - [`term`]: `vak term`, a client of the server over the same API (REST/SSE or gRPC).
//! - [`text`]: wording the server and vak term share (counts with their nouns).

pub mod cli;
pub mod core;
pub mod edge;
pub mod error;
pub mod home;
pub mod proto;
pub mod term;
pub mod text;

pub use error::{Error, ErrorKind, Result};
