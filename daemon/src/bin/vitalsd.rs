//! vitalsd: the daemon binary. anyhow lives here, at the edge, only.

use std::{
    path::PathBuf,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use vitalsd::{
    bpf::{AccountingConfig, CaptureSizing, FaultSourceChoice, MapLimits},
    capture::CaptureOptions,
    record::{record, RecordOptions},
    snapshot::{run_snapshot, scan_repeat, SnapshotOptions},
};

#[derive(Parser)]
#[command(
    name = "vitalsd",
    version,
    about = "Always-on CPU, scheduling and page-fault vitals"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Account CPU, switches, runqueue wait and faults with eBPF for a window
    /// and write a Perfetto trace.
    Record {
        /// How long to record, e.g. 10s, 500ms, 2m.
        #[arg(long, default_value = "10s", value_parser = parse_duration)]
        duration: Duration,
        /// Trace file to write.
        #[arg(long, default_value = "vitalsd.pftrace")]
        out: PathBuf,
        /// Sampling interval of the maps.
        #[arg(long, default_value = "1s", value_parser = parse_duration)]
        interval: Duration,
        /// Fault source: auto (tracepoint where present), tracepoint, perf, off.
        #[arg(long, default_value = "auto")]
        fault_source: FaultSourceChoice,
        /// Bound of the per-thread maps (entries).
        #[arg(long, default_value_t = MapLimits::default().max_tasks)]
        max_tasks: u32,
        /// Bound of the per-process fault map (entries).
        #[arg(long, default_value_t = MapLimits::default().max_processes)]
        max_processes: u32,
        /// Do not account runqueue wait (saves the sched_wakeup programs).
        #[arg(long)]
        no_runq_wait: bool,
        /// Rows of the top table (0 = all).
        #[arg(long, default_value_t = 15)]
        top: usize,
        /// Keep all capabilities (for debugging); by default vitalsd drops to
        /// CAP_BPF and sets no_new_privs after attaching.
        #[arg(long)]
        keep_privileges: bool,
        #[arg(long, default_value = "/proc", hide = true)]
        proc_root: PathBuf,
        /// Capture every sched_switch and sched_waking (Perfetto per-CPU
        /// timeline and thread states).
        #[arg(long)]
        sched: bool,
        /// Capture sampled user page faults with their call stacks
        /// (flamegraph per process).
        #[arg(long)]
        faults: bool,
        /// Sample one fault in N per process (with --faults).
        #[arg(long, default_value_t = CaptureOptions::default().fault_period)]
        fault_period: u32,
        /// Capture ring buffer size in KiB (a power of two).
        #[arg(long, default_value_t = CaptureSizing::default().ring_bytes / 1024)]
        capture_buffer_kb: u32,
    },
    /// One window of procfs vitals, like `dumpsys cpuinfo`: load, per-process
    /// CPU (% total = user + kernel) and faults, then the system line.
    Snapshot {
        /// Window length between the two samples.
        #[arg(long, default_value = "1s", value_parser = parse_duration)]
        interval: Duration,
        /// Also list threads under each process.
        #[arg(long)]
        threads: bool,
        #[arg(long, default_value = "/proc")]
        proc_root: PathBuf,
    },
    /// Scan procfs N times and print what was read (for `cargo xtask bench scan`).
    Scan {
        #[arg(long)]
        threads: bool,
        #[arg(long, default_value_t = 1)]
        repeat: u32,
        #[arg(long, default_value = "/proc")]
        proc_root: PathBuf,
    },
}

/// "10s", "500ms", "2m", "1h", or bare seconds.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, mult_ms) = if let Some(n) = s.strip_suffix("ms") {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1e3)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60e3)
    } else if let Some(n) = s.strip_suffix('h') {
        (n, 3600e3)
    } else {
        (s, 1e3)
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("bad duration {s:?} (examples: 10s, 500ms, 2m)"))?;
    if !v.is_finite() || v <= 0.0 {
        return Err(format!("duration {s:?} must be positive"));
    }
    Ok(Duration::from_secs_f64(v * mult_ms / 1e3))
}

/// SIGINT/SIGTERM set `stop` and wake the main thread; a second one exits
/// at once (exit status 130), for a user whose first Ctrl-C seems stuck.
fn stop_flag() -> Result<Arc<AtomicBool>> {
    use signal_hook::{consts::*, iterator::Signals};
    let stop = Arc::new(AtomicBool::new(false));
    let mut signals = Signals::new([SIGINT, SIGTERM]).context("installing signal handlers")?;
    let main = std::thread::current();
    let flag = Arc::clone(&stop);
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                if flag.swap(true, Ordering::SeqCst) {
                    log::warn!("second signal {sig}: exiting now");
                    std::process::exit(130);
                }
                log::info!("signal {sig}: stopping after the current sample");
                main.unpark();
            }
        })
        .context("spawning the signal thread")?;
    Ok(stop)
}

fn main() -> Result<()> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let cli = Cli::parse();
    match cli.command {
        Command::Record {
            duration,
            out,
            interval,
            fault_source,
            max_tasks,
            max_processes,
            no_runq_wait,
            top,
            keep_privileges,
            proc_root,
            sched,
            faults,
            fault_period,
            capture_buffer_kb,
        } => {
            let stop = stop_flag()?;
            let capture = CaptureOptions {
                sched,
                faults,
                fault_period: fault_period.max(1),
                ..CaptureOptions::default()
            };
            let opts = RecordOptions {
                duration,
                out,
                interval,
                accounting: AccountingConfig {
                    fault_source,
                    limits: MapLimits {
                        max_tasks,
                        max_processes,
                        ..MapLimits::default()
                    },
                    runq_wait: !no_runq_wait,
                    capture: capture.any().then(|| CaptureSizing {
                        ring_bytes: capture_buffer_kb.saturating_mul(1024),
                        ..CaptureSizing::default()
                    }),
                    ..AccountingConfig::default()
                },
                proc_root,
                drop_privileges: !keep_privileges,
                capture,
            };
            let summary = record(&opts, &stop).context("vitalsd record")?;
            print!("{}", summary.render(top));
        }
        Command::Snapshot {
            interval,
            threads,
            proc_root,
        } => {
            let opts = SnapshotOptions {
                proc_root,
                interval,
                threads,
                hz: None,
            };
            print!("{}", run_snapshot(&opts).context("vitalsd snapshot")?);
        }
        Command::Scan {
            threads,
            repeat,
            proc_root,
        } => {
            println!(
                "{}",
                scan_repeat(&proc_root, threads, repeat).context("vitalsd scan")?
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("abc").is_err());
        assert!(parse_duration("-1s").is_err());
    }
}
