//! Build script: compiles `proto/` with a pure-Rust protobuf compiler (no system `protoc`)
//! and stamps the git revision into the binary for `--version`.

use std::error::Error;
use std::path::Path;
use std::process::Command;

use prost::Message;

/// The proto files that define floodgate's gRPC surface (the RLS and RLQS it serves, the ADS
/// it subscribes to and the rule resource it receives); the rest are their imports.
const PROTOS: &[&str] = &[
    "envoy/service/ratelimit/v3/rls.proto",
    "envoy/service/discovery/v3/ads.proto",
    "ratelimit/config/ratelimit/v3/rls_conf.proto",
    "envoy/service/rate_limit_quota/v3/rlqs.proto",
];

fn main() -> Result<(), Box<dyn Error>> {
    println!("cargo:rerun-if-changed=build.rs");
    stamp_git_sha();
    compile_protos()
}

/// Generates prost messages, tonic client and server, and pbjson serde impls (proto3 JSON for
/// the admin `/json` endpoint) from one descriptor set.
fn compile_protos() -> Result<(), Box<dyn Error>> {
    println!("cargo:rerun-if-changed=proto");
    let descriptors = protox::compile(PROTOS, ["proto"])?;
    let descriptor_bytes = descriptors.encode_to_vec();
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_well_known_types(true)
        .extern_path(".google.protobuf", "::pbjson_types")
        .compile_fds(descriptors)?;
    pbjson_build::Builder::new()
        .register_descriptors(&descriptor_bytes)?
        .build(&[".envoy", ".google.rpc", ".ratelimit"])?;
    Ok(())
}

/// Sets `FLOODGATE_GIT_SHA` to the short commit hash, or `unknown` outside a git checkout
/// (a source tarball, or no git installed), and reruns only when HEAD moves.
fn stamp_git_sha() {
    // A build without `.git` (a container build context) can pass the revision in.
    println!("cargo:rerun-if-env-changed=FLOODGATE_GIT_SHA");
    let given = std::env::var("FLOODGATE_GIT_SHA")
        .ok()
        .filter(|sha| !sha.is_empty());
    let sha = given
        .or_else(|| git(&["rev-parse", "--short", "HEAD"]))
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=FLOODGATE_GIT_SHA={sha}");
    // In a worktree `.git` is a file, so ask git where HEAD and the branch ref live. Only
    // existing paths are emitted: cargo treats a missing one as always changed.
    let git_dir = git(&["rev-parse", "--git-dir"]);
    let common_dir = git(&["rev-parse", "--git-common-dir"]);
    let branch = git(&["symbolic-ref", "-q", "HEAD"]);
    let mut watched = Vec::new();
    if let Some(dir) = &git_dir {
        watched.push(Path::new(dir).join("HEAD"));
    }
    if let Some(dir) = &common_dir {
        watched.push(Path::new(dir).join("packed-refs"));
        if let Some(branch) = &branch {
            watched.push(Path::new(dir).join(branch));
        }
    }
    for path in watched.iter().filter(|path| path.exists()) {
        println!("cargo:rerun-if-changed={}", path.display());
    }
}

/// Runs git in the package directory; `None` if git is missing or fails.
fn git(args: &[&str]) -> Option<String> {
    let dir = std::env::var_os("CARGO_MANIFEST_DIR")?;
    let output = Command::new("git")
        .args(args)
        .current_dir(&dir)
        .output()
        .ok()?;
    let text = String::from_utf8(output.stdout).ok()?;
    let text = text.trim();
    (output.status.success() && !text.is_empty()).then(|| text.to_owned())
}
