//! Which test suites need a tool that a fresh machine may not have, where
//! each tool is looked for, and the loud report of what could not run.
//!
//! `cargo xtask test` runs every suite whose tools it finds and names the
//! others at the end, with how to get them. `cargo xtask test --require-all`
//! (what `.ci/run` calls) turns any missing tool into a failure, so CI never
//! passes on a suite it skipped.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use crate::util::workspace_root;

/// A tool some suites need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tool {
    /// Perfetto's trace importer (what the Perfetto UI runs).
    TraceProcessor,
    /// traced, traced_probes, the perfetto client and the heapprofd preload
    /// library, built from Perfetto's public source.
    PerfettoService,
    /// An AOSP tree with bpfloader's Loader.cpp and system/sepolicy.
    AospTree,
}

impl Tool {
    pub fn name(self) -> &'static str {
        match self {
            Tool::TraceProcessor => "trace_processor_shell",
            Tool::PerfettoService => "Perfetto service (traced, perfetto, heapprofd preload)",
            Tool::AospTree => "AOSP sources (bpfloader, system/sepolicy)",
        }
    }

    /// How a user gets the tool, printed when it is missing.
    pub fn how(self) -> &'static str {
        match self {
            Tool::TraceProcessor => {
                "set TRACE_PROCESSOR_SHELL=/path/to/trace_processor_shell, or place it at \
                 ../shared/tools/trace_processor_shell beside the repo, or give the machine \
                 internet so the `perfetto` Python package in .venv can download its pinned build"
            }
            Tool::PerfettoService => {
                "set VITALS_PERFETTO_DIR to a directory holding traced, traced_probes, perfetto \
                 and libheapprofd_glibc_preload.so (built from Perfetto's source), or place them \
                 in ../shared/tools/perfetto beside the repo"
            }
            Tool::AospTree => {
                "set VITALS_AOSP_DIR (or `cargo xtask android-check --aosp DIR`) to a tree with \
                 system_bpf/, connectivity/ and system_sepolicy/, or place it at ../shared/aosp"
            }
        }
    }

    /// Where the tool is, or why it could not be found.
    pub fn find(self) -> Result<PathBuf, String> {
        match self {
            Tool::TraceProcessor => find_trace_processor(),
            Tool::PerfettoService => find_perfetto_dir(),
            Tool::AospTree => find_aosp(),
        }
    }

    /// The environment variable the tests read the tool's path from.
    pub fn env_var(self) -> &'static str {
        match self {
            Tool::TraceProcessor => "TRACE_PROCESSOR_SHELL",
            Tool::PerfettoService => "VITALS_PERFETTO_DIR",
            Tool::AospTree => "VITALS_AOSP_DIR",
        }
    }
}

/// Kernel integration test files (tests/tests/<name>.rs) that need a tool.
/// A file not listed needs only the kernel and the project's own binaries.
pub const TEST_FILE_NEEDS: &[(&str, Tool)] = &[
    ("trace_processor", Tool::TraceProcessor),
    ("shared_programs", Tool::TraceProcessor),
    ("reuse", Tool::TraceProcessor),
    ("proc_only", Tool::TraceProcessor),
    ("perfetto_service", Tool::PerfettoService),
    // vitalsd's data source in sessions of the real traced.
    ("producer", Tool::PerfettoService),
    // Captures as sessions of the real traced (and trace_processor, found
    // in ../shared/tools as the other suites find it).
    ("perfetto_capture", Tool::PerfettoService),
];

/// The directory `shared/` sits in beside a checkout (CI copies it next to
/// the clone; developers have it at ../shared).
fn shared_dir() -> PathBuf {
    workspace_root()
        .parent()
        .map(|p| p.join("shared"))
        .unwrap_or_else(|| PathBuf::from("../shared"))
}

fn executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    p.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// `TRACE_PROCESSOR_SHELL`, then ../shared/tools, then the `perfetto`
/// package's own pinned download (cached under ~/.local/share/perfetto).
fn find_trace_processor() -> Result<PathBuf, String> {
    let mut tried = Vec::new();
    if let Some(p) = std::env::var_os("TRACE_PROCESSOR_SHELL") {
        let p = PathBuf::from(p);
        if executable(&p) {
            return Ok(p);
        }
        tried.push(format!(
            "TRACE_PROCESSOR_SHELL={} is not an executable",
            p.display()
        ));
    } else {
        tried.push("TRACE_PROCESSOR_SHELL is not set".into());
    }
    let shared = shared_dir().join("tools/trace_processor_shell");
    if executable(&shared) {
        return Ok(shared);
    }
    tried.push(format!("{} does not exist", shared.display()));
    match python_package_download() {
        Ok(p) => return Ok(p),
        Err(e) => tried.push(format!("the perfetto package's download failed: {e}")),
    }
    Err(tried.join("; "))
}

/// Asks the `perfetto` package in .venv for its pinned trace_processor
/// (it downloads and verifies it on first use). Bounded: a machine without
/// internet must not hang the test run.
fn python_package_download() -> Result<PathBuf, String> {
    let py = workspace_root().join(".venv/bin/python");
    if !py.exists() {
        return Err(format!(
            "{} missing (run `cargo xtask setup`)",
            py.display()
        ));
    }
    let mut child = Command::new(&py)
        .args([
            "-c",
            "from perfetto.trace_processor.platform import PlatformDelegate\n\
             print(PlatformDelegate().get_shell_path(None))",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("spawning {}: {e}", py.display()))?;
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(200))
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err("no answer within 120 s".into());
            }
        }
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("waiting for python: {e}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err.lines().last().unwrap_or("").trim().to_owned();
        return Err(last);
    }
    let p = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    if executable(&p) {
        Ok(p)
    } else {
        Err(format!("it named {}, which is not executable", p.display()))
    }
}

fn find_perfetto_dir() -> Result<PathBuf, String> {
    locate_perfetto_dir(
        std::env::var_os("VITALS_PERFETTO_DIR").map(PathBuf::from),
        shared_dir().join("tools/perfetto"),
    )
}

/// The first of `$VITALS_PERFETTO_DIR` and ../shared/tools/perfetto that
/// holds every tool the perfetto_service suite starts.
fn locate_perfetto_dir(env: Option<PathBuf>, shared: PathBuf) -> Result<PathBuf, String> {
    const NEEDED: [&str; 4] = [
        "traced",
        "traced_probes",
        "perfetto",
        "libheapprofd_glibc_preload.so",
    ];
    let candidates: Vec<PathBuf> = env.into_iter().chain([shared]).collect();
    let mut tried = Vec::new();
    for dir in candidates {
        let missing: Vec<&str> = NEEDED
            .iter()
            .copied()
            .filter(|f| !dir.join(f).is_file())
            .collect();
        if missing.is_empty() {
            return Ok(dir);
        }
        tried.push(format!("{} lacks {}", dir.display(), missing.join(", ")));
    }
    Err(tried.join("; "))
}

fn find_aosp() -> Result<PathBuf, String> {
    let candidates: Vec<PathBuf> = std::env::var_os("VITALS_AOSP_DIR")
        .map(PathBuf::from)
        .into_iter()
        .chain([shared_dir().join("aosp")])
        .collect();
    let mut tried = Vec::new();
    for dir in candidates {
        if dir.join("system_bpf").is_dir() && dir.join("system_sepolicy").is_dir() {
            return Ok(dir);
        }
        tried.push(format!(
            "{} has no system_bpf/ and system_sepolicy/",
            dir.display()
        ));
    }
    Err(tried.join("; "))
}

/// A suite that did not run, and why.
#[derive(Debug)]
pub struct NotRun {
    pub suite: String,
    pub tool: Tool,
    pub why: String,
}

/// Prints the suites that did not run, loudly, with how to run them.
pub fn report(not_run: &[NotRun]) {
    if not_run.is_empty() {
        eprintln!("xtask test: every suite ran (no tool was missing)");
        return;
    }
    let bar = "=".repeat(78);
    eprintln!("\n{bar}");
    eprintln!(
        "xtask test: {} SUITE(S) DID NOT RUN: their tools are missing",
        not_run.len()
    );
    for n in not_run {
        eprintln!("\n  NOT RUN: {} (needs {})", n.suite, n.tool.name());
        eprintln!("    looked: {}", n.why);
        eprintln!("    to run it: {}", n.tool.how());
    }
    eprintln!("\n  `cargo xtask test --require-all` (what CI runs) fails instead of skipping.");
    eprintln!("{bar}\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The perfetto_service suite runs only with every tool present: one
    /// missing makes it not-run (and `--require-all` fail), naming the file.
    #[test]
    fn perfetto_dir_needs_every_tool_and_names_what_is_missing() {
        // No tempfile in xtask's dependencies: a directory of our own pid.
        let root = std::env::temp_dir().join(format!("xtask-suites-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir(&root).unwrap();
        let (full, partial) = (root.join("full"), root.join("partial"));
        for d in [&full, &partial] {
            std::fs::create_dir(d).unwrap();
            for f in ["traced", "traced_probes", "perfetto"] {
                std::fs::write(d.join(f), "").unwrap();
            }
        }
        std::fs::write(full.join("libheapprofd_glibc_preload.so"), "").unwrap();
        let missing = root.join("missing");

        assert_eq!(
            locate_perfetto_dir(Some(partial.clone()), full.clone()),
            Ok(full.clone())
        );
        assert_eq!(
            locate_perfetto_dir(Some(full.clone()), partial.clone()),
            Ok(full.clone())
        );
        let err = locate_perfetto_dir(Some(partial.clone()), missing.clone()).unwrap_err();
        assert!(
            err.contains("partial lacks libheapprofd_glibc_preload.so")
                && err.contains("missing lacks traced, traced_probes, perfetto"),
            "{err}"
        );
        assert!(locate_perfetto_dir(None, missing).is_err());
        std::fs::remove_dir_all(&root).unwrap();
    }
}
