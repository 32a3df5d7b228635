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
    bpf::{AccountingConfig, FaultSourceChoice, MapLimits},
    heapprofd::{
        self, ContinuousDump, HeapProfileRequest, Heaps, RateLimiter, RateLimits, RequestLimits,
        RunnerConfig, SessionRunner, TargetStatus,
    },
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
    /// Native-heap profile of a process through Perfetto's heapprofd, started
    /// via the perfetto client (as a trusted initiator when run as uid 1000).
    /// Writes the trace and `<out>.meta.json` with heapprofd's outcome.
    Heap {
        /// Process name as heapprofd matches it (normalised cmdline:
        /// basename of argv[0], cut at '@'); repeatable.
        #[arg(long = "name")]
        names: Vec<String>,
        /// Process id; repeatable.
        #[arg(long = "pid")]
        pids: Vec<u64>,
        #[arg(long, default_value = "30s", value_parser = parse_duration)]
        duration: Duration,
        #[arg(long, default_value = "heap.pftrace")]
        out: PathBuf,
        /// The perfetto command-line client.
        #[arg(long, default_value = heapprofd::DEFAULT_PERFETTO_BIN)]
        perfetto_bin: PathBuf,
        /// Persisted rate-limit history.
        #[arg(long, default_value_os_t = heapprofd::default_state_file())]
        state_file: PathBuf,
        #[arg(long, default_value_t = heapprofd::config::DEFAULT_SAMPLING_INTERVAL_BYTES)]
        sampling_interval_bytes: u64,
        #[arg(long, default_value_t = heapprofd::config::DEFAULT_SHMEM_SIZE_BYTES)]
        shmem_size_bytes: u64,
        /// Stall the target's malloc instead of dropping the profile when
        /// the shared buffer fills.
        #[arg(long)]
        block_client: bool,
        /// Record every registered heap, not just libc.malloc.
        #[arg(long, conflicts_with = "heaps")]
        all_heaps: bool,
        /// Heap to record; repeatable.
        #[arg(long = "heap")]
        heaps: Vec<String>,
        /// Dump every interval during the session (leak windows).
        #[arg(long, value_parser = parse_duration)]
        dump_interval: Option<Duration>,
        #[arg(long)]
        max_heapprofd_memory_kb: Option<u32>,
        #[arg(long)]
        max_heapprofd_cpu_secs: Option<u64>,
        #[arg(long)]
        bugreport_score: Option<i32>,
        /// Longest session accepted.
        #[arg(long, default_value = "10m", value_parser = parse_duration)]
        max_duration: Duration,
        #[arg(long, default_value_t = RateLimits::default().target_per_hour)]
        target_per_hour: u32,
        #[arg(long, default_value_t = RateLimits::default().target_per_day)]
        target_per_day: u32,
        #[arg(long, default_value_t = RateLimits::default().system_per_hour)]
        system_per_hour: u32,
        #[arg(long, default_value_t = RateLimits::default().system_per_day)]
        system_per_day: u32,
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
        } => {
            let stop = stop_flag()?;
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
                    ..AccountingConfig::default()
                },
                proc_root,
                drop_privileges: !keep_privileges,
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
        Command::Heap {
            names,
            pids,
            duration,
            out,
            perfetto_bin,
            state_file,
            sampling_interval_bytes,
            shmem_size_bytes,
            block_client,
            all_heaps,
            heaps,
            dump_interval,
            max_heapprofd_memory_kb,
            max_heapprofd_cpu_secs,
            bugreport_score,
            max_duration,
            target_per_hour,
            target_per_day,
            system_per_hour,
            system_per_day,
        } => {
            let ms = |d: Duration| u32::try_from(d.as_millis()).unwrap_or(u32::MAX);
            let request = HeapProfileRequest {
                process_names: names,
                pids,
                duration_ms: ms(duration),
                sampling_interval_bytes,
                shmem_size_bytes,
                block_client,
                heaps: if all_heaps {
                    Heaps::All
                } else if heaps.is_empty() {
                    Heaps::Malloc
                } else {
                    Heaps::Named(heaps)
                },
                continuous_dump: dump_interval.map(|d| ContinuousDump {
                    phase_ms: ms(d),
                    interval_ms: ms(d),
                }),
                max_heapprofd_memory_kb,
                max_heapprofd_cpu_secs,
                bugreport_score,
                ..HeapProfileRequest::default()
            };
            let limits = RateLimits {
                system_per_hour,
                system_per_day,
                target_per_hour,
                target_per_day,
            };
            let limiter = RateLimiter::load(&state_file, limits)?;
            let runner = SessionRunner::new(
                RunnerConfig {
                    perfetto_bin,
                    limits: RequestLimits {
                        max_duration_ms: ms(max_duration),
                    },
                    ..RunnerConfig::default()
                },
                limiter,
            );
            let stop = stop_flag()?;
            let report = runner.run(&request, &out, &stop).context("vitalsd heap")?;
            println!("session: {:?}", report.status);
            match &report.outcome {
                None => println!(
                    "no trace: {}",
                    report.outcome_error.as_deref().unwrap_or("unknown")
                ),
                Some(o) => {
                    for p in &o.processes {
                        println!(
                            "pid {} {}: {} dump(s), {} sample(s), interval {:?} B, issues {:?}",
                            p.pid,
                            p.name.as_deref().unwrap_or("?"),
                            p.dumps,
                            p.samples,
                            p.sampling_interval_bytes,
                            p.issues
                        );
                    }
                    for t in &o.targets {
                        if let TargetStatus::NoProfile { likely_causes } = &t.status {
                            println!("{}: no profile; likely:", t.target);
                            for c in likely_causes {
                                println!("  - {c}");
                            }
                        }
                    }
                }
            }
            println!(
                "trace {} metadata {}",
                out.display(),
                heapprofd::metadata_path(&out).display()
            );
            if !report.success() {
                anyhow::bail!("heap profile incomplete (see above)");
            }
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
