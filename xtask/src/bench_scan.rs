//! `cargo xtask bench scan`: the cost of one procfs scan by vitalsd against
//! the tools people already use for the same job, in one run, on the same
//! task population.
//!
//! Load: 1000 sleeping child processes plus 5000 parked threads in this
//! process (so >= 1000 processes and >= 5000 threads exist), removed again
//! on the way out even on error (Drop guards).
//!
//! Per tool we run the command several times and take the median of
//! user+sys CPU time from wait4's rusage (startup included for everyone),
//! then count syscalls once with `perf stat -e raw_syscalls:sys_enter`
//! (falling back to `strace -f -c`). pidstat samples twice (`1 1`), so its
//! per-scan figures are halved. vitalsd's peak RSS is the VmHWM it prints
//! (`peak_rss_kb=`): ru_maxrss would report this bench's own RSS, which the
//! kernel carries across the vfork+exec that starts the child.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use anyhow::{bail, Context, Result};

const PROCESSES: usize = 1000;
const THREADS: usize = 5000;
const RUNS: usize = 5;

/// `sleep 3600` children, killed and reaped on drop.
pub(crate) struct SleepChildren(pub Vec<Child>);

impl Drop for SleepChildren {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
        }
        for c in &mut self.0 {
            let _ = c.wait();
        }
    }
}

pub(crate) struct ParkedThreads {
    stop: Arc<AtomicBool>,
    handles: Vec<JoinHandle<()>>,
}

impl Drop for ParkedThreads {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for h in &self.handles {
            h.thread().unpark();
        }
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

/// `n` sleeping child processes.
pub(crate) fn sleepers(n: usize) -> Result<SleepChildren> {
    let mut children = SleepChildren(Vec::with_capacity(n));
    for _ in 0..n {
        children.0.push(
            Command::new("sleep")
                .arg("3600")
                .stdin(Stdio::null())
                .spawn()
                .context("spawning sleep")?,
        );
    }
    Ok(children)
}

pub(crate) fn spawn_load() -> Result<(SleepChildren, ParkedThreads)> {
    let children = sleepers(PROCESSES)?;
    let stop = Arc::new(AtomicBool::new(false));
    let mut threads = ParkedThreads {
        stop: stop.clone(),
        handles: Vec::with_capacity(THREADS),
    };
    for _ in 0..THREADS {
        let stop = stop.clone();
        threads.handles.push(
            std::thread::Builder::new()
                .stack_size(64 * 1024)
                .spawn(move || {
                    while !stop.load(Ordering::SeqCst) {
                        std::thread::park();
                    }
                })
                .context("spawning a parked thread")?,
        );
    }
    Ok((children, threads))
}

struct RunCost {
    cpu_us: u64,
}

/// Runs `argv` to completion with output discarded; returns its rusage.
fn run_once(argv: &[&str]) -> Result<RunCost> {
    let child = Command::new(argv[0])
        .args(&argv[1..])
        .env("COLUMNS", "512")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("spawning {argv:?}"))?;
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: rusage is plain old data; wait4 fills it for our own child.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
    if r != pid {
        bail!("wait4 {argv:?}: {}", std::io::Error::last_os_error());
    }
    if !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
        bail!("{argv:?} failed: status {status:#x}");
    }
    let tv_us = |tv: libc::timeval| tv.tv_sec as u64 * 1_000_000 + tv.tv_usec as u64;
    Ok(RunCost {
        cpu_us: tv_us(ru.ru_utime) + tv_us(ru.ru_stime),
    })
}

fn count_syscalls(argv: &[&str]) -> Result<u64> {
    let out = Command::new("perf")
        .args(["stat", "-x,", "-e", "raw_syscalls:sys_enter", "--"])
        .args(argv)
        .env("COLUMNS", "512")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output();
    if let Ok(out) = out {
        let text = String::from_utf8_lossy(&out.stderr);
        for line in text.lines() {
            if line.contains("raw_syscalls:sys_enter") {
                if let Ok(n) = line.split(',').next().unwrap_or("").trim().parse() {
                    return Ok(n);
                }
            }
        }
    }
    // Fallback: strace's summary, "... <calls> [<errors>] total".
    let tmp = std::env::temp_dir().join(format!("bench-scan-strace-{}", std::process::id()));
    let status = Command::new("strace")
        .args(["-f", "-c", "-o"])
        .arg(&tmp)
        .args(argv)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .context("running strace (apt-get install -y strace)")?;
    if !status.success() {
        bail!("strace {argv:?} failed");
    }
    let text = std::fs::read_to_string(&tmp)?;
    let _ = std::fs::remove_file(&tmp);
    let total = text
        .lines()
        .find(|l| l.trim_end().ends_with(" total"))
        .context("no total line in strace -c output")?;
    let cols: Vec<&str> = total.split_whitespace().collect();
    cols.get(3)
        .and_then(|c| c.parse().ok())
        .context("parsing strace total")
}

struct Row {
    name: String,
    scans_per_run: u64,
    cpu_us_per_scan: f64,
    syscalls_per_scan: f64,
    peak_rss_kb: Option<u64>,
}

/// vitalsd's own report of its VmHWM, from `scan`'s one output line.
fn vitalsd_peak_rss_kb(argv: &[&str]) -> Result<Option<u64>> {
    let out = Command::new(argv[0]).args(&argv[1..]).output()?;
    if !out.status.success() {
        bail!("{argv:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("peak_rss_kb="))
        .and_then(|v| v.parse().ok()))
}

fn measure(name: &str, argv: &[&str], scans_per_run: u64) -> Result<Row> {
    let mut costs = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        costs.push(run_once(argv)?);
    }
    costs.sort_by_key(|c| c.cpu_us);
    let median = &costs[RUNS / 2];
    let peak_rss_kb = if name.starts_with("vitalsd") {
        vitalsd_peak_rss_kb(argv)?
    } else {
        None
    };
    let syscalls = count_syscalls(argv)?;
    Ok(Row {
        name: name.to_owned(),
        scans_per_run,
        cpu_us_per_scan: median.cpu_us as f64 / scans_per_run as f64,
        syscalls_per_scan: syscalls as f64 / scans_per_run as f64,
        peak_rss_kb,
    })
}

fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool} >/dev/null")])
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

fn print_group(title: &str, rows: &[Row]) -> bool {
    println!("\n{title}");
    println!(
        "  {:<44} {:>6} {:>14} {:>16} {:>12}",
        "command", "scans", "cpu ms/scan", "syscalls/scan", "VmHWM kB"
    );
    for r in rows {
        println!(
            "  {:<44} {:>6} {:>14.2} {:>16.0} {:>12}",
            r.name,
            r.scans_per_run,
            r.cpu_us_per_scan / 1000.0,
            r.syscalls_per_scan,
            r.peak_rss_kb
                .map(|k| k.to_string())
                .unwrap_or_else(|| "-".into())
        );
    }
    let ours = rows
        .iter()
        .filter(|r| r.name.starts_with("vitalsd") && r.scans_per_run == 1)
        .map(|r| r.cpu_us_per_scan)
        .fold(f64::INFINITY, f64::min);
    let peers = rows
        .iter()
        .filter(|r| !r.name.starts_with("vitalsd"))
        .map(|r| r.cpu_us_per_scan)
        .fold(f64::INFINITY, f64::min);
    let ok = ours < peers;
    println!(
        "  target (vitalsd single scan < cheapest peer): {} ({:.2} ms vs {:.2} ms)",
        if ok { "MET" } else { "MISSED" },
        ours / 1000.0,
        peers / 1000.0
    );
    ok
}

/// Runs the benchmark; `vitalsd_bin` must offer
/// `scan [--threads] [--repeat N]`, printing `ScanStats`'s Display line.
pub fn run(vitalsd_bin: &Path) -> Result<()> {
    for tool in ["top", "pidstat", "perf"] {
        if !have(tool) {
            eprintln!("bench scan: {tool} missing; try `apt-get install -y procps sysstat strace linux-perf`");
        }
    }
    if !have("top") || !have("pidstat") {
        bail!("top (procps) and pidstat (sysstat) are required");
    }
    let bin = vitalsd_bin
        .to_str()
        .context("vitalsd path is not UTF-8")?
        .to_owned();

    let (children, threads) = spawn_load()?;
    let tasks = std::fs::read_to_string("/proc/loadavg")?;
    println!(
        "bench scan: {} extra processes + {} extra threads alive; /proc/loadavg: {}",
        children.0.len(),
        threads.handles.len(),
        tasks.trim()
    );

    let procs = vec![
        measure("vitalsd scan", &[&bin, "scan"], 1)?,
        measure(
            "vitalsd scan --repeat 10",
            &[&bin, "scan", "--repeat", "10"],
            10,
        )?,
        measure("top -b -n 1", &["top", "-b", "-n", "1"], 1)?,
    ];
    let with_threads = vec![
        measure("vitalsd scan --threads", &[&bin, "scan", "--threads"], 1)?,
        measure(
            "vitalsd scan --threads --repeat 10",
            &[&bin, "scan", "--threads", "--repeat", "10"],
            10,
        )?,
        measure("top -H -b -n 1", &["top", "-H", "-b", "-n", "1"], 1)?,
        measure("pidstat -t 1 1 (2 scans)", &["pidstat", "-t", "1", "1"], 2)?,
    ];
    drop(threads);
    drop(children);

    let a = print_group("processes only", &procs);
    let b = print_group("processes and threads", &with_threads);
    println!("\n(cpu = user+sys from wait4 rusage, median of {RUNS} runs, process startup included for every tool; syscalls from perf raw_syscalls:sys_enter or strace -c)");
    if !(a && b) {
        eprintln!("bench scan: cost target missed");
    }
    Ok(())
}
