//! `cargo xtask vm-test`: the kernel matrix. The kernel integration tests
//! (tests/tests/*.rs, the very binaries cargo builds) run inside QEMU guests
//! booted on Debian's own kernels, for x86_64 and arm64, and on this host;
//! the result is a table of kernel × arch × check.
//!
//! How a guest is put together (one module each):
//! - `apt`: Debian's kernel packages (and arm64's Rust std and busybox),
//!   fetched with `apt-get download` through a private apt configuration and
//!   cached under target/vm/, so a second run downloads nothing;
//! - `kernel`: a kernel package unpacked: its image and the few virtio
//!   modules the guest needs, in load order;
//! - `binaries`: the test binaries for each arch (the host build for x86_64,
//!   a cross build with Debian's rustc and arm64 std for arm64), stripped of
//!   debug info, with the shared libraries they load;
//! - `initramfs`: busybox, the binaries, the modules and an /init that runs
//!   the checks, as a newc cpio the kernel unpacks into RAM;
//! - `checks`: which tests run (a CI subset, or all with `--full`), the
//!   shell script that runs them, and the parser of their output;
//! - `guest`: QEMU (TCG: guests hang under this machine's KVM) with a
//!   per-guest timeout, killed by process group from a Drop guard;
//! - `relay`: the host end of the decoder relay. Guests have no Python, so
//!   the tests' calls to the official Perfetto decoder are forwarded over a
//!   virtio-serial port and run on the host with the same script and venv;
//! - `bpfloader`: AOSP's bpfloader built for x86_64 and vitals.o, for the
//!   `android::bpfloader-pins` row (check 1a of #12 on each x86_64 kernel).

mod apt;
mod binaries;
mod bpfloader;
mod checks;
mod guest;
mod initramfs;
pub(crate) mod kernel;
mod relay;
mod subset;

/// The Debian mirror of the machine's apt sources (`bench offcpu`'s debootstrap).
pub use apt::main_mirror as debian_mirror;

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use crate::util::workspace_root;
use checks::{CheckId, Outcome, Plan};

/// Guest and host architectures of the matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum Arch {
    #[value(name = "x86_64", alias = "amd64")]
    X86_64,
    #[value(name = "arm64", alias = "aarch64")]
    Arm64,
}

impl Arch {
    pub fn name(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64",
            Arch::Arm64 => "arm64",
        }
    }

    /// Debian's architecture name.
    pub fn debian(self) -> &'static str {
        match self {
            Arch::X86_64 => "amd64",
            Arch::Arm64 => "arm64",
        }
    }

    pub fn rust_target(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64-unknown-linux-gnu",
            Arch::Arm64 => "aarch64-unknown-linux-gnu",
        }
    }

    /// What `vitalsd record` must name as its fault source when left on
    /// `auto`: x86 has the exceptions/page_fault_user tracepoint; arm64 has
    /// none, so the perf software events are its default (FaultSource::describe).
    pub fn expected_fault_source(self) -> &'static str {
        match self {
            Arch::X86_64 => "tracepoint exceptions/page_fault_user",
            Arch::Arm64 => "perf software events minor-faults + major-faults",
        }
    }
}

/// The Debian kernels of the matrix: (series, suite that ships it, arches).
/// This host's own kernel is the matrix's newest x86_64 cell.
const KERNELS: &[(&str, &str, &[Arch])] = &[
    ("6.12", "trixie", &[Arch::X86_64]),
    ("6.1", "bookworm", &[Arch::X86_64, Arch::Arm64]),
    ("5.10", "bullseye", &[Arch::X86_64, Arch::Arm64]),
];

/// One column of the matrix: a kernel on an arch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cell {
    /// This machine, natively.
    Host,
    Guest {
        arch: Arch,
        series: &'static str,
        suite: &'static str,
    },
}

impl Cell {
    pub fn arch(&self) -> Arch {
        match self {
            Cell::Host => Arch::X86_64,
            Cell::Guest { arch, .. } => *arch,
        }
    }

    fn series(&self) -> String {
        match self {
            Cell::Host => {
                let rel = nix_release();
                let mut it = rel.split('.');
                format!(
                    "{}.{} (host)",
                    it.next().unwrap_or("?"),
                    it.next().unwrap_or("?")
                )
            }
            Cell::Guest { series, .. } => (*series).to_owned(),
        }
    }

    /// A file-name-safe tag: `x86_64-5.10`, `x86_64-host`.
    pub fn tag(&self) -> String {
        match self {
            Cell::Host => "x86_64-host".into(),
            Cell::Guest { arch, series, .. } => format!("{}-{series}", arch.name()),
        }
    }
}

fn nix_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "?".into())
}

#[derive(clap::Args, Debug)]
pub struct Opts {
    /// Only these architectures (x86_64, arm64); default: both.
    #[arg(long = "arch")]
    arches: Vec<Arch>,
    /// Only these kernels: 5.10, 6.1, 6.12, or `host`; default: all.
    #[arg(long = "kernel")]
    kernels: Vec<String>,
    /// Every kernel test of accounting, capture, pins and record (minus the
    /// ones that need bpftrace), instead of the CI subset.
    #[arg(long)]
    full: bool,
    /// Seconds a guest may run before it is killed and its unfinished
    /// checks fail (default: 300, four times the slowest cell seen, or
    /// 3600 with --full).
    #[arg(long)]
    timeout: Option<u64>,
    /// Only the tests whose `file::name` contains this (the daemon's own
    /// checks still run): for chasing one check or one file across boots.
    #[arg(long)]
    only: Option<String>,
    /// Fail when a check could not run for a missing tool (the AOSP tree
    /// of android::bpfloader-pins); without it such a row is only
    /// reported, loudly, as NOT RUN.
    #[arg(long)]
    require_all: bool,
}

impl Opts {
    /// Every guest cell, the CI subset (`cargo xtask test --vm`).
    pub fn guests(require_all: bool) -> Self {
        Self {
            arches: Vec::new(),
            kernels: KERNELS.iter().map(|(k, _, _)| k.to_string()).collect(),
            full: false,
            timeout: None,
            only: None,
            require_all,
        }
    }
}

/// What one cell produced.
struct CellRun {
    cell: Cell,
    /// The exact kernel: the package and release for guests.
    kernel: String,
    wall: Duration,
    results: Vec<(CheckId, Outcome)>,
    log: PathBuf,
}

pub fn run(opts: Opts) -> Result<()> {
    let started = Instant::now();
    let cells = select_cells(&opts)?;
    let timeout = Duration::from_secs(opts.timeout.unwrap_or(if opts.full { 3600 } else { 300 }));
    let root = workspace_root();
    let vm_dir = root.join("target/vm");
    let logs = vm_dir.join("logs");
    std::fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;

    // The x86_64 binaries serve the host cell and the x86_64 guests, and
    // list the tests for --full.
    let x86 = binaries::build(Arch::X86_64)?;
    // After the x86_64 build: vitals.o is converted from the aya object
    // the daemon's build.rs made.
    let aosp = if cells.iter().any(|c| c.arch() == Arch::X86_64) {
        bpfloader::prepare(&root)
    } else {
        bpfloader::Bpfloader::NotRun("no x86_64 cell".into())
    };
    let plan = Plan::new(opts.full, &x86)?
        .with_bpfloader(aosp)
        .only(opts.only.as_deref());
    let arm64 = if cells.iter().any(|c| c.arch() == Arch::Arm64) {
        Some(binaries::build(Arch::Arm64)?)
    } else {
        None
    };

    let mut runs = Vec::new();
    for cell in &cells {
        let plan = plan.for_cell(cell);
        let log = logs.join(format!("{}.log", cell.tag()));
        eprintln!("== vm-test: {} {} ==", cell.arch().name(), cell.series());
        let t0 = Instant::now();
        let outcome = match cell {
            Cell::Host => run_host(&plan, &x86, &log).map(|r| (nix_release(), r)),
            Cell::Guest {
                arch,
                series,
                suite,
            } => {
                let bins = match arch {
                    Arch::X86_64 => &x86,
                    Arch::Arm64 => arm64.as_ref().unwrap(),
                };
                run_guest(&plan, *arch, series, suite, bins, &vm_dir, &log, timeout)
            }
        };
        let (kernel, results) = match outcome {
            Ok(r) => r,
            // A cell that could not even start fails every check, with the
            // reason in each, and the matrix goes on.
            Err(e) => {
                let why = format!("{e:#}");
                eprintln!("vm-test: {}: {why}", cell.tag());
                (
                    "?".into(),
                    plan.for_arch(cell.arch())
                        .into_iter()
                        .map(|c| (c, Outcome::Missing(why.clone())))
                        .collect(),
                )
            }
        };
        runs.push(CellRun {
            cell: cell.clone(),
            kernel,
            wall: t0.elapsed(),
            results,
            log,
        });
    }
    let (failed, not_run) = print_table(&runs, opts.full);
    eprintln!(
        "vm-test: total {:.0} s ({} mode)",
        started.elapsed().as_secs_f64(),
        if opts.full { "full" } else { "CI subset" }
    );
    if failed > 0 {
        bail!("{failed} cell(s) of the kernel matrix failed");
    }
    if not_run > 0 {
        let bar = "=".repeat(78);
        eprintln!(
            "{bar}\nvm-test: {not_run} CELL(S) DID NOT RUN (NOT RUN rows above): a tool is missing; \
             {}\n{bar}",
            crate::suites::Tool::AospTree.how()
        );
        if opts.require_all {
            bail!("vm-test: {not_run} cell(s) could not run and --require-all was given");
        }
    }
    Ok(())
}

/// The matrix's downloads, which need no guest and little CPU: the
/// guests' kernel packages and the arm64 standard library for the cross
/// build. `cargo xtask test --vm` runs them ([`Downloads`]) while the host
/// build compiles, so `run` finds them cached.
pub fn download(opts: &Opts) -> Result<()> {
    let cells = select_cells(opts)?;
    for cell in &cells {
        if let Cell::Guest {
            arch,
            series,
            suite,
        } = cell
        {
            apt::kernel_deb(*arch, series, suite)?;
        }
    }
    if cells.iter().any(|c| c.arch() == Arch::Arm64) {
        apt::arm64_rust_sysroot()?;
    }
    Ok(())
}

/// `xtask vm-download` in the background, logging to
/// target/vm/logs/download.log. Waited for before the kernel suites start:
/// network interrupts and softirqs on a CPU are time the eBPF slices of
/// whatever runs there include and the kernel's runtime does not (README
/// "Kernel support"), so nothing may run beside the suites. Nor does the
/// arm64 cross build run beside them for that reason; it runs in `run`.
pub struct Downloads {
    group: crate::util::Group,
    log: PathBuf,
    started: Instant,
}

impl Downloads {
    pub fn start(opts: &Opts) -> Result<Self> {
        let logs = workspace_root().join("target/vm/logs");
        std::fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
        let log = logs.join("download.log");
        let out =
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let mut cmd = std::process::Command::new(std::env::current_exe()?);
        cmd.arg("vm-download");
        for k in &opts.kernels {
            cmd.args(["--kernel", k]);
        }
        for a in &opts.arches {
            cmd.args(["--arch", a.name()]);
        }
        cmd.stdin(std::process::Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out);
        // Its own process group: a run that fails first ends apt with it.
        let group = crate::util::Group::spawn(&mut cmd).context("starting xtask vm-download")?;
        eprintln!(
            "xtask test: downloading the kernel matrix's packages in the background (log {})",
            log.display()
        );
        Ok(Self {
            group,
            log,
            started: Instant::now(),
        })
    }

    /// Waits for them. A failure is reported, not returned: `run` redoes
    /// what is missing, where its error then shows.
    pub fn finish(mut self) {
        match self.group.0.wait() {
            Ok(s) if s.success() => eprintln!(
                "xtask test: kernel matrix packages downloaded in the background ({:.0} s)",
                self.started.elapsed().as_secs_f64()
            ),
            other => eprintln!(
                "xtask test: the background download failed ({other:?}; log {}); vm-test \
                 retries it",
                self.log.display()
            ),
        }
    }
}

fn select_cells(opts: &Opts) -> Result<Vec<Cell>> {
    for k in &opts.kernels {
        if k != "host" && !KERNELS.iter().any(|(s, _, _)| s == k) {
            bail!("unknown kernel {k:?}: 5.10, 6.1, 6.12 or host");
        }
    }
    let arch_ok = |a: Arch| opts.arches.is_empty() || opts.arches.contains(&a);
    let kernel_ok = |k: &str| opts.kernels.is_empty() || opts.kernels.iter().any(|x| x == k);
    let mut cells = Vec::new();
    if arch_ok(Arch::X86_64) && kernel_ok("host") {
        cells.push(Cell::Host);
    }
    for arch in [Arch::X86_64, Arch::Arm64] {
        for (series, suite, arches) in KERNELS {
            if arches.contains(&arch) && arch_ok(arch) && kernel_ok(series) {
                cells.push(Cell::Guest {
                    arch,
                    series,
                    suite,
                });
            }
        }
    }
    if cells.is_empty() {
        bail!("no cell of the matrix matches --arch/--kernel");
    }
    Ok(cells)
}

/// The host cell: the same script and checks, natively, with the real
/// Python decoder.
fn run_host(
    plan: &Plan,
    bins: &binaries::Binaries,
    log: &std::path::Path,
) -> Result<Vec<(CheckId, Outcome)>> {
    let dir = workspace_root().join("target/vm/host");
    std::fs::create_dir_all(&dir)?;
    let paths = checks::Paths::host(
        bins,
        plan.bpfloader_for(Arch::X86_64)
            .unwrap_or(&bpfloader::Bpfloader::NotRun(String::new())),
    )?;
    let script = dir.join("run-checks.sh");
    std::fs::write(&script, plan.script(Arch::X86_64, &paths))?;
    let mut child = std::process::Command::new("sh")
        .arg(&script)
        .env("VITALS_PYTHON", relay::host_python())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("running the checks on the host")?;
    let text = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let log_file = std::sync::Arc::new(std::sync::Mutex::new(
        std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?,
    ));
    let readers: Vec<_> = [
        Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
        Box::new(child.stderr.take().unwrap()),
    ]
    .into_iter()
    .map(|src| {
        let (text, log_file) = (text.clone(), log_file.clone());
        std::thread::spawn(move || guest::echo(src, &text, &log_file, "[x86_64 host]"))
    })
    .collect();
    child.wait()?;
    for r in readers {
        let _ = r.join();
    }
    let text = text.lock().unwrap().clone();
    let finished = text.contains("@@vm done");
    Ok(plan.parse(Arch::X86_64, &text, finished))
}

#[allow(clippy::too_many_arguments)]
fn run_guest(
    plan: &Plan,
    arch: Arch,
    series: &str,
    suite: &str,
    bins: &binaries::Binaries,
    vm_dir: &std::path::Path,
    log: &std::path::Path,
    timeout: Duration,
) -> Result<(String, Vec<(CheckId, Outcome)>)> {
    let deb = apt::kernel_deb(arch, series, suite)?;
    let work = vm_dir
        .join("work")
        .join(format!("{}-{series}", arch.name()));
    let kernel = kernel::Kernel::unpack(&deb, &work)?;
    let initrd = work.join("initramfs.cpio");
    let extra = match plan.bpfloader_for(arch) {
        Some(bpfloader::Bpfloader::Ready { loader, object }) => vec![
            (bpfloader::GUEST_LOADER, loader.as_path(), true),
            (bpfloader::GUEST_OBJECT, object.as_path(), false),
        ],
        _ => Vec::new(),
    };
    initramfs::write(
        &initrd,
        arch,
        bins,
        &extra,
        &kernel,
        &plan.script(arch, &checks::Paths::guest()),
    )?;
    let mut run = guest::boot(arch, series, &kernel, &initrd, &work, log, timeout)?;
    let mut label = format!("{} ({})", kernel.release, kernel.package);
    // TCG hiccups, never seen on the host or with a check failing the same
    // way twice: a test thread stuck in the kernel until the guest panics
    // (softlockup_panic), or a guest that stops making progress until the
    // timeout. Every one seen was an x86_64 guest under multi-threaded TCG
    // at a tracepoint's attach or detach (see guest.rs, which now runs x86
    // guests in single-threaded TCG). Up to two more boots tell such a
    // hiccup from a defect, which fails every time; the table says it
    // happened and each console is kept.
    let mut boot = 1;
    let hiccup = |run: &guest::GuestRun| {
        !run.finished && (run.timed_out || run.console.contains("soft lockup"))
    };
    while hiccup(&run) && boot < HICCUP_BOOTS {
        let kept = log.with_extension(format!("hiccup-{boot}.log"));
        std::fs::copy(log, &kept).with_context(|| format!("keeping {}", log.display()))?;
        eprintln!(
            "vm-test: [{} {}] {} before the checks finished (console kept in {}); booting again",
            arch.name(),
            kernel.release,
            if run.timed_out { "HUNG" } else { "SOFT LOCKUP" },
            kept.display()
        );
        run = guest::boot(arch, series, &kernel, &initrd, &work, log, timeout)?;
        boot += 1;
    }
    if boot > 1 {
        label.push_str(&format!(
            " [boot {boot}: the {} before hung or hit a soft lockup]",
            if boot == 2 { "one" } else { "ones" }
        ));
    }
    let mut results = plan.parse(arch, &run.console, run.finished);
    if !run.finished {
        let why = if run.timed_out {
            format!("guest killed after {} s timeout", timeout.as_secs())
        } else {
            "guest stopped before the checks finished".to_owned()
        };
        for (_, o) in results.iter_mut() {
            if let Outcome::Missing(m) = o {
                *m = format!("{m}; {why}");
            }
        }
    }
    Ok((label, results))
}

/// Boots of one cell while each hangs or ends in a soft lockup (see
/// `run_guest`).
const HICCUP_BOOTS: u32 = 3;

/// Prints the table; returns the numbers of failed and of not-run cells
/// (kernel × arch × check).
fn print_table(runs: &[CellRun], full: bool) -> (usize, usize) {
    let (mut failed, mut not_run) = (0, 0);
    println!();
    println!(
        "kernel matrix ({}):",
        if full {
            "full: every kernel test that runs without bpftrace"
        } else {
            "CI subset; --full runs every kernel test"
        }
    );
    println!(
        "{:<12} {:<7} {:<78} {:<7} note",
        "KERNEL", "ARCH", "CHECK", "RESULT"
    );
    for r in runs {
        for (id, outcome) in &r.results {
            let (res, note) = match outcome {
                Outcome::Pass => ("pass", String::new()),
                Outcome::Fail(n) => ("FAIL", n.clone()),
                Outcome::Missing(n) => ("FAIL", n.clone()),
                Outcome::NotRun(n) => {
                    not_run += 1;
                    ("NOT RUN", format!("!!! {n}"))
                }
            };
            if res == "FAIL" {
                failed += 1;
            }
            let note: String = note.chars().take(200).collect();
            println!(
                "{:<12} {:<7} {:<78} {:<7} {note}",
                r.cell.series(),
                r.cell.arch().name(),
                id.to_string(),
                res
            );
        }
    }
    if runs.iter().any(|r| r.cell.arch() == Arch::Arm64) {
        println!(
            "(android::{} runs on x86_64 only: the AOSP loader is built for this host; \
             arm64 guests would need it cross-built against arm64 libbase/liblog/libcutils)",
            bpfloader::ROW
        );
    }
    println!();
    println!(
        "{:<12} {:<7} {:>8} {:>6} {:>6} {:>7}  kernel / log",
        "KERNEL", "ARCH", "WALL_S", "PASS", "FAIL", "NOT_RUN"
    );
    for r in runs {
        let pass = r
            .results
            .iter()
            .filter(|(_, o)| matches!(o, Outcome::Pass))
            .count();
        let skipped = r
            .results
            .iter()
            .filter(|(_, o)| matches!(o, Outcome::NotRun(_)))
            .count();
        println!(
            "{:<12} {:<7} {:>8.0} {:>6} {:>6} {:>7}  {} / {}",
            r.cell.series(),
            r.cell.arch().name(),
            r.wall.as_secs_f64(),
            pass,
            r.results.len() - pass - skipped,
            skipped,
            r.kernel,
            r.log.display()
        );
    }
    (failed, not_run)
}
