//! Compiles `outbox/v1/*.proto` with a pure-Rust compiler (protox), so no `protoc` is needed.
use std::path::PathBuf;

use prost::Message as _;

fn main() -> anyhow::Result<()> {
    let files = ["outbox/v1/outbox.proto", "outbox/v1/admin.proto"];
    for f in &files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["."])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    // Served by gRPC reflection so grpcurl works without the .proto files.
    std::fs::write(out.join("outbox_v1_descriptor.bin"), fds.encode_to_vec())?;
    tonic_prost_build::configure().compile_fds(fds)?;
    Ok(())
}
