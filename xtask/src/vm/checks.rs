//! The checks of the kernel matrix: which tests run (the CI subset, or every
//! kernel test with `--full`), the POSIX shell script that runs them in a
//! guest or on the host, and the parser of what it prints.
//!
//! Every check but three is a test of tests/tests/*.rs, run by the binary
//! cargo built for it, filtered by its exact name: the guest runs the same
//! assertions as the host, not a second copy. Two others ask the daemon
//! itself: `daemon::load` (`vitalsd record` loads, attaches and writes a
//! trace the official decoder accepts) and `daemon::fault-source` (the
//! source it reports for `auto` is the one this arch must use). The last,
//! `android::bpfloader-pins` (x86_64), runs AOSP's bpfloader and then a
//! test of pins.rs on its pins (`bpfloader.rs`).

use std::{collections::HashMap, fmt, process::Command};

use anyhow::{bail, Context, Result};

use super::{
    binaries::Binaries,
    bpfloader::{self, Bpfloader},
    Arch, Cell,
};
use crate::util::workspace_root;

pub use super::subset::TEST_FILES;
use super::subset::{ARCH_ONLY, CELLS_ONLY, CI_SUBSET, LEFT_OUT};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckId {
    /// A check of the daemon binary itself, made by the script.
    Daemon(&'static str),
    /// A test of tests/tests/<file>.rs.
    Test { file: String, name: String },
    /// A check of vitalsd's Android pieces by AOSP's code.
    Android(&'static str),
}

impl fmt::Display for CheckId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CheckId::Daemon(n) => write!(f, "daemon::{n}"),
            CheckId::Test { file, name } => write!(f, "{file}::{name}"),
            CheckId::Android(n) => write!(f, "android::{n}"),
        }
    }
}

#[derive(Debug, Clone)]
pub enum Outcome {
    Pass,
    /// Ran and failed: the assertion's message.
    Fail(String),
    /// Never reported a result: why.
    Missing(String),
    /// Could not run here for a missing tool (the AOSP tree): why and how.
    /// Reported loudly; a failure under `--require-all`.
    NotRun(String),
}

const DAEMON_CHECKS: [&str; 2] = ["load", "fault-source"];

/// Where the script finds its binaries.
pub struct Paths {
    tests: HashMap<String, String>,
    vitalsd: String,
    workload: String,
    fake_perfetto: String,
    trace_summary: String,
    /// AOSP's loader and vitals.o (used only when the plan has them).
    bpfloader: String,
    vitals_o: String,
}

impl Paths {
    /// Inside a guest: what initramfs.rs packs under /vm.
    pub fn guest() -> Self {
        Self {
            tests: TEST_FILES
                .iter()
                .map(|f| (f.to_string(), format!("/vm/bin/{f}")))
                .collect(),
            vitalsd: "/vm/bin/vitalsd".into(),
            workload: "/vm/bin/vitals-workload".into(),
            fake_perfetto: "/vm/bin/fake-perfetto".into(),
            // Only its name travels: the relay runs the host's copy.
            trace_summary: "/vm/trace_summary.py".into(),
            bpfloader: bpfloader::GUEST_LOADER.into(),
            vitals_o: bpfloader::GUEST_OBJECT.into(),
        }
    }

    /// On the host: the binaries where cargo built them.
    pub fn host(b: &Binaries, aosp: &Bpfloader) -> Result<Self> {
        let s = |p: &std::path::Path| p.to_string_lossy().into_owned();
        let (bpfloader, vitals_o) = match aosp {
            Bpfloader::Ready { loader, object } => (s(loader), s(object)),
            _ => Default::default(),
        };
        Ok(Self {
            bpfloader,
            vitals_o,
            tests: b.tests.iter().map(|(f, p)| (f.clone(), s(p))).collect(),
            vitalsd: s(&b.vitalsd),
            workload: s(&b.workload),
            fake_perfetto: s(&b.fake_perfetto),
            trace_summary: s(&workspace_root().join("tests/python/trace_summary.py")),
        })
    }
}

#[derive(Clone)]
struct TestCheck {
    file: String,
    name: String,
    arches: Vec<Arch>,
    /// The guest cells (arch, kernel series) that run it; empty = all.
    cells: Vec<(Arch, &'static str)>,
}

#[derive(Clone)]
pub struct Plan {
    tests: Vec<TestCheck>,
    /// The android::bpfloader-pins row (x86_64 cells); None when `--only`
    /// left it out.
    bpfloader: Option<Bpfloader>,
    /// Seconds one test binary may run in the script before `timeout` kills it.
    binary_timeout_s: u64,
}

impl Plan {
    /// The CI subset, or with `full` every test the x86_64 binaries list.
    pub fn new(full: bool, x86: &Binaries) -> Result<Self> {
        let mut tests = Vec::new();
        if !full {
            for (file, name, arches) in CI_SUBSET {
                let cells = CELLS_ONLY
                    .iter()
                    .filter(|(n, _)| n == name)
                    .flat_map(|(_, c)| c.iter().copied())
                    .collect();
                tests.push(TestCheck {
                    file: file.to_string(),
                    name: name.to_string(),
                    arches: arches.to_vec(),
                    cells,
                });
            }
        } else {
            for file in TEST_FILES {
                let bin = x86
                    .tests
                    .get(*file)
                    .with_context(|| format!("no test binary for {file}"))?;
                let out = Command::new(bin)
                    .args(["--list", "--format", "terse"])
                    .output()
                    .with_context(|| format!("listing the tests of {}", bin.display()))?;
                if !out.status.success() {
                    bail!("{} --list failed: {}", bin.display(), out.status);
                }
                for line in String::from_utf8_lossy(&out.stdout).lines() {
                    let Some(name) = line.strip_suffix(": test") else {
                        continue;
                    };
                    if LEFT_OUT.iter().any(|(n, _)| *n == name) {
                        continue;
                    }
                    let arches = ARCH_ONLY
                        .iter()
                        .filter(|(n, _)| *n == name)
                        .map(|(_, a)| *a)
                        .collect();
                    tests.push(TestCheck {
                        file: file.to_string(),
                        name: name.to_owned(),
                        arches,
                        cells: Vec::new(),
                    });
                }
            }
            for (name, why) in LEFT_OUT {
                eprintln!("vm-test --full: leaving out {name} ({why})");
            }
        }
        Ok(Self {
            tests,
            bpfloader: None,
            binary_timeout_s: if full { 2400 } else { 600 },
        })
    }

    /// Adds the android::bpfloader-pins row to the x86_64 cells.
    pub fn with_bpfloader(mut self, b: Bpfloader) -> Self {
        self.bpfloader = Some(b);
        self
    }

    /// Keeps the tests whose `file::name` (as the table shows it) contains
    /// `part` (all with None); the android row stays if its name or its
    /// test's does.
    pub fn only(mut self, part: Option<&str>) -> Self {
        if let Some(part) = part {
            self.tests
                .retain(|t| format!("{}::{}", t.file, t.name).contains(part));
            if !bpfloader::ROW.contains(part) && !bpfloader::TEST.contains(part) {
                self.bpfloader = None;
            }
        }
        self
    }

    /// The plan of one cell: without the tests CELLS_ONLY keeps to other
    /// guest cells.
    pub fn for_cell(&self, cell: &Cell) -> Self {
        let mut plan = self.clone();
        if let Cell::Guest { arch, series, .. } = cell {
            plan.tests
                .retain(|t| t.cells.is_empty() || t.cells.contains(&(*arch, *series)));
        }
        plan
    }

    /// The android row's state on `arch`'s cells (x86_64 only, see bpfloader.rs).
    pub fn bpfloader_for(&self, arch: Arch) -> Option<&Bpfloader> {
        self.bpfloader.as_ref().filter(|_| arch == Arch::X86_64)
    }

    fn tests_for(&self, arch: Arch) -> impl Iterator<Item = &TestCheck> {
        self.tests
            .iter()
            .filter(move |t| t.arches.is_empty() || t.arches.contains(&arch))
    }

    /// Every check of a cell, in the order the script runs them.
    pub fn for_arch(&self, arch: Arch) -> Vec<CheckId> {
        DAEMON_CHECKS
            .iter()
            .map(|n| CheckId::Daemon(n))
            .chain(self.tests_for(arch).map(|t| CheckId::Test {
                file: t.file.clone(),
                name: t.name.clone(),
            }))
            .chain(
                self.bpfloader_for(arch)
                    .map(|_| CheckId::Android(bpfloader::ROW)),
            )
            .collect()
    }

    /// The script that runs the checks. The environment must hold
    /// VITALS_PYTHON: the venv's Python on the host, the relay in guests.
    pub fn script(&self, arch: Arch, p: &Paths) -> String {
        let mut s = String::new();
        s.push_str(&format!(
            r#"#!/bin/sh
# Generated by `cargo xtask vm-test` (xtask/src/vm/checks.rs): runs the
# kernel matrix's checks and prints @@vm markers for the host to parse.
export VITALSD_BIN='{vitalsd}' VITALS_WORKLOAD_BIN='{workload}' VITALS_FAKE_PERFETTO_BIN='{fake}'
T=$(mktemp -d)
echo "@@vm kernel $(uname -r) $(uname -m) cpus $(nproc)"
echo "@@vm begin daemon"
RUST_LOG=info "$VITALSD_BIN" record --duration 2s --top 0 --out "$T/load.pftrace" >"$T/load.out" 2>&1
rc=$?
cat "$T/load.out"
if [ $rc -ne 0 ]; then
    cause=$(grep -m1 -E '^ +0: ' "$T/load.out" | sed -e 's/^ *0: //' -e 's/ Verifier output:.*//')
    echo "@@vm result load FAIL vitalsd record exited $rc: ${{cause:-$(tail -n 1 "$T/load.out")}}"
elif "$VITALS_PYTHON" '{summary}' "$T/load.pftrace" >"$T/load.json" 2>"$T/load.err"; then
    echo "@@vm result load pass"
else
    echo "@@vm result load FAIL the official decoder rejected the trace: $(tail -n 1 "$T/load.err")"
fi
if grep -q 'faults from {faults}' "$T/load.out"; then
    echo "@@vm result fault-source pass"
elif [ $rc -ne 0 ]; then
    echo "@@vm result fault-source FAIL vitalsd record failed (see daemon::load)"
else
    echo "@@vm result fault-source FAIL want 'faults from {faults}', vitalsd said: '$(grep -m1 'faults from' "$T/load.out")'"
fi
echo "@@vm end daemon 0"
"#,
            vitalsd = p.vitalsd,
            workload = p.workload,
            fake = p.fake_perfetto,
            summary = p.trace_summary,
            faults = arch.expected_fault_source(),
        ));
        for file in TEST_FILES {
            let names: Vec<&str> = self
                .tests_for(arch)
                .filter(|t| t.file == *file)
                .map(|t| t.name.as_str())
                .collect();
            if names.is_empty() {
                continue;
            }
            s.push_str(&format!(
                "echo \"@@vm begin {file}\"\n\
                 timeout -s KILL {timeout} '{bin}' --test-threads=1 --show-output --exact {names} 2>&1\n\
                 echo \"@@vm end {file} $?\"\n",
                timeout = self.binary_timeout_s,
                bin = p.tests[*file],
                names = names.join(" "),
            ));
        }
        // Last, so the other rows have their results whatever the loader
        // does to the kernel.
        if let Some(Bpfloader::Ready { .. }) = self.bpfloader_for(arch) {
            s.push_str(&bpfloader::script(
                &p.bpfloader,
                &p.vitals_o,
                &p.tests["pins"],
                self.binary_timeout_s,
            ));
        }
        s.push_str("rm -rf \"$T\"\necho \"@@vm done\"\n");
        s
    }

    /// Reads the script's output. `finished`: the script got to its end.
    pub fn parse(&self, arch: Arch, text: &str, finished: bool) -> Vec<(CheckId, Outcome)> {
        let text = text.replace('\r', "");
        let blocks = blocks(&text);
        self.for_arch(arch)
            .into_iter()
            .map(|id| {
                let outcome = match &id {
                    CheckId::Daemon(name) => daemon_outcome(blocks.get("daemon"), name),
                    CheckId::Test { file, name } => test_outcome(blocks.get(file.as_str()), name),
                    CheckId::Android(name) => self.android_outcome(blocks.get("android"), name),
                };
                let outcome = match outcome {
                    Outcome::Missing(m) if !finished => {
                        Outcome::Missing(format!("{m} (the run did not finish)"))
                    }
                    o => o,
                };
                (id, outcome)
            })
            .collect()
    }
}

impl Plan {
    /// The android row: NOT RUN or failed from what the host knew before
    /// the script; else the loader's marker or the test's verdict.
    fn android_outcome(&self, block: Option<&Block>, name: &str) -> Outcome {
        match &self.bpfloader {
            Some(Bpfloader::NotRun(why)) => return Outcome::NotRun(why.clone()),
            Some(Bpfloader::Broken(why)) => return Outcome::Fail(why.clone()),
            _ => {}
        }
        let marker = format!("@@vm result {name} FAIL ");
        if let Some(msg) = block.and_then(|b| {
            b.body
                .lines()
                .find_map(|l| l.find(&marker).map(|i| l[i + marker.len()..].trim()))
        }) {
            return Outcome::Fail(msg.to_owned());
        }
        match block {
            None => Outcome::Missing("the AOSP loader never started".into()),
            Some(b) => test_outcome(Some(b), bpfloader::TEST),
        }
    }
}

/// One `@@vm begin <file>` … `@@vm end <file> <rc>` section.
struct Block<'a> {
    body: &'a str,
    /// The exit status of the test binary; None when the block never ended.
    rc: Option<i32>,
}

fn blocks(text: &str) -> HashMap<&str, Block<'_>> {
    let mut out = HashMap::new();
    let mut rest = text;
    while let Some(i) = rest.find("@@vm begin ") {
        let after = &rest[i + "@@vm begin ".len()..];
        let name_end = after.find('\n').unwrap_or(after.len());
        let name = after[..name_end].trim();
        let body_start = (name_end + 1).min(after.len());
        let body_all = &after[body_start..];
        let end_marker = format!("@@vm end {name} ");
        let (body, rc, next) = match body_all.find(&end_marker) {
            Some(j) => {
                let tail = &body_all[j + end_marker.len()..];
                let rc = tail.lines().next().and_then(|l| l.trim().parse().ok());
                (&body_all[..j], rc, &body_all[j..])
            }
            None => {
                // Unfinished: up to the next block, or the end.
                let j = body_all.find("@@vm begin ").unwrap_or(body_all.len());
                (&body_all[..j], None, &body_all[j..])
            }
        };
        out.insert(name, Block { body, rc });
        rest = next;
    }
    out
}

fn daemon_outcome(block: Option<&Block>, name: &str) -> Outcome {
    let Some(b) = block else {
        return Outcome::Missing("the daemon checks never started".into());
    };
    let marker = format!("@@vm result {name} ");
    match b.body.lines().find_map(|l| {
        l.find(&marker)
            .map(|i| l[i + marker.len()..].trim().to_owned())
    }) {
        Some(r) if r == "pass" => Outcome::Pass,
        Some(r) => {
            let msg = r.strip_prefix("FAIL ").unwrap_or(&r);
            Outcome::Fail(match verifier_rejection(b.body) {
                Some(v) if name == "load" => format!("[{v}] {msg}"),
                _ => msg.to_owned(),
            })
        }
        None => Outcome::Missing("no result printed".into()),
    }
}

fn test_outcome(block: Option<&Block>, name: &str) -> Outcome {
    let Some(b) = block else {
        return Outcome::Missing("its test binary never started".into());
    };
    let marker = format!("test {name} ... ");
    let Some(i) = b.body.find(&marker) else {
        return Outcome::Missing(match b.rc {
            Some(137) => "not reached before the binary's timeout".into(),
            Some(rc) => format!("no result (test binary exited {rc})"),
            None => "no result (test binary did not finish)".into(),
        });
    };
    // The verdict follows on the same line, or (when a child process wrote
    // to the console meanwhile, from a new line or right after the marker)
    // on a later line of its own.
    const VERDICTS: [&str; 3] = ["ok", "FAILED", "ignored"];
    let after = &b.body[i + marker.len()..];
    let mut lines = after.lines();
    let first = lines.next().unwrap_or("").trim();
    let verdict = match first.split_whitespace().next() {
        Some(word) if VERDICTS.contains(&word) => Some(word),
        _ => lines.map(str::trim).find(|l| VERDICTS.contains(l)),
    };
    match verdict {
        Some("ok") => Outcome::Pass,
        Some("FAILED") => Outcome::Fail(failure_reason(b.body, name)),
        Some("ignored") => Outcome::Fail("ignored".into()),
        _ => Outcome::Missing(match b.rc {
            Some(137) => "killed by the binary's timeout while running".into(),
            Some(_) => "started but printed no verdict (crashed?)".into(),
            None => "was running when the output stopped".into(),
        }),
    }
}

/// The panic message of a failed test, from libtest's failures section.
fn failure_reason(body: &str, name: &str) -> String {
    let header = format!("---- {name} stdout ----");
    let Some(i) = body.find(&header) else {
        return "failed (see the log)".into();
    };
    let section = &body[i + header.len()..];
    let section = &section[..section
        .find("\n---- ")
        .or_else(|| section.find("\nfailures:"))
        .unwrap_or(section.len())];
    let hint = verifier_rejection(section);
    let mut lines = section.lines();
    while let Some(l) = lines.next() {
        if l.contains("panicked at") {
            // Rust 1.73+: the message is on the lines after the location.
            let msg: Vec<&str> = lines
                .by_ref()
                .take_while(|m| {
                    !m.starts_with("note:") && !m.starts_with("stack backtrace:") && !m.is_empty()
                })
                .collect();
            let msg = if msg.is_empty() {
                l.to_owned()
            } else {
                msg.join(" ")
            };
            return match hint {
                Some(v) => format!("[{v}] {msg}"),
                None => msg,
            };
        }
    }
    "failed (see the log)".into()
}

/// The verifier's "invalid func <helper>" in an error (the program calls
/// a BPF helper this kernel does not have): the reason, put up front
/// because the rest of a load error is long.
fn verifier_rejection(msg: &str) -> Option<String> {
    let i = msg.find("invalid func ")?;
    let rest = &msg[i..];
    let end = rest["invalid func ".len()..]
        .find(|c: char| c.is_whitespace() || c == '\\' || c == '"')
        .map_or(rest.len(), |e| e + "invalid func ".len());
    Some(format!("verifier: {}", &rest[..end]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> Plan {
        Plan {
            tests: vec![
                TestCheck {
                    file: "accounting".into(),
                    name: "a".into(),
                    arches: vec![],
                    cells: vec![],
                },
                TestCheck {
                    file: "accounting".into(),
                    name: "b".into(),
                    arches: vec![],
                    cells: vec![],
                },
                TestCheck {
                    file: "pins".into(),
                    name: "c".into(),
                    arches: vec![Arch::X86_64],
                    cells: vec![(Arch::X86_64, "5.10")],
                },
            ],
            bpfloader: None,
            binary_timeout_s: 10,
        }
    }

    #[test]
    fn parses_verdicts_reasons_and_missing_results() {
        let out = "@@vm kernel 5.10\n\
            @@vm begin daemon\n\
            @@vm result load FAIL vitalsd record exited 1: Error: loading\n\
            @@vm result fault-source pass\n\
            @@vm end daemon 0\n\
            @@vm begin accounting\r\n\
            running 2 tests\n\
            test a ... [INFO vitalsd] a child's log on the verdict's line\nok\n\
            test b ... \nchild noise\nFAILED\n\n\
            failures:\n\n---- b stdout ----\n\n\
            thread 'b' panicked at tests/tests/accounting.rs:1:2:\n\
            on-CPU: 5 is not within 10%\n\
            note: run with `RUST_BACKTRACE=1`\n\n\
            failures:\n    b\n\n\
            @@vm end accounting 101\n";
        let r = plan().parse(Arch::X86_64, out, false);
        let get = |s: &str| {
            r.iter()
                .find(|(id, _)| id.to_string() == s)
                .map(|(_, o)| o.clone())
                .unwrap()
        };
        assert!(
            matches!(get("daemon::load"), Outcome::Fail(m) if m == "vitalsd record exited 1: Error: loading")
        );
        assert!(matches!(get("daemon::fault-source"), Outcome::Pass));
        assert!(matches!(get("accounting::a"), Outcome::Pass));
        assert!(
            matches!(get("accounting::b"), Outcome::Fail(m) if m == "on-CPU: 5 is not within 10%")
        );
        assert!(
            matches!(get("pins::c"), Outcome::Missing(m) if m.contains("never started") && m.contains("did not finish"))
        );
        // arm64 does not run pins::c.
        assert_eq!(plan().parse(Arch::Arm64, out, true).len(), 4);
    }

    #[test]
    fn a_missing_helper_leads_the_reason() {
        let out = "@@vm begin accounting\ntest a ... FAILED\n\nfailures:\n\n---- a stdout ----\n\
            thread 'a' panicked at x.rs:1:1:\n\
            loading: Program { verifier_log: \"0: (85) call\\ninvalid func unknown#195\\nprocessed\" }\n\n\
            @@vm end accounting 101\n@@vm done\n";
        let r = plan().parse(Arch::X86_64, out, true);
        assert!(
            matches!(&r[2].1, Outcome::Fail(m) if m.starts_with("[verifier: invalid func unknown#195] loading:")),
            "{:?}",
            r[2]
        );
    }

    #[test]
    fn a_binary_killed_mid_test_reports_its_timeout() {
        let out = "@@vm begin accounting\ntest a ... ok\ntest b ... \n@@vm end accounting 137\n@@vm done\n";
        let r = plan().parse(Arch::X86_64, out, true);
        assert!(matches!(&r[3].1, Outcome::Missing(m) if m.contains("timeout")));
    }

    #[test]
    fn the_android_row_is_not_run_without_a_tree_and_reads_the_loader_and_the_test() {
        let out =
            |android: &str| format!("@@vm begin android\n{android}@@vm end android 1\n@@vm done\n");
        let row = |b: Bpfloader, text: &str| {
            let r = plan().with_bpfloader(b).parse(Arch::X86_64, text, true);
            assert_eq!(r.last().unwrap().0.to_string(), "android::bpfloader-pins");
            r.last().unwrap().1.clone()
        };
        let ready = || Bpfloader::Ready {
            loader: "/l".into(),
            object: "/o".into(),
        };
        // No tree: NOT RUN (never a pass), whatever the output says.
        assert!(matches!(
            row(Bpfloader::NotRun("not run: no AOSP tree".into()), &out("")),
            Outcome::NotRun(m) if m == "not run: no AOSP tree"
        ));
        assert!(matches!(
            row(ready(), &out("@@vm result bpfloader-pins FAIL AOSP bpfloader exited 1: x\n")),
            Outcome::Fail(m) if m == "AOSP bpfloader exited 1: x"
        ));
        let verdict = format!("test {} ... ok\n", bpfloader::TEST);
        assert!(matches!(row(ready(), &out(&verdict)), Outcome::Pass));
        assert!(matches!(row(ready(), &out("")), Outcome::Missing(_)));
        // arm64 has no such row; x86_64's script runs the loader, then the test.
        let p = plan().with_bpfloader(ready());
        assert!(!p
            .for_arch(Arch::Arm64)
            .contains(&CheckId::Android(bpfloader::ROW)));
        let s = p.script(Arch::X86_64, &Paths::guest());
        assert!(s.contains("sh '/vm/bin/host-bpfloader' '/vm/vitals.o' '/vm/bin/pins'"));
        assert!(s.contains(&format!(
            "--ignored --exact --test-threads=1 --show-output {}",
            bpfloader::TEST
        )));
        assert!(!p.script(Arch::Arm64, &Paths::guest()).contains("bpfloader"));
        assert!(plan()
            .with_bpfloader(ready())
            .only(Some("oncpu"))
            .bpfloader
            .is_none());
    }

    #[test]
    fn a_test_kept_to_some_cells_runs_on_those_and_the_host_only() {
        let cell = |arch, series| Cell::Guest {
            arch,
            series,
            suite: "",
        };
        let has_c = |c: &Cell| {
            plan()
                .for_cell(c)
                .for_arch(c.arch())
                .iter()
                .any(|id| id.to_string() == "pins::c")
        };
        assert!(has_c(&cell(Arch::X86_64, "5.10")));
        assert!(!has_c(&cell(Arch::X86_64, "6.1")));
        assert!(has_c(&Cell::Host));
        // CELLS_ONLY names tests of the subset, on cells of the matrix.
        for (name, cells) in CELLS_ONLY {
            assert!(CI_SUBSET.iter().any(|(_, n, _)| n == name), "{name}");
            for (arch, series) in *cells {
                assert!(
                    super::super::KERNELS
                        .iter()
                        .any(|(s, _, a)| s == series && a.contains(arch)),
                    "{name}: no {series} {arch:?} cell"
                );
            }
        }
        assert_eq!(plan().for_cell(&cell(Arch::X86_64, "6.1")).tests.len(), 2);
    }

    #[test]
    fn the_script_runs_each_file_once_with_exact_names() {
        let p = plan();
        let paths = Paths::guest();
        let s = p.script(Arch::Arm64, &paths);
        assert!(s.contains("'/vm/bin/accounting' --test-threads=1 --show-output --exact a b 2>&1"));
        assert!(!s.contains("/vm/bin/pins"));
        assert!(s.contains("faults from perf software events"));
    }
}
