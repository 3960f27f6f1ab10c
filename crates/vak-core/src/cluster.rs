//! Several replicas on one NATS JetStream (`--bus`): the log in JetStream, session leases and takeover, the shared index, config and memory, mirrors, and how NATS is reached.

pub(crate) mod cluster_secret;
pub mod jetstream;
pub(crate) mod mirror;
pub mod nats_connect;
pub mod owners;
pub mod shared_config;
pub mod shared_index;
pub mod shared_memory;
pub mod shared_tasks;
pub(crate) mod takeover;
