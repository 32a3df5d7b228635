//! `cargo xtask …`: set up a fresh machine, build, run, test, bench.
//!
//! `setup` is idempotent and is what makes a clean CI machine work: it
//! installs the Debian packages and bpf-linker that docs/toolchain.md lists,
//! the benchmark peers, and the official `perfetto` Python package.

mod android_bpf;
mod android_check;
mod bench_always_on;
mod bench_capture;
mod bench_idle;
mod bench_offcpu;
mod bench_overhead;
mod bench_producer;
mod bench_scan;
mod dist;
#[cfg(test)]
mod house_rules;
mod leftovers;
mod setup;
mod suites;
mod traced;
mod util;
mod vm;

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

use util::{cargo, run, workspace_root};

#[derive(Parser)]
#[command(name = "xtask")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install everything the build, tests and benches need (idempotent).
    Setup,
    /// Build the daemon (and with it the eBPF object) in release mode.
    Build,
    /// Setup, build, then record ~10 s on this machine with the default config.
    Run {
        #[arg(long, default_value = "10s")]
        duration: String,
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Setup, then every test: unit, property, schema and kernel integration.
    /// Suites whose tools are missing (trace_processor, the Perfetto service,
    /// an AOSP tree) are named at the end with how to run them.
    Test {
        /// Fail when any suite cannot run for a missing tool (CI passes this).
        #[arg(long)]
        require_all: bool,
        /// Then the kernel matrix's guests (`vm-test`'s CI subset on every
        /// guest kernel; the host cell is what the suites above just ran).
        /// CI passes this.
        #[arg(long)]
        vm: bool,
    },
    /// Setup, then the kernel integration tests in QEMU guests on Debian's
    /// kernels (x86_64 5.10/6.1/6.12, arm64 5.10/6.1) and on this host:
    /// prints a kernel × arch × check table, fails if any cell failed.
    VmTest(vm::Opts),
    /// What `test --vm` runs while the host build compiles: the guests'
    /// kernel packages and the arm64 standard library, downloaded.
    #[command(hide = true)]
    VmDownload(vm::Opts),
    /// Package for an OEM device tree: binaries, vitalsd.rc, sepolicy/, an
    /// example config and an Android.bp of prebuilts, in target/dist/vitalsd/.
    Dist {
        /// Rust target triple (default: the host). Android: aarch64-linux-android,
        /// which needs the NDK (see docs/android.md).
        #[arg(long)]
        target: Option<String>,
    },
    /// Rewrite the aya-built eBPF object into Android bpfloader's ELF format:
    /// target/dist/bpf/vitals.o (for /system/etc/bpf; see android_bpf.rs).
    AndroidBpf,
    /// The Android pieces checked by Android's own code from an AOSP tree:
    /// the real bpfloader loads vitals.o, the platform policy compiles with
    /// sepolicy/, dist's packaging parses (see android_check/mod.rs).
    AndroidCheck {
        /// AOSP tree (default: ../shared/aosp next to the repository).
        #[arg(long)]
        aosp: Option<PathBuf>,
        /// Fail when a check cannot run here (no AOSP tree, not root).
        #[arg(long)]
        require_all: bool,
    },
    /// `bench offcpu`'s rounds, run by this binary inside its guest.
    #[command(hide = true)]
    BenchOffcpuGuest {
        #[arg(long)]
        rounds: usize,
        #[arg(long)]
        loops: u64,
        #[arg(long)]
        vitalsd: PathBuf,
        #[arg(long)]
        baseline: Option<PathBuf>,
        #[arg(long)]
        settle_s: u64,
    },
    /// Benchmarks against the tools a user would pick instead.
    Bench {
        #[command(subcommand)]
        which: Bench,
    },
}

#[derive(Subcommand)]
enum Bench {
    /// perf bench sched pipe: nothing vs vitalsd vs bpftrace.
    Overhead {
        #[arg(long, default_value_t = 9)]
        rounds: usize,
        /// perf bench sched pipe loops per run (500k: about a second, long
        /// enough that a stray burst on the shared VM moves one run little).
        #[arg(long, default_value_t = 500_000)]
        loops: u64,
        /// Android user-build setup instead: vitalsd's programs loaded by
        /// AOSP's bpfloader and attached from pins, against time_in_state.c
        /// loaded the same way (android_check/bench.rs).
        #[arg(long)]
        android: bool,
        /// AOSP tree for --android (default: VITALS_AOSP_DIR, ../shared/aosp).
        #[arg(long)]
        aosp: Option<PathBuf>,
        /// Another vitalsd build (a release binary) measured in the same
        /// interleaved rounds: before/after a change in one run.
        #[arg(long)]
        baseline: Option<PathBuf>,
    },
    /// In a Debian guest with its kernel's headers: nothing vs `vitalsd record
    /// --offcpu` vs bcc's offwaketime (perf bench sched pipe), and the
    /// always-on cost of off-CPU accounting (default vs --no-offcpu).
    Offcpu {
        #[arg(long, default_value_t = 5)]
        rounds: usize,
        #[arg(long, default_value_t = 500_000)]
        loops: u64,
        /// kvm: near-native, needs a KVM that runs a stock kernel; tcg:
        /// emulated, slow, TCG's figures.
        #[arg(long, value_enum, default_value = "kvm")]
        accel: bench_offcpu::Accel,
        /// The guest is killed after this many minutes.
        #[arg(long, default_value_t = 120)]
        timeout_min: u64,
        /// Another vitalsd build whose `record --offcpu` runs in the same
        /// rounds (before/after a change).
        #[arg(long)]
        baseline: Option<PathBuf>,
        /// Seconds each tool runs at least after its start-up marker
        /// before perf bench starts; then until its own CPU is quiet (a
        /// capture's first flushes symbolise every process's stacks).
        #[arg(long, default_value_t = 1)]
        settle_s: u64,
    },
    /// procfs scans with 1000 processes / 5000 threads: vitalsd vs top, top -H, pidstat -t.
    Scan,
    /// With 1000 processes / 5000 threads, all at once: CPU per 10 s of the
    /// CTS tier, the eBPF tier and traced_probes' process_stats + sys_stats.
    AlwaysOn {
        #[arg(long, default_value_t = 10)]
        seconds: u64,
        #[arg(long, default_value_t = 5)]
        rounds: usize,
        /// perf bench sched pipe loops per run of the ring-session phase.
        #[arg(long, default_value_t = 500_000)]
        loops: u64,
    },
    /// vitalsd run's own CPU and RSS over a minute of 1 s sampling, beside top and pidstat.
    Idle {
        #[arg(long, default_value_t = 60)]
        seconds: u64,
        /// Another vitalsd build (a release binary) measured beside this
        /// one: before/after a change in one run.
        #[arg(long)]
        baseline: Option<PathBuf>,
    },
    /// With 1000 processes: CPU of traced_probes' linux.process_stats (1 s, runtime)
    /// against vitalsd's linux.vitals data source (1 s), in one session.
    Producer {
        #[arg(long, default_value_t = 10)]
        seconds: u64,
    },
    /// Capture tier under perf bench sched pipe: bytes per switch, ring-buffer loss.
    Capture {
        /// Capture transport: `ringbuf` or `perf` (per-CPU perf event array).
        #[arg(long, default_value = "ringbuf", value_parser = ["ringbuf", "perf"])]
        transport: String,
    },
}

/// Errors end the output as one line with their causes, no backtrace: CI
/// keeps the head and the tail of a long log, and a backtrace of xtask
/// (RUST_BACKTRACE set by the environment) pushed a failing test's message
/// out of the tail.
fn main() {
    if let Err(e) = xtask_main() {
        eprintln!("xtask: {e:#}");
        std::process::exit(1);
    }
}

fn xtask_main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Cmd::Setup => setup::all(),
        Cmd::Build => build_release(),
        Cmd::Run { duration, out } => {
            setup::all()?;
            build_release()?;
            let out = out.unwrap_or_else(|| workspace_root().join("target/vitalsd-demo.pftrace"));
            run(
                std::process::Command::new(workspace_root().join("target/release/vitalsd"))
                    .args(["record", "--duration", &duration, "--out"])
                    .arg(&out),
            )
        }
        Cmd::Test { require_all, vm } => test(require_all, vm),
        Cmd::VmTest(opts) => {
            setup::all()?;
            vm::run(opts)
        }
        Cmd::VmDownload(opts) => vm::download(&opts),
        Cmd::Dist { target } => dist::run_dist(target),
        Cmd::AndroidBpf => android_bpf::run(&workspace_root()).map(|_| ()),
        Cmd::AndroidCheck { aosp, require_all } => {
            setup::all()?;
            android_check::run(aosp, require_all).map(|_| ())
        }
        Cmd::BenchOffcpuGuest {
            rounds,
            loops,
            vitalsd,
            baseline,
            settle_s,
        } => bench_offcpu::run_in_guest(rounds, loops, vitalsd, baseline, settle_s),
        Cmd::Bench { which } => {
            setup::all()?;
            build_release()?;
            match which {
                Bench::Overhead {
                    rounds,
                    loops,
                    android: true,
                    aosp,
                    ..
                } => android_check::bench::run(rounds, loops, aosp),
                Bench::Overhead {
                    rounds,
                    loops,
                    baseline,
                    ..
                } => bench_overhead::run(rounds, loops, baseline),
                Bench::Offcpu {
                    rounds,
                    loops,
                    accel,
                    timeout_min,
                    baseline,
                    settle_s,
                } => bench_offcpu::run(
                    rounds,
                    loops,
                    accel,
                    timeout_min,
                    baseline.as_deref(),
                    settle_s,
                ),
                Bench::Idle { seconds, baseline } => bench_idle::run(seconds, baseline),
                Bench::AlwaysOn {
                    seconds,
                    rounds,
                    loops,
                } => bench_always_on::run(seconds, rounds, loops),
                Bench::Scan => bench_scan::run(&workspace_root().join("target/release/vitalsd")),
                Bench::Capture { transport } => bench_capture::run(&transport),
                Bench::Producer { seconds } => bench_producer::run(seconds),
            }
        }
    }
}

fn build_release() -> Result<()> {
    run(cargo().args(["build", "--release", "-p", "vitalsd", "--bins"]))
}

fn test(require_all: bool, vm: bool) -> Result<()> {
    setup::all()?;
    // The guests' packages download while the host build compiles.
    let vm_opts = vm::Opts::guests(require_all);
    let downloads = if vm {
        Some(vm::Downloads::start(&vm_opts)?)
    } else {
        None
    };
    // Unit, property and schema tests of every default member.
    run(cargo().args([
        "test",
        "--workspace",
        "--exclude",
        "vitals-ebpf",
        "--exclude",
        "vitals-tests",
    ]))?;
    let mut not_run = Vec::new();
    // Kernel integration tests: they spawn the daemon binary, and their
    // workloads must not compete with each other for the CPUs.
    run(cargo().args(["build", "-p", "vitalsd", "--bins"]))?;
    // Nothing may run beside the kernel suites (see vm::Downloads).
    if let Some(d) = downloads {
        d.finish();
    }
    let mut cmd = cargo();
    cmd.args(["test", "-p", "vitals-tests"]);
    for file in integration_test_files()? {
        let need = suites::TEST_FILE_NEEDS
            .iter()
            .find(|(f, _)| *f == file)
            .map(|(_, tool)| *tool);
        match need.map(|tool| (tool, tool.find())) {
            None => {}
            Some((tool, Ok(path))) => {
                cmd.env(tool.env_var(), path);
            }
            Some((tool, Err(why))) => {
                not_run.push(suites::NotRun {
                    suite: format!("tests/tests/{file}.rs"),
                    tool,
                    why,
                });
                continue;
            }
        }
        cmd.args(["--test", &file]);
    }
    leftovers::become_subreaper()?;
    let kernel_suites = run(cmd
        .args(["--", "--test-threads=1"])
        // A failing test's message must end its output: CI keeps the head
        // and the tail of a long log, and a backtrace of the test harness
        // (RUST_BACKTRACE set by the environment) pushed it out of both.
        // The panic's file:line still says where.
        .env("RUST_BACKTRACE", "0")
        .env("VITALSD_BIN", workspace_root().join("target/debug/vitalsd")));
    // Checked even when a test failed: a panicking test is the likeliest
    // to leave its load running.
    let leaked = leftovers::check();
    kernel_suites?;
    leaked?;
    // Android's own tools on our Android pieces (AOSP's loader, policy
    // compiler and contexts checker); what cannot run is reported below.
    let android = android_check::run(None, false)?;
    for (check, outcome) in &android.checks {
        if let android_check::Outcome::NotRun { why, .. } = outcome {
            not_run.push(suites::NotRun {
                suite: format!("android-check {check}"),
                tool: suites::Tool::AospTree,
                why: why.clone(),
            });
        }
    }
    suites::report(&not_run);
    if require_all && !not_run.is_empty() {
        anyhow::bail!(
            "--require-all: {} suite(s) could not run (see above)",
            not_run.len()
        );
    }
    if vm {
        vm::run(vm_opts)
    } else {
        eprintln!(
            "xtask test: the kernel matrix (QEMU guests on 5.10, 6.1 and 6.12, x86_64 and \
             arm64) was not run: `cargo xtask test --vm` or `cargo xtask vm-test` runs it"
        );
        Ok(())
    }
}

/// The kernel integration test targets: tests/tests/*.rs, by file stem.
fn integration_test_files() -> Result<Vec<String>> {
    let dir = workspace_root().join("tests/tests");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let p = e.path();
            (p.extension()? == "rs").then(|| p.file_stem()?.to_str().map(str::to_owned))?
        })
        .collect();
    files.sort();
    Ok(files)
}
