//! The gRPC adapter: the tonic `AgentService` implementation (the only implementation; REST calls it too) and the core-to-wire conversions.

pub mod convert;
pub(crate) mod enums;
pub mod service;

pub use service::AgentApi;
