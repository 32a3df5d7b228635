//! Compiles `protos/*.proto` with protox (a pure-Rust protobuf compiler), so
//! building needs no system `protoc`, then generates prost code from the
//! resulting descriptor set.

use std::path::PathBuf;

const FILES: &[&str] = &[
    "trace_packet.proto",
    "system.proto",
    "track_event.proto",
    "ftrace.proto",
    "config.proto",
    "profiling.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("protos");
    println!("cargo:rerun-if-changed={}", dir.display());
    for f in FILES {
        println!("cargo:rerun-if-changed={}", dir.join(f).display());
    }

    let fds = protox::compile(FILES, [&dir])?;
    prost_build::Config::new()
        // Trace files can hold large repeated byte fields; keep them as Vec<u8>
        // (the default) and let callers decide about zero-copy later.
        .compile_fds(fds)?;
    Ok(())
}
