//! Shared harness of the kernel integration tests: controlled workloads,
//! the reference values the kernel itself reports, and the official
//! Perfetto decoder.

use std::{
    io::{BufRead, BufReader, Write},
    path::{Path, PathBuf},
    process::{Child, ChildStdin, ChildStdout, Command, Stdio},
};

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

/// These tests need the kernel. They fail (never skip) when not root, so CI
/// cannot go green without having run them.
pub fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "kernel integration tests need root (CAP_BPF, tracefs, perf events); run `cargo xtask test` as root"
    );
}

/// A running `vitals-workload` child.
pub struct Workload {
    pub child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

pub fn workload_bin() -> PathBuf {
    let exe = std::env::var_os("VITALS_WORKLOAD_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            // Integration tests run from target/<profile>/deps/; cargo builds
            // the package's binaries into target/<profile>/ before them.
            let me = std::env::current_exe().unwrap();
            me.parent()
                .unwrap()
                .parent()
                .unwrap()
                .join("vitals-workload")
        });
    assert!(exe.exists(), "{} missing", exe.display());
    exe
}

impl Workload {
    pub fn spawn(args: &[&str]) -> Self {
        let mut child = Command::new(workload_bin())
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawning vitals-workload");
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Self {
            child,
            stdin,
            stdout,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Blocks until the workload prints `line`.
    pub fn expect(&mut self, line: &str) {
        let mut got = String::new();
        self.stdout
            .read_line(&mut got)
            .expect("reading workload stdout");
        assert_eq!(got.trim(), line, "workload said {got:?}, expected {line:?}");
    }

    /// Lets a workload waiting for a line go on.
    pub fn go(&mut self) {
        let s = self.stdin.as_mut().unwrap();
        s.write_all(b"go\n").unwrap();
        s.flush().unwrap();
    }

    /// Closes stdin and reaps the child.
    pub fn finish(mut self) {
        drop(self.stdin.take());
        let st = self.child.wait().unwrap();
        assert!(st.success(), "workload exited with {st}");
    }
}

/// The kernel's own per-process accounting, read with the `procfs` crate
/// (not our parser) so it is an independent reference.
pub struct KernelStat {
    pub utime_ticks: u64,
    pub stime_ticks: u64,
    pub minflt: u64,
    pub majflt: u64,
    pub voluntary_ctxt_switches: u64,
    pub nonvoluntary_ctxt_switches: u64,
}

pub fn kernel_stat(pid: u32) -> KernelStat {
    let p = procfs::process::Process::new(pid as i32).expect("open /proc/<pid>");
    let st = p.stat().expect("/proc/<pid>/stat");
    let status = p.status().expect("/proc/<pid>/status");
    KernelStat {
        utime_ticks: st.utime,
        stime_ticks: st.stime,
        minflt: st.minflt,
        majflt: st.majflt,
        voluntary_ctxt_switches: status.voluntary_ctxt_switches.unwrap_or(0),
        nonvoluntary_ctxt_switches: status.nonvoluntary_ctxt_switches.unwrap_or(0),
    }
}

pub fn clk_tck() -> u64 {
    let v = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    assert!(v > 0);
    v as u64
}

/// Asserts |a - b| <= pct% of b.
pub fn assert_within_pct(what: &str, a: f64, b: f64, pct: f64) {
    let tol = b.abs() * pct / 100.0;
    assert!(
        (a - b).abs() <= tol,
        "{what}: {a} is not within {pct}% of reference {b} (tolerance {tol})"
    );
}

/// The Python with the official `perfetto` package (`cargo xtask setup`
/// installs it into .venv).
pub fn python() -> PathBuf {
    let p = std::env::var_os("VITALS_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join(".venv/bin/python"));
    assert!(
        p.exists(),
        "{} missing: run `cargo xtask setup` to install the official perfetto package",
        p.display()
    );
    p
}

/// Decodes a trace with the official schema (tests/python/trace_summary.py).
pub fn decode_trace(path: &Path) -> serde_json::Value {
    let out = Command::new(python())
        .arg(workspace_root().join("tests/python/trace_summary.py"))
        .arg(path)
        .output()
        .expect("running trace_summary.py");
    assert!(
        out.status.success(),
        "official decoder rejected {}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("trace_summary.py JSON")
}

/// The vitalsd binary `cargo xtask test` built.
pub fn vitalsd_bin() -> PathBuf {
    let p = std::env::var_os("VITALSD_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target/debug/vitalsd"));
    assert!(
        p.exists(),
        "{} missing: build it first (`cargo xtask test` does)",
        p.display()
    );
    p
}
