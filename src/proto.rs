//! The code generated from proto/ by build.rs, and the encoded descriptor set it was compiled from.

#![allow(clippy::all, missing_docs)]

pub mod v1 {
    tonic::include_proto!("vak.v1");
}

/// The encoded `FileDescriptorSet` of proto/: feeds gRPC reflection and the proto3 JSON mapping.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/vak_descriptor.bin"));

/// The REST façade's OpenAPI 3.1 document, written by build.rs from the
/// routes the proto's `(vak.v1.http)` options name (served at /openapi.json).
pub const OPENAPI_JSON: &str = include_str!(concat!(env!("OUT_DIR"), "/openapi.json"));
