//! vak's wire contract and the leaf types every crate shares: the code generated from
//! proto/ by build.rs with its descriptor set and proto3 JSON mapping (feature `wire`),
//! the one error type, id validation, the home's server.json, SSE frames and wording.
//!
//! vak-core depends on this crate without `wire`, so the core sees the leaf modules only;
//! vak-term and vak-bench depend on it and on nothing else of vak's.

pub mod error;
pub mod home;
pub mod ids;
pub mod sse;
pub mod text;

pub use error::{Error, ErrorKind, Result};

#[cfg(feature = "wire")]
pub mod codec;
#[cfg(feature = "wire")]
pub mod json;

#[cfg(feature = "wire")]
#[allow(clippy::all, missing_docs)]
pub mod v1 {
    tonic::include_proto!("vak.v1");
    include!(concat!(env!("OUT_DIR"), "/vak.v1.json_names.rs"));
}

/// The encoded `FileDescriptorSet` of proto/: feeds gRPC reflection.
#[cfg(feature = "wire")]
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/vak_descriptor.bin"));

/// The same set with vak's enum values named by their JSON names (crates/vak-proto/build/enum_json.rs): feeds the proto3 JSON mapping.
#[cfg(feature = "wire")]
pub(crate) const JSON_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/vak_json_descriptor.bin"));

/// The REST façade's OpenAPI 3.1 document, written by build.rs from the
/// routes the proto's `(vak.v1.http)` options name (served at /openapi.json).
#[cfg(feature = "wire")]
pub const OPENAPI_JSON: &str = include_str!(concat!(env!("OUT_DIR"), "/openapi.json"));
