//! vitalsd: the daemon binary. anyhow lives here, at the edge, only.

use std::{
    path::{Path, PathBuf},
    sync::atomic::Ordering,
    time::Duration,
};

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use vitalsd::{
    bpf::{
        exited_entries, AccountingChoice, AccountingConfig, EventSizing, EventTransportChoice,
        FaultSourceChoice, MapLimits, OffcpuSettings, PinMode, DEFAULT_EXITS_PER_SECOND,
    },
    config::{parse_duration, Config},
    event_set::EventSet,
    events::{EventOptions, OffcpuWatch, WatchedProcesses},
    heapprofd::{
        self, ContinuousDump, HeapProfileRequest, Heaps, RateLimiter, RateLimits, RequestLimits,
        RunnerConfig, SessionReport, SessionRunner, TargetStatus,
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
    Record(RecordArgs),
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
    Heap(HeapArgs),
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

// The flags of `vitalsd record` (doc comments here would replace the
// subcommand's help text, so plain comments only).
#[derive(Args)]
struct RecordArgs {
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
    /// auto: eBPF, or /proc only when BPF is denied; bpf: eBPF or fail;
    /// proc: /proc only.
    #[arg(long, default_value = "auto")]
    accounting: AccountingChoice,
    /// Bound of the per-thread hash (entries), which holds threads whose
    /// tid is past the array sized from pid_max (all of them where pid_max
    /// is over 65536).
    #[arg(long, default_value_t = MapLimits::default().max_tasks)]
    max_tasks: u32,
    /// Bound of the per-process fault map (entries).
    #[arg(long, default_value_t = MapLimits::default().max_processes)]
    max_processes: u32,
    /// Thread exits a second the exited-task map absorbs between two
    /// samples; with --interval it sizes that map.
    #[arg(long, default_value_t = DEFAULT_EXITS_PER_SECOND)]
    exits_per_second: u32,
    /// Do not account runqueue wait (saves the sched_wakeup programs).
    #[arg(long)]
    no_runq_wait: bool,
    /// Do not account off-CPU time (blocked in S/D, long blocks, wakers;
    /// saves the sched_waking program).
    #[arg(long)]
    no_offcpu: bool,
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
    /// Every thread in the per-thread hash, none in the tid-indexed array
    /// (for tests of the hash's bound).
    #[arg(long, hide = true)]
    task_hash_only: bool,
    /// Capture every sched_switch and sched_waking (Perfetto per-CPU
    /// timeline and thread states).
    #[arg(long)]
    sched: bool,
    /// Capture sampled user page faults with their call stacks
    /// (flamegraph per process).
    #[arg(long)]
    faults: bool,
    /// Sample one fault in N per process (with --faults).
    #[arg(long, default_value_t = EventOptions::default().fault_period)]
    fault_period: u32,
    /// Record every long block (off-CPU, with the blocked stack and the
    /// waker's) of every thread; with --sched the timeline too.
    #[arg(long)]
    offcpu: bool,
    /// Record the long blocks of this process only (repeatable: these
    /// processes); implies --offcpu.
    #[arg(long)]
    offcpu_pid: Vec<u32>,
    /// A block this long or longer is recorded (with --offcpu).
    #[arg(long, default_value_t = OffcpuWatch::DEFAULT_MIN_BLOCK_NS / 1_000_000)]
    offcpu_min_ms: u64,
    /// Capture ring buffer size in KiB (a power of two). With the perf
    /// array it is split over the online CPUs (at least a page each).
    #[arg(long, default_value_t = EventSizing::default().ring_bytes / 1024)]
    capture_buffer_kb: u32,
    /// How capture records reach user space: `ringbuf`
    /// (BPF_MAP_TYPE_RINGBUF, Linux 5.8+), `perf` (per-CPU perf event
    /// array) or `auto` (ringbuf where the kernel has it).
    #[arg(long, default_value = "auto")]
    capture_transport: EventTransportChoice,
}

// The flags of `vitalsd heap`.
#[derive(Args)]
struct HeapArgs {
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
    /// traced's consumer: perfetto_client (exec --perfetto-bin) or
    /// in_process (this process, through the Perfetto SDK; builds with the
    /// `producer` feature).
    #[arg(long, default_value = "perfetto_client", value_parser = parse_consumer)]
    consumer: heapprofd::ConsumerRoute,
    /// The perfetto command-line client (consumer perfetto_client).
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
    match Cli::parse().command {
        Command::Run { config } => run(config),
        Command::Pin { dir, fault_source } => pin(dir, fault_source),
        Command::CleanupAfterCrash { config } => cleanup_after_crash(config),
        Command::CheckConfig { config } => check_config(config),
        Command::Record(args) => record_cmd(args),
        Command::Snapshot {
            interval,
            threads,
            proc_root,
        } => snapshot(interval, threads, proc_root),
        Command::Heap(args) => heap(args),
        Command::Scan {
            threads,
            repeat,
            proc_root,
        } => scan(threads, repeat, proc_root),
    }
}

/// `vitalsd run`: the long-running daemon.
fn run(config: Option<PathBuf>) -> Result<()> {
    let signals = signal_flags()?;
    let (path, cfg) = load_config(config)?;
    service::run(path, cfg, signals).context("vitalsd run")?;
    Ok(())
}

/// `vitalsd pin`: load and pin without attaching (bpfloader's role).
fn pin(dir: PathBuf, fault_source: FaultSourceChoice) -> Result<()> {
    let acc = vitalsd::bpf::Accounting::load(&AccountingConfig {
        fault_source,
        pins: PinMode::PinTo(dir.clone()),
        // The capture tier sized and pinned too, as bpfloader's vitals.o
        // has it: readers of the pins run captures through it.
        capture: Some(EventSizing::default()),
        ..AccountingConfig::default()
    })
    .context("vitalsd pin")?;
    println!(
        "pinned the vitals programs and maps in {} (fault source {})",
        dir.display(),
        acc.fault_source().name()
    );
    Ok(())
}

/// `vitalsd cleanup-after-crash`: repair the store.
fn cleanup_after_crash(config: Option<PathBuf>) -> Result<()> {
    let (_, cfg) = load_config(config)?;
    println!(
        "{}",
        service::cleanup_after_crash(&cfg).context("vitalsd cleanup-after-crash")?
    );
    Ok(())
}

/// `vitalsd check-config`: print the effective config.
fn check_config(config: Option<PathBuf>) -> Result<()> {
    let (path, cfg) = load_config(config)?;
    println!("# effective config ({})", path.display());
    print!("{}", cfg.to_toml());
    Ok(())
}

/// `vitalsd record`: prints the top table once the window ends.
fn record_cmd(args: RecordArgs) -> Result<()> {
    let stop = signal_flags()?.stop;
    let top = args.top;
    let (accounting, opts) = record_options(args);
    let summary = record(&accounting, &opts, &stop).context("vitalsd record")?;
    print!("{}", summary.render(top));
    Ok(())
}

/// The flags of `vitalsd record`: the programs to load and the
/// [`RecordOptions`].
fn record_options(args: RecordArgs) -> (AccountingConfig, RecordOptions) {
    let RecordArgs {
        duration,
        out,
        interval,
        fault_source,
        accounting,
        max_tasks,
        max_processes,
        exits_per_second,
        no_runq_wait,
        no_offcpu,
        classic_tracepoints,
        top: _,
        pins,
        keep_privileges,
        proc_root,
        task_hash_only,
        sched,
        faults,
        fault_period,
        offcpu,
        offcpu_pid,
        offcpu_min_ms,
        capture_buffer_kb,
        capture_transport,
    } = args;
    let offcpu = (offcpu || !offcpu_pid.is_empty()).then(|| OffcpuWatch {
        min_block_ns: offcpu_min_ms.saturating_mul(1_000_000),
        processes: if offcpu_pid.is_empty() {
            WatchedProcesses::All
        } else {
            WatchedProcesses::of_pids(&offcpu_pid)
        },
        follow_names: Vec::new(),
    });
    let capture = EventOptions {
        events: EventSet { sched, faults },
        fault_period: fault_period.max(1),
        offcpu,
    };
    let accounting = AccountingConfig {
        choice: accounting,
        fault_source,
        limits: MapLimits {
            max_tasks,
            max_processes,
            max_exited: exited_entries(exits_per_second, interval),
        },
        runq_wait: !no_runq_wait,
        offcpu: (!no_offcpu).then(OffcpuSettings::default),
        force_classic_tracepoints: classic_tracepoints,
        force_task_hash: task_hash_only,
        pins: pins.map(PinMode::AttachFrom).unwrap_or_default(),
        capture: capture.any().then(|| EventSizing {
            ring_bytes: capture_buffer_kb.saturating_mul(1024),
            transport: capture_transport,
            ..EventSizing::default()
        }),
        ..AccountingConfig::default()
    };
    let opts = RecordOptions {
        duration,
        out,
        interval,
        proc_root,
        drop_privileges: !keep_privileges,
        capture,
        max_bytes: None,
    };
    (accounting, opts)
}

/// `vitalsd snapshot`: one procfs window as a table.
fn snapshot(interval: Duration, threads: bool, proc_root: PathBuf) -> Result<()> {
    let opts = SnapshotOptions {
        proc_root,
        interval,
        threads,
        hz: None,
    };
    print!("{}", run_snapshot(&opts).context("vitalsd snapshot")?);
    Ok(())
}

/// Durations in the request are u32 milliseconds; longer ones saturate.
fn ms(d: Duration) -> u32 {
    u32::try_from(d.as_millis()).unwrap_or(u32::MAX)
}

/// `vitalsd heap`: one heapprofd session through the perfetto client, then
/// its outcome per process; fails unless every target was profiled.
fn heap(args: HeapArgs) -> Result<()> {
    let out = args.out.clone();
    let request = heap_request(&args);
    let runner = heap_runner(&args)?;
    for w in request.normalisation_warnings() {
        eprintln!("warning: {w}");
    }
    let stop = signal_flags()?.stop;
    let report = runner.run(&request, &out, &stop).context("vitalsd heap")?;
    print_heap_report(&report, &out);
    if let Some(problem) = report.status.problem() {
        anyhow::bail!("heap profile failed: {problem}");
    }
    if !report.success() {
        anyhow::bail!("heap profile incomplete (see above)");
    }
    Ok(())
}

/// The flags of `vitalsd heap` as a [`HeapProfileRequest`].
fn heap_request(args: &HeapArgs) -> HeapProfileRequest {
    HeapProfileRequest {
        process_names: args.names.clone(),
        pids: args.pids.clone(),
        duration_ms: ms(args.duration),
        sampling_interval_bytes: args.sampling_interval_bytes,
        shmem_size_bytes: args.shmem_size_bytes,
        block_client: args.block_client,
        heaps: if args.all_heaps {
            Heaps::All
        } else if args.heaps.is_empty() {
            Heaps::Malloc
        } else {
            Heaps::Named(args.heaps.clone())
        },
        continuous_dump: args.dump_interval.map(|d| ContinuousDump {
            phase_ms: ms(d),
            interval_ms: ms(d),
        }),
        max_heapprofd_memory_kb: args.max_heapprofd_memory_kb,
        max_heapprofd_cpu_secs: args.max_heapprofd_cpu_secs,
        bugreport_score: (args.bugreport_score > 0).then_some(args.bugreport_score),
        ..HeapProfileRequest::default()
    }
}

/// `--consumer`: a route name this build can run (in_process needs the
/// `producer` feature), refused here rather than at the session.
fn parse_consumer(s: &str) -> Result<heapprofd::ConsumerRoute, String> {
    let route: heapprofd::ConsumerRoute = s.parse()?;
    route.available()?;
    Ok(route)
}

/// The session runner under the persisted rate limits of `--state-file`.
fn heap_runner(args: &HeapArgs) -> Result<SessionRunner> {
    let limits = RateLimits {
        system_per_hour: args.system_per_hour,
        system_per_day: args.system_per_day,
        target_per_hour: args.target_per_hour,
        target_per_day: args.target_per_day,
    };
    let limiter = RateLimiter::load(&args.state_file, limits)?;
    Ok(SessionRunner::new(
        RunnerConfig {
            consumer: args.consumer,
            perfetto_bin: args.perfetto_bin.clone(),
            limits: RequestLimits {
                max_duration_ms: ms(args.max_duration),
            },
            ..RunnerConfig::default()
        },
        limiter,
    ))
}

/// The session's status, what each process's profile caught, why a target
/// has none, and where the trace and its metadata are.
fn print_heap_report(report: &SessionReport, out: &Path) {
    match report.status.problem() {
        None => println!("session: completed"),
        Some(p) => println!("session: {p}"),
    }
    match &report.outcome {
        None => println!(
            "no trace: {}",
            report.outcome_error.as_deref().unwrap_or("unknown")
        ),
        Some(o) => {
            for p in &o.processes {
                // Allocations and bytes, not records: one HeapSample stands
                // for every sampled allocation at its callstack.
                println!(
                    "pid {} {}: {} sampled allocation(s), {} allocated, {} freed, {} unreleased; \
                     {} callstack(s) in {} dump(s), interval {:?} B, issues {:?}",
                    p.pid,
                    p.name.as_deref().unwrap_or("?"),
                    p.allocations,
                    bytes(p.allocated_bytes),
                    bytes(p.freed_bytes),
                    bytes(p.unreleased_bytes()),
                    p.callstacks,
                    p.dumps,
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
    if out.exists() {
        println!(
            "trace {} metadata {}",
            out.display(),
            heapprofd::metadata_path(out).display()
        );
    } else {
        println!("nothing stored");
    }
}

/// Bytes exactly, and in MiB for reading.
fn bytes(b: u64) -> String {
    format!("{b} B ({:.1} MiB)", b as f64 / (1024.0 * 1024.0))
}

/// `vitalsd scan`: procfs scans for `cargo xtask bench scan`.
fn scan(threads: bool, repeat: u32, proc_root: PathBuf) -> Result<()> {
    println!(
        "{}",
        scan_repeat(&proc_root, threads, repeat).context("vitalsd scan")?
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `vitalsd record` without `--sched`/`--faults` switches no events on;
    /// each flag switches on its own.
    #[test]
    fn record_flags_are_the_event_set() {
        let events = |flags: &[&str]| {
            let cli = Cli::try_parse_from([&["vitalsd", "record"][..], flags].concat()).unwrap();
            let Command::Record(args) = cli.command else {
                panic!("not record");
            };
            record_options(args).1.capture.events
        };
        assert_eq!(events(&[]), EventSet::NONE);
        let sched = EventSet {
            sched: true,
            faults: false,
        };
        assert_eq!(events(&["--sched"]), sched);
        let faults = EventSet {
            sched: false,
            faults: true,
        };
        assert_eq!(events(&["--faults"]), faults);
    }

    /// `--offcpu` and `--offcpu-pid` switch the long blocks on, alone (the
    /// stacks only, offwaketime's job) or with `--sched`'s timeline; the
    /// threshold defaults to 16 ms.
    #[test]
    fn offcpu_flags_set_the_watch_and_sched_stays_its_own() {
        let capture = |flags: &[&str]| {
            let cli = Cli::try_parse_from([&["vitalsd", "record"][..], flags].concat()).unwrap();
            let Command::Record(args) = cli.command else {
                panic!("not record");
            };
            record_options(args).1.capture
        };
        assert_eq!(capture(&["--sched"]).offcpu, None);
        let all = capture(&["--offcpu"]);
        assert!(!all.events.sched && all.any());
        assert_eq!(all.offcpu, Some(OffcpuWatch::default()));
        assert!(capture(&["--offcpu", "--sched"]).events.sched);
        let one = capture(&["--offcpu-pid", "42", "--offcpu-min-ms", "100"]);
        assert!(!one.events.sched && !one.events.faults);
        assert_eq!(
            one.offcpu,
            Some(OffcpuWatch {
                min_block_ns: 100_000_000,
                processes: WatchedProcesses::Tgids(vec![42]),
                follow_names: Vec::new(),
            })
        );
        let two = capture(&["--offcpu-pid", "43", "--offcpu-pid", "42"]);
        assert_eq!(
            two.offcpu.unwrap().processes,
            WatchedProcesses::Tgids(vec![42, 43])
        );
    }
}
