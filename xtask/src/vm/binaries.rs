//! The binaries a cell runs, built by cargo for its arch: the kernel test
//! binaries of tests/ (one per tests/tests/<file>.rs), the workload and
//! fake-perfetto helpers, the decoder relay, and vitalsd.
//!
//! x86_64 is the host build (`cargo xtask test` has usually built it
//! already). arm64 is a cross build: rustup cannot download targets here,
//! so it uses Debian's rustc (rustc-web, /usr/bin/rustc) with Debian's
//! arm64 standard library unpacked into a private sysroot (apt.rs), and
//! gcc-aarch64-linux-gnu as linker. daemon/build.rs builds the eBPF object
//! for the target arch (bpf_target_arch="aarch64"), so VITALS_EBPF_OBJ
//! (a host object) is not passed on.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{bail, Context, Result};

use super::{apt, Arch};
use crate::util::{cargo, workspace_root};

pub struct Binaries {
    /// tests/tests/<file>.rs → its test binary.
    pub tests: HashMap<String, PathBuf>,
    pub vitalsd: PathBuf,
    pub workload: PathBuf,
    pub fake_perfetto: PathBuf,
    /// tests/src/bin/vitals-vm-relay.rs: the guests' stand-in for Python.
    pub relay: PathBuf,
}

/// Builds (or finds up to date) everything a cell of `arch` runs.
pub fn build(arch: Arch) -> Result<Binaries> {
    let configure = |c: &mut Command| -> Result<()> {
        if arch == Arch::Arm64 {
            cross_env(c)?;
        }
        Ok(())
    };
    let mut test = cargo();
    test.args(["test", "-p", "vitals-tests", "--no-run"]);
    // Only the matrix's test files (the package's binaries come with them).
    for f in super::checks::TEST_FILES {
        test.args(["--test", f]);
    }
    configure(&mut test)?;
    let mut artifacts = artifacts_of(&mut test)?;
    let mut daemon = cargo();
    daemon.args(["build", "-p", "vitalsd", "--bin", "vitalsd"]);
    if arch == Arch::Arm64 {
        // No Perfetto producer in the guests (no matrix check needs it):
        // its vendored C++ SDK would need an arm64 C++ cross compiler.
        daemon.arg("--no-default-features");
    }
    configure(&mut daemon)?;
    artifacts.extend(artifacts_of(&mut daemon)?);

    let mut tests = HashMap::new();
    let mut bins = HashMap::new();
    for a in artifacts {
        let is = |k: &str| a.kinds.iter().any(|x| x == k);
        if is("test") && super::checks::TEST_FILES.contains(&a.name.as_str()) {
            tests.insert(a.name, a.executable);
        } else if is("bin") && !a.test_harness {
            bins.insert(a.name, a.executable);
        }
    }
    let mut bin = |name: &str| {
        bins.remove(name)
            .with_context(|| format!("cargo built no {name} binary for {}", arch.name()))
    };
    let b = Binaries {
        vitalsd: bin("vitalsd")?,
        workload: bin("vitals-workload")?,
        fake_perfetto: bin("fake-perfetto")?,
        relay: bin("vitals-vm-relay")?,
        tests,
    };
    for f in super::checks::TEST_FILES {
        if !b.tests.contains_key(*f) {
            bail!("cargo built no test binary for tests/tests/{f}.rs");
        }
    }
    Ok(b)
}

/// The cross build's settings: Debian's rustc with the private arm64
/// sysroot, the cross gcc as linker, its own target dir.
fn cross_env(c: &mut Command) -> Result<()> {
    let sysroot = apt::arm64_rust_sysroot()?;
    let target = Arch::Arm64.rust_target();
    c.args(["--target", target])
        .env("RUSTC", "/usr/bin/rustc")
        .env("CARGO_TARGET_DIR", workspace_root().join("target/vm/cross"))
        .env(
            "CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER",
            "aarch64-linux-gnu-gcc",
        )
        // With --target, these flags reach only the arm64 crates; build
        // scripts and proc macros keep Debian rustc's own x86_64 std.
        .env(
            "CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUSTFLAGS",
            format!("--sysroot={}", sysroot.display()),
        )
        // A prebuilt eBPF object is the host's; build.rs builds arm64's.
        .env_remove("VITALS_EBPF_OBJ");
    Ok(())
}

struct Artifact {
    name: String,
    kinds: Vec<String>,
    /// Built with the test harness: integration tests, and also each
    /// binary's own unit-test build (kind "bin" too, but not the program).
    test_harness: bool,
    executable: PathBuf,
}

/// Runs a cargo build with JSON messages (diagnostics still rendered on
/// stderr) and returns the executables it produced or found fresh.
fn artifacts_of(cmd: &mut Command) -> Result<Vec<Artifact>> {
    cmd.arg("--message-format=json-render-diagnostics")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    eprintln!("vm-test: {cmd:?}");
    let out = cmd
        .output()
        .with_context(|| format!("spawning {:?}", cmd.get_program()))?;
    if !out.status.success() {
        bail!("{cmd:?} failed: {}", out.status);
    }
    let mut v = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if msg["reason"] != "compiler-artifact" {
            continue;
        }
        let Some(exe) = msg["executable"].as_str() else {
            continue;
        };
        v.push(Artifact {
            name: msg["target"]["name"].as_str().unwrap_or("").to_owned(),
            kinds: msg["target"]["kind"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|k| k.as_str().map(str::to_owned))
                .collect(),
            test_harness: msg["profile"]["test"].as_bool().unwrap_or(false),
            executable: Path::new(exe).to_owned(),
        });
    }
    Ok(v)
}
