//! Build script: compiles `proto/` with a pure-Rust protobuf compiler (no system `protoc`).

use std::error::Error;
use std::path::PathBuf;

use prost::Message;

/// The proto files that define floodgate's gRPC surface; the rest are their imports.
const PROTOS: &[&str] = &["envoy/service/ratelimit/v3/rls.proto"];

fn main() -> Result<(), Box<dyn Error>> {
    compile_protos()?;
    Ok(())
}

/// Generates prost messages, tonic client and server, and pbjson serde impls (proto3 JSON for
/// the admin `/json` endpoint) from one descriptor set.
fn compile_protos() -> Result<(), Box<dyn Error>> {
    println!("cargo:rerun-if-changed=proto");
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    let descriptors = protox::compile(PROTOS, ["proto"])?;
    let descriptor_bytes = descriptors.encode_to_vec();
    std::fs::write(out_dir.join("rls_descriptor.bin"), &descriptor_bytes)?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_well_known_types(true)
        .extern_path(".google.protobuf", "::pbjson_types")
        .compile_fds(descriptors)?;
    pbjson_build::Builder::new()
        .register_descriptors(&descriptor_bytes)?
        .build(&[".envoy"])?;
    Ok(())
}
