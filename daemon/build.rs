//! Builds the eBPF object (`ebpf-programs/`) and hands its path to the daemon,
//! which embeds it with `include_bytes_aligned!`.
//!
//! The eBPF crate builds for `bpfel-unknown-none` with Debian's rustc and its
//! prebuilt core (docs/toolchain.md: rustup has no rust-src here, so no
//! build-std), in its own target dir so the host build keeps rustup's rustc.
//! `VITALS_EBPF_OBJ=<path>` skips the build and embeds a prebuilt object
//! (packaging, cross builds).

use std::{env, path::PathBuf, process::Command};

const BPF_RUSTC: &str = "/usr/bin/rustc";

fn main() {
    perfetto_shim();
    println!("cargo:rerun-if-env-changed=VITALS_EBPF_OBJ");
    if let Ok(obj) = env::var("VITALS_EBPF_OBJ") {
        println!("cargo:rerun-if-changed={obj}");
        println!("cargo:rustc-env=VITALS_EBPF_OBJ={obj}");
        return;
    }
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let root = manifest_dir.parent().unwrap().to_owned();
    for dir in [
        "ebpf-programs/src",
        "ebpf-programs/common/src",
        "ebpf-programs/Cargo.toml",
    ] {
        println!("cargo:rerun-if-changed={}", root.join(dir).display());
    }
    let arch = match env::var("CARGO_CFG_TARGET_ARCH").unwrap().as_str() {
        "x86_64" => "x86_64",
        "aarch64" => "aarch64",
        "riscv64" => "riscv64",
        other => panic!("vitalsd: no eBPF target arch mapping for {other}"),
    };
    if !std::path::Path::new(BPF_RUSTC).exists() {
        panic!(
            "vitalsd: {BPF_RUSTC} (Debian rustc-web) is missing; run `cargo xtask setup` \
             or set VITALS_EBPF_OBJ to a prebuilt object"
        );
    }
    // One eBPF target dir per architecture, since the object is built with
    // that architecture's `bpf_target_arch`: a cross build (aarch64, for
    // `cargo xtask vm-test`) must neither reuse nor overwrite the host's.
    // x86_64 keeps target/bpf, where VITALS_EBPF_OBJ users look for it.
    let target_dir = if arch == "x86_64" {
        root.join("target/bpf")
    } else {
        root.join(format!("target/bpf-{arch}"))
    };
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(&root)
        .args([
            "build",
            "-p",
            "vitals-ebpf",
            "--release",
            "--target",
            "bpfel-unknown-none",
            "--target-dir",
        ])
        .arg(&target_dir)
        .env("RUSTC", BPF_RUSTC)
        // aya-ebpf and vitals-ebpf enable an unstable feature on bpf
        // targets (asm_experimental_arch); naming the crates (not `1`)
        // keeps aya-build from asking for build-std.
        .env("RUSTC_BOOTSTRAP", "aya_ebpf,vitals_ebpf")
        .env(
            "CARGO_ENCODED_RUSTFLAGS",
            format!("--cfg=bpf_target_arch=\"{arch}\"\x1f-Cdebuginfo=2\x1f-Clink-arg=--btf"),
        );
    // The outer build's settings must not leak into the inner one.
    for var in [
        "RUSTC_WORKSPACE_WRAPPER",
        "RUSTC_WRAPPER",
        "RUSTFLAGS",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
        "CARGO_BUILD_RUSTFLAGS",
    ] {
        cmd.env_remove(var);
    }
    for (k, _) in env::vars() {
        if k.starts_with("CARGO_FEATURE_") || k.starts_with("CARGO_CFG_") || k == "CARGO_MAKEFLAGS"
        {
            cmd.env_remove(k);
        }
    }
    let status = cmd
        .status()
        .expect("vitalsd: running cargo for the eBPF crate");
    if !status.success() {
        panic!("vitalsd: building the eBPF crate failed ({status}); see the output above");
    }
    let obj = target_dir.join("bpfel-unknown-none/release/vitals-ebpf");
    println!("cargo:rustc-env=VITALS_EBPF_OBJ={}", obj.display());
}

/// With the `producer` feature (the Perfetto SDK), the C++ shim that gets
/// traced's reason for ending a session (`cc/perfetto_session_error.cc`),
/// built by the same kind of compiler as perfetto-sdk-sys builds the SDK.
fn perfetto_shim() {
    if env::var_os("CARGO_FEATURE_PRODUCER").is_none() {
        return;
    }
    let src = "cc/perfetto_session_error.cc";
    println!("cargo:rerun-if-changed={src}");
    let mut build = cc::Build::new();
    if env::var_os("CXX").is_none() && Command::new("clang++").arg("--version").output().is_ok() {
        build.compiler("clang++");
    }
    build
        .cpp(true)
        .std("c++17")
        .file(src)
        .compile("vitals_perfetto_shim");
}
