//! vitalsd: the daemon binary. anyhow lives here, at the edge, only.

use std::{path::PathBuf, sync::atomic::Ordering, time::Duration};

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use vitalsd::{
    bpf::{
        AccountingConfig, CaptureSizing, CaptureTransportChoice, FaultSourceChoice, MapLimits,
        PinMode,
    },
    capture::CaptureOptions,
    config::{parse_duration, Config},
    heapprofd::{
        self, ContinuousDump, HeapProfileRequest, Heaps, RateLimiter, RateLimits, RequestLimits,
        RunnerConfig, SessionRunner, TargetStatus,
    },
    record::{record, RecordOptions},
    service::{self, Signals},
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
    /// Run the daemon: always-on sampling, health rules, captures, control socket.
    Run {
        /// Config file (TOML); default /etc/vitalsd.toml (Android:
        /// /vendor/etc/vitalsd.toml) if it exists, else the built-in defaults.
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Load the eBPF programs and pin them and their maps on a bpffs without
    /// attaching, as bpfloader does on a device (to test `--pins` on Linux).
    Pin {
        /// A directory on a mounted bpffs (mount -t bpf bpf DIR).
        #[arg(long)]
        dir: PathBuf,
        #[arg(long, default_value = "auto")]
        fault_source: FaultSourceChoice,
    },
    /// Repair the store after a crash (vitalsd.rc `onrestart`); a no-op while
    /// a daemon runs on the store.
    CleanupAfterCrash {
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Validate a config file and print the effective config.
    CheckConfig {
        #[arg(long)]
        config: Option<PathBuf>,
    },
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
        /// Attach the classic sched tracepoints (what Android's bpfloader
        /// attaches) even where the kernel's BTF allows the cheaper tp_btf.
        #[arg(long)]
        classic_tracepoints: bool,
        /// Rows of the top table (0 = all).
        #[arg(long, default_value_t = 15)]
        top: usize,
        /// Attach the programs pinned in this bpffs directory (bpfloader's, on
        /// Android user builds) if present; load with aya otherwise.
        #[arg(long)]
        pins: Option<PathBuf>,
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
        /// Capture ring buffer size in KiB (a power of two). With the perf
        /// array it is split over the online CPUs (at least a page each).
        #[arg(long, default_value_t = CaptureSizing::default().ring_bytes / 1024)]
        capture_buffer_kb: u32,
        /// How capture records reach user space: `ringbuf`
        /// (BPF_MAP_TYPE_RINGBUF, Linux 5.8+), `perf` (per-CPU perf event
        /// array) or `auto` (ringbuf where the kernel has it).
        #[arg(long, default_value = "auto")]
        capture_transport: CaptureTransportChoice,
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
        /// TraceConfig.bugreport_score: > 0 lets `perfetto --save-for-bugreport`
        /// (dumpstate) pick the session; 0 leaves it out of bugreports.
        #[arg(long, default_value_t = heapprofd::config::DEFAULT_BUGREPORT_SCORE)]
        bugreport_score: i32,
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

/// SIGINT/SIGTERM set `stop`, SIGHUP sets `reload`; each wakes the main
/// thread. A second stop signal exits at once (status 130), for a user whose
/// first Ctrl-C seems stuck.
fn signal_flags() -> Result<Signals> {
    use signal_hook::{consts::*, iterator::Signals as SignalIter};
    let flags = Signals::default();
    let mut signals =
        SignalIter::new([SIGINT, SIGTERM, SIGHUP]).context("installing signal handlers")?;
    let main = std::thread::current();
    let f = flags.clone();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                if sig == SIGHUP {
                    log::info!("SIGHUP: reloading the config");
                    f.reload.store(true, Ordering::SeqCst);
                } else if f.stop.swap(true, Ordering::SeqCst) {
                    log::warn!("second signal {sig}: exiting now");
                    std::process::exit(130);
                } else {
                    log::info!("signal {sig}: stopping");
                }
                main.unpark();
            }
        })
        .context("spawning the signal thread")?;
    Ok(flags)
}

/// The config to use: the named file (must exist), else the default path
/// if present, else the built-in defaults.
fn load_config(path: Option<PathBuf>) -> Result<(PathBuf, Config)> {
    match path {
        Some(p) => Ok((p.clone(), Config::load(&p)?)),
        None => {
            let p = vitalsd::config::default_path().to_owned();
            if p.exists() {
                Ok((p.clone(), Config::load(&p)?))
            } else {
                log::info!("no {}; using the built-in defaults", p.display());
                Ok((p, Config::default()))
            }
        }
    }
}

fn main() -> Result<()> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let cli = Cli::parse();
    match cli.command {
        Command::Run { config } => {
            let signals = signal_flags()?;
            let (path, cfg) = load_config(config)?;
            service::run(path, cfg, signals).context("vitalsd run")?;
        }
        Command::Pin { dir, fault_source } => {
            let acc = vitalsd::bpf::Accounting::load(&AccountingConfig {
                fault_source,
                pins: PinMode::PinTo(dir.clone()),
                ..AccountingConfig::default()
            })
            .context("vitalsd pin")?;
            println!(
                "pinned the vitals programs and maps in {} (fault source {})",
                dir.display(),
                acc.fault_source().name()
            );
        }
        Command::CleanupAfterCrash { config } => {
            let (_, cfg) = load_config(config)?;
            println!(
                "{}",
                service::cleanup_after_crash(&cfg).context("vitalsd cleanup-after-crash")?
            );
        }
        Command::CheckConfig { config } => {
            let (path, cfg) = load_config(config)?;
            println!("# effective config ({})", path.display());
            print!("{}", cfg.to_toml());
        }
        Command::Record {
            duration,
            out,
            interval,
            fault_source,
            max_tasks,
            max_processes,
            no_runq_wait,
            classic_tracepoints,
            top,
            pins,
            keep_privileges,
            proc_root,
            sched,
            faults,
            fault_period,
            capture_buffer_kb,
            capture_transport,
        } => {
            let stop = signal_flags()?.stop;
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
                    force_classic_tracepoints: classic_tracepoints,
                    pins: pins.map(PinMode::AttachFrom).unwrap_or_default(),
                    capture: capture.any().then(|| CaptureSizing {
                        ring_bytes: capture_buffer_kb.saturating_mul(1024),
                        transport: capture_transport,
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
                bugreport_score: (bugreport_score > 0).then_some(bugreport_score),
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
            for w in request.normalisation_warnings() {
                eprintln!("warning: {w}");
            }
            let stop = signal_flags()?.stop;
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
