//! `cargo xtask android-check [--aosp DIR] [--require-all]`: vitalsd's
//! Android pieces checked by Android's own code, from an AOSP tree
//! (default: `VITALS_AOSP_DIR`, else `../shared/aosp` beside the
//! repository; `suites::Tool::AospTree`):
//!
//! - **1a loader** (`loader.rs`): AOSP's bpfloader, built for the host,
//!   loads `vitals.o`; vitalsd attached from its pins counts a spinner and
//!   a page-toucher within 10 % of /proc, and `record --sched` and a
//!   rule-triggered daemon capture from those pins hold the spinner's sched
//!   slices (`capture.rs`; needs trace_processor_shell). Needs root.
//! - **1b policy** (`policy.rs`): the platform policy compiled with
//!   `sepolicy/` by m4 + checkpolicy in the build's order, user and
//!   userdebug, neverallows on; file and property contexts checked by
//!   AOSP's checkfc.
//! - **1c packaging** (`packaging.rs`): what `dist` ships exists and its
//!   Android.bp parses as Blueprint. Needs no AOSP tree.
//!
//! Without the AOSP tree (a fresh machine without ../shared), 1a and 1b
//! are reported loudly as not run, with how to run them; that fails only
//! with `--require-all` ([`run`]'s `require`).

pub mod bench;
pub mod blueprint;
mod capture;
mod cts;
pub mod loader;
mod packaging;
mod policy;
mod unseen;

use std::path::PathBuf;

use anyhow::{bail, Result};

use crate::{
    suites::Tool,
    util::{cargo, run as run_cmd, workspace_root},
};

/// How one check ended.
#[derive(Debug)]
pub enum Outcome {
    Pass(String),
    /// The tool's own output.
    Fail(String),
    /// Could not run here: why, and how to run it.
    NotRun {
        why: String,
        how: String,
    },
}

#[derive(Debug)]
pub struct Report {
    pub checks: Vec<(&'static str, Outcome)>,
}

impl Report {
    pub fn failed(&self) -> usize {
        self.checks
            .iter()
            .filter(|(_, o)| matches!(o, Outcome::Fail(_)))
            .count()
    }

    pub fn not_run(&self) -> usize {
        self.checks
            .iter()
            .filter(|(_, o)| matches!(o, Outcome::NotRun { .. }))
            .count()
    }
}

/// Where cargo puts build output (CARGO_TARGET_DIR or ./target).
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

fn outcome(r: Result<String>) -> Outcome {
    match r {
        Ok(s) => Outcome::Pass(s),
        Err(e) => Outcome::Fail(format!("{e:#}")),
    }
}

fn is_root() -> bool {
    unsafe { libc::geteuid() == 0 }
}

/// Builds what the checks need, runs them, prints the report. Errors when
/// a check fails, or, with `require`, when one could not run.
pub fn run(aosp: Option<PathBuf>, require: bool) -> Result<Report> {
    let root = workspace_root();
    let (aosp_dir, tree) = match aosp.ok_or(String::new()).or_else(|_| Tool::AospTree.find()) {
        Ok(dir) => {
            let tree = loader::AospTree::find(&dir).ok_or(format!(
                "{} has no system_bpf/libbpf_android/Loader.cpp (nor system/bpf/...)",
                dir.display()
            ));
            (dir.display().to_string(), tree)
        }
        Err(why) => ("none found".to_owned(), Err(why)),
    };
    let work = target_dir().join("android-check");
    std::fs::create_dir_all(&work)?;
    // vitalsd, vitalsctl and the workload for 1a and 1c; the aya object
    // for vitals.o.
    run_cmd(cargo().args([
        "build",
        "-p",
        "vitalsd",
        "--bins",
        "-p",
        "vitals-tests",
        "--bin",
        "vitals-workload",
    ]))?;
    let bins = target_dir().join("debug");
    crate::android_bpf::write(&root)?;

    let how = |what: &str| format!("{}{what}", Tool::AospTree.how());
    let mut checks = Vec::new();
    match &tree {
        Err(why) => {
            let why = format!("no AOSP tree: {why}");
            checks.push((
                "1a loader: AOSP bpfloader loads vitals.o, vitalsd records from its pins",
                Outcome::NotRun {
                    why: why.clone(),
                    how: how("; as root (the loader mounts a bpffs)"),
                },
            ));
            checks.push((
                "1b policy: platform policy + sepolicy/, user and userdebug, neverallows, contexts",
                Outcome::NotRun {
                    why: why.clone(),
                    how: how(""),
                },
            ));
            checks.push((
                "1d cts tier: the shipped policy grants what it uses and nothing of eBPF (sesearch)",
                Outcome::NotRun { why, how: how("") },
            ));
        }
        Ok(t) => {
            let a = if is_root() {
                outcome(loader::check(&root, t, &work, &bins))
            } else {
                Outcome::NotRun {
                    why: "not root (the loader needs bpffs mounts, a mount namespace and bpf(2))"
                        .into(),
                    how: "sudo cargo xtask android-check".into(),
                }
            };
            checks.push((
                "1a loader: AOSP bpfloader loads vitals.o, vitalsd records from its pins",
                a,
            ));
            let policy = policy::check(&root, &t.sepolicy, &work.join("policy"));
            // 1d queries the policies 1b compiled.
            let cts = match &policy {
                Ok(_) => outcome(cts::check(&work.join("policy"))),
                Err(e) => Outcome::Fail(format!("check 1b failed first: {e:#}")),
            };
            checks.push((
                "1b policy: platform policy + sepolicy/, user and userdebug, neverallows, contexts",
                outcome(policy),
            ));
            checks.push((
                "1d cts tier: the shipped policy grants what it uses and nothing of eBPF (sesearch)",
                cts,
            ));
        }
    }
    checks.push((
        "1c packaging: dist's files exist, its Android.bp parses",
        outcome(packaging::check(&root, &bins)),
    ));
    let report = Report { checks };
    print(&report, &aosp_dir);
    if report.failed() > 0 {
        bail!("android-check: {} check(s) failed", report.failed());
    }
    if require && report.not_run() > 0 {
        bail!(
            "android-check: {} check(s) could not run and --require-all was given",
            report.not_run()
        );
    }
    Ok(report)
}

fn print(report: &Report, aosp: &str) {
    println!("android-check (AOSP tree: {aosp})");
    for (name, o) in &report.checks {
        match o {
            Outcome::Pass(s) => println!("PASS {name}\n{s}"),
            Outcome::Fail(s) => println!("FAIL {name}\n{s}"),
            Outcome::NotRun { why, how } => {
                println!(
                    "NOT RUN {name}\n  !!! {why}: this check did NOT run.\n  !!! To run it: {how}"
                )
            }
        }
    }
    let n = report.checks.len();
    println!(
        "android-check: {} passed, {} failed, {} not run",
        n - report.failed() - report.not_run(),
        report.failed(),
        report.not_run()
    );
}
