//! The gRPC adapter: the tonic `AgentService` implementation (the only implementation; REST calls it too) and the core-to-wire conversions.

pub(crate) mod commitments;
pub(crate) mod convert;
pub(crate) mod enums;
pub(crate) mod goal;
pub(crate) mod intent;
pub(crate) mod service;

pub(crate) use service::AgentApi;
