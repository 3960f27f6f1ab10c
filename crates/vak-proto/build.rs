//! Compiles proto/ with protox (pure Rust, no system protoc) and tonic-prost-build, and writes the REST façade's OpenAPI document from the same descriptors.
//! The encoded descriptor set is kept for gRPC reflection; a copy with the enum values named by their JSON names
//! (build/enum_json.rs) feeds the proto3 JSON mapping.
//! Without the `wire` feature (vak-core's view of this crate) it generates nothing.

#[path = "build/enum_json.rs"]
mod enum_json;
#[path = "build/openapi.rs"]
mod openapi;

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=../../proto");
    println!("cargo:rerun-if-changed=build");
    if std::env::var_os("CARGO_FEATURE_WIRE").is_none() {
        return Ok(());
    }
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    let mut compiler = protox::Compiler::new(["../../proto"])?;
    compiler.include_source_info(true).include_imports(true);
    compiler.open_files(["vak/v1/agent.proto"])?;
    let fds = compiler.file_descriptor_set();
    let pool = compiler.descriptor_pool();
    let doc = openapi::document(&pool);
    std::fs::write(
        out.join("openapi.json"),
        serde_json::to_string_pretty(&doc)? + "\n",
    )?;
    std::fs::write(
        out.join("vak_descriptor.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    std::fs::write(
        out.join("vak_json_descriptor.bin"),
        prost::Message::encode_to_vec(&enum_json::json_descriptor_set(&pool, &fds)),
    )?;
    std::fs::write(out.join("vak.v1.json_names.rs"), enum_json::rust(&pool))?;
    let mut config = prost_build::Config::new();
    config.enable_type_names();
    // A child's record is large next to the other events' payloads: boxed,
    // so every `Event` (and each frame a stream moves) stays small.
    config.boxed(".vak.v1.WorkerEvent.worker");
    config.boxed(".vak.v1.Workbench.candidate");
    // So is a commitment (and a plan item's copy of it).
    config.boxed(".vak.v1.CommitmentEvent.commitment");
    config.boxed(".vak.v1.TimelineItem.commitment");
    config.boxed(".vak.v1.GoalUpdateEvent.update");
    config.boxed(".vak.v1.OutputTimeline.goal");
    config.boxed(".vak.v1.PresentationEvent.kind.goal");
    tonic_prost_build::configure()
        // A small first encode buffer per RPC (src/codec.rs).
        .codec_path("crate::codec::SmallBufferCodec")
        .build_client(true)
        .build_server(true)
        .compile_fds_with_config(fds, config)?;
    Ok(())
}
