//! Compiles proto/ with protox (pure Rust, no system protoc) and tonic-prost-build, and writes the REST façade's OpenAPI document from the same descriptors.
//! The encoded descriptor set is kept for gRPC reflection and the proto3 JSON mapping.
//! It also makes a rebuilt browser bundle (clients/web/dist-app) rebuild the crate.

#[path = "build/openapi.rs"]
mod openapi;

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    let mut compiler = protox::Compiler::new(["proto"])?;
    compiler.include_source_info(true).include_imports(true);
    compiler.open_files(["vak/v1/agent.proto"])?;
    let fds = compiler.file_descriptor_set();
    let doc = openapi::document(&compiler.descriptor_pool());
    std::fs::write(
        out.join("openapi.json"),
        serde_json::to_string_pretty(&doc)? + "\n",
    )?;
    std::fs::write(
        out.join("vak_descriptor.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    let mut config = prost_build::Config::new();
    config.enable_type_names();
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds_with_config(fds, config)?;
    println!("cargo:rerun-if-changed=proto");
    println!("cargo:rerun-if-changed=build");
    // src/edge/http/assets.rs embeds the browser bundle (`make app`) with include_dir, whose
    // macro tracks no files on stable: a changed bundle must rerun this script so the crate
    // is rebuilt with it. The folder always exists (its .gitignore is committed).
    println!("cargo:rerun-if-changed=clients/web/dist-app");
    Ok(())
}
