//! Idempotent machine setup. Each step checks before it acts, so a second
//! run costs a few process spawns.

use std::{path::Path, process::Command};

use anyhow::{bail, Context, Result};

use crate::util::{output, run, workspace_root};

/// Debian packages: the eBPF toolchain (docs/toolchain.md), then what the
/// tests and benches run against (perf, bpftrace, bpftool, top, pidstat,
/// strace), then what `android-check` builds AOSP's tools with: clang for
/// the host bpfloader and time_in_state.c, Android's libbase/liblog/
/// libcutils/libselinux as Debian packages them, m4 + checkpolicy for the
/// platform policy, libsepol's static library for checkfc; then the kernel
/// matrix's (vm/): QEMU, the arm64 cross toolchain, busybox.
const APT_PACKAGES: &[&str] = &[
    "rustc-web",
    "libstd-rust-web-dev-bpf",
    "llvm-22-dev",
    "linux-perf",
    "bpftrace",
    "bpftool",
    "procps",
    "sysstat",
    "strace",
    "python3-venv",
    "clang-22",
    "android-libbase-dev",
    "android-liblog-dev",
    "android-libcutils-dev",
    "android-libselinux-dev",
    "libsepol-dev",
    "checkpolicy",
    // android-check 1d queries the compiled policy with sesearch.
    "setools",
    "m4",
    // perfetto-sdk-sys (the daemon's default `producer` feature) compiles
    // the Perfetto C SDK with the cc crate: a C++ compiler.
    "g++",
    // cargo xtask vm-test: QEMU for both guest arches (TCG), the arm64
    // cross linker with its C library, the guests' busybox, and the
    // decompressors of Debian's kernel modules.
    "qemu-system-x86",
    "qemu-system-arm",
    "gcc-aarch64-linux-gnu",
    "libc6-dev-arm64-cross",
    "binutils-aarch64-linux-gnu",
    "busybox-static",
    "xz-utils",
    "zstd",
    // cargo xtask bench offcpu: the guest's Debian root and its ext4 image.
    "debootstrap",
    "e2fsprogs",
];
const BPF_LINKER_VERSION: &str = "0.13.0";
const PERFETTO_PY_VERSION: &str = "0.59.1";

pub fn all() -> Result<()> {
    apt_packages()?;
    bpf_linker()?;
    python_venv()?;
    tracefs()?;
    Ok(())
}

fn is_installed(pkg: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", pkg])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
        .unwrap_or(false)
}

fn apt_packages() -> Result<()> {
    let missing: Vec<&str> = APT_PACKAGES
        .iter()
        .copied()
        .filter(|p| !is_installed(p))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!("xtask setup: installing {}", missing.join(" "));
    run(Command::new("apt-get").arg("update").arg("-qq"))?;
    run(Command::new("apt-get")
        .args(["install", "-y", "-qq", "--no-install-recommends"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive"))
}

fn cargo_bin_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_HOME")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| Path::new(&std::env::var("HOME").unwrap_or_default()).join(".cargo"))
        .join("bin")
}

fn bpf_linker() -> Result<()> {
    let bin = cargo_bin_dir().join("bpf-linker");
    if let Ok(v) = output(Command::new(&bin).arg("--version")) {
        if v.contains(BPF_LINKER_VERSION) {
            return Ok(());
        }
    }
    eprintln!("xtask setup: installing bpf-linker {BPF_LINKER_VERSION} against LLVM 22");
    // Without LLVM_PREFIX, bpf-linker's build finds /usr/bin/llvm-config (LLVM 14).
    run(
        Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .args([
                "install",
                &format!("bpf-linker@{BPF_LINKER_VERSION}"),
                "--locked",
                "--no-default-features",
                "--features",
                "llvm-22",
            ])
            .env("LLVM_PREFIX", "/usr/lib/llvm-22"),
    )
}

fn python_venv() -> Result<()> {
    let venv = workspace_root().join(".venv");
    let py = venv.join("bin/python");
    let ok = Command::new(&py)
        .args(["-c", &format!("import perfetto, importlib.metadata as m; assert m.version('perfetto') == '{PERFETTO_PY_VERSION}'")])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if ok {
        return Ok(());
    }
    eprintln!("xtask setup: creating .venv with perfetto=={PERFETTO_PY_VERSION}");
    run(Command::new("python3").arg("-m").arg("venv").arg(&venv))?;
    run(Command::new(&py).args([
        "-m",
        "pip",
        "install",
        "-q",
        &format!("perfetto=={PERFETTO_PY_VERSION}"),
    ]))
}

fn tracefs() -> Result<()> {
    for p in [
        "/sys/kernel/tracing/events",
        "/sys/kernel/debug/tracing/events",
    ] {
        if Path::new(p).is_dir() {
            return Ok(());
        }
    }
    eprintln!("xtask setup: mounting tracefs on /sys/kernel/tracing");
    run(Command::new("mount").args(["-t", "tracefs", "nodev", "/sys/kernel/tracing"]))
        .context("mounting tracefs (needs root)")?;
    if !Path::new("/sys/kernel/tracing/events").is_dir() {
        bail!("tracefs mounted but has no events/");
    }
    Ok(())
}
