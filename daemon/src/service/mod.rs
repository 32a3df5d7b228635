//! `vitalsd run`: the long-running daemon.
//!
//! The main thread samples eBPF maps and procfs every interval into the
//! history, evaluates the health rules and runs at most one capture at a
//! time on its own thread (a bounded `record` into the store). The control
//! socket runs on its own thread and reads what the main thread publishes.

mod captures;
mod heap;

use std::{
    collections::{BTreeMap, HashMap},
    path::PathBuf,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        mpsc, Arc, Mutex,
    },
    time::{Duration, Instant},
};

use thiserror::Error;

use captures::{finish_capture, start_capture, RunningCapture};
use heap::{
    finish_heap, heap_profile_offender, heap_request, heap_runner, start_heap, RunningHeap,
};

use crate::{
    bpf::{totals::Totals, Accounting, AccountingConfig, BpfError, MapLimits},
    config::{CaptureSpec, Config},
    control::server::{
        self, Command, DaemonState, ServerError, Shared, TopEbpf, TopRow, TriggerRecord,
    },
    history::{self, History},
    privileges::{self, PrivilegeError},
    procfs::sampler::{Sample, SampleOptions, Sampler, SamplerError},
    store::{self, Limits, Store, StoreError, TriggerInfo},
    system::{self, SystemError},
    tracker::{bpf_deltas, BpfDelta, DropCounters, Tracker},
    triggers::{Engine, Fired, SysfsProbe},
};

#[derive(Debug, Error)]
pub enum ServiceError {
    #[error(transparent)]
    Bpf(#[from] BpfError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Control(#[from] ServerError),
    #[error(transparent)]
    Privileges(#[from] PrivilegeError),
    #[error(transparent)]
    Procfs(#[from] SamplerError),
    #[error(transparent)]
    System(#[from] SystemError),
    #[error("starting a thread: {0}")]
    Thread(#[source] std::io::Error),
    #[error("store lock {path}: {source}")]
    Lock {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("another vitalsd holds {0}; one daemon per store")]
    StoreBusy(PathBuf),
}

/// `<store>/.lock`, flock'd exclusively by the running daemon for its whole
/// life (the store's repair ignores the name). `Ok(None)`: someone else holds it.
pub fn try_lock_store(dir: &std::path::Path) -> Result<Option<std::fs::File>, ServiceError> {
    use std::os::fd::AsRawFd;
    let path = dir.join(".lock");
    let err = |source| ServiceError::Lock {
        path: path.clone(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(err)?;
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(err)?;
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(Some(f));
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(None)
    } else {
        Err(err(e))
    }
}

/// `vitalsd cleanup-after-crash` (vitalsd.rc `onrestart`): repairs the store
/// of a daemon that died (leftover temporary captures, orphaned metadata,
/// the index) unless a daemon already runs on it, in which case that daemon
/// repaired it at start. eBPF programs, perf events and the heapprofd client
/// need nothing: they are fds and children that died with the process (init
/// kills the service's process group), and init recreates the socket.
pub fn cleanup_after_crash(cfg: &Config) -> Result<String, ServiceError> {
    let Some(_lock) = try_lock_store(&cfg.store.dir)? else {
        return Ok(format!(
            "a running vitalsd holds {}; it repaired the store at start",
            cfg.store.dir.display()
        ));
    };
    let store = Store::open(&cfg.store.dir, limits(cfg))?;
    Ok(format!(
        "store {}: {} captures kept, {} leftovers removed",
        cfg.store.dir.display(),
        store.list().len(),
        store.counters.repaired_leftovers
    ))
}

/// Capabilities the daemon keeps: CAP_BPF for map reads, CAP_PERFMON so a
/// capture can attach its programs. On Android the daemon starts as uid
/// system, so this is also everything start-up has: init/vitalsd.rc's
/// `capabilities` line and init/vitalsd.service grant exactly this set
/// (android_tests::rc_capabilities_are_what_the_daemon_keeps).
pub const DAEMON_CAPS: &[caps::Capability] =
    &[caps::Capability::CAP_BPF, caps::Capability::CAP_PERFMON];

/// Samples lost to read errors, and the current streaks (for logging once).
#[derive(Default)]
struct ReadErrors {
    bpf: u64,
    bpf_streak: u64,
    procfs: u64,
    procfs_streak: u64,
}

/// Recent triggers kept for `status` and `dump`.
const RECENT_TRIGGERS: usize = 32;

fn limits(cfg: &Config) -> Limits {
    Limits {
        quota_bytes: cfg.store.quota_bytes,
        max_captures: cfg.store.max_captures,
        max_age_ms: cfg.store.max_age.0.as_millis() as u64,
    }
}

fn push_trigger(st: &mut DaemonState, t: &TriggerInfo, unix_ms: u64, outcome: String) {
    st.recent_triggers.push_back(TriggerRecord {
        unix_ms,
        rule: t.rule.clone(),
        value: t.value,
        threshold: t.threshold,
        offender: t.offender_name.clone(),
        outcome,
    });
    while st.recent_triggers.len() > RECENT_TRIGGERS {
        st.recent_triggers.pop_front();
    }
}

/// Signals the binary forwards: stop and reload.
#[derive(Clone, Default)]
pub struct Signals {
    pub stop: Arc<AtomicBool>,
    pub reload: Arc<AtomicBool>,
}

pub fn run(config_path: PathBuf, mut cfg: Config, signals: Signals) -> Result<(), ServiceError> {
    let accounting_cfg = AccountingConfig {
        fault_source: cfg.sampling.fault_source,
        limits: MapLimits {
            max_tasks: cfg.sampling.max_tasks,
            ..MapLimits::default()
        },
        runq_wait: cfg.sampling.runq_wait,
        force_classic_tracepoints: cfg.sampling.classic_tracepoints,
        pins: cfg
            .sampling
            .pin_dir
            .clone()
            .map(crate::bpf::PinMode::AttachFrom)
            .unwrap_or_default(),
        ..AccountingConfig::default()
    };
    let _store_lock = try_lock_store(&cfg.store.dir)?
        .ok_or_else(|| ServiceError::StoreBusy(cfg.store.dir.clone()))?;
    let mut accounting = Accounting::load(&accounting_cfg)?;
    let store = Arc::new(Mutex::new(Store::open(&cfg.store.dir, limits(&cfg))?));
    let listener = server::bind_or_inherit(&cfg.control.socket)?;
    let kept = privileges::drop_to(DAEMON_CAPS)?;
    let capabilities = privileges::describe(&kept);
    log::info!(
        "vitalsd running; capabilities {capabilities}; store {}",
        cfg.store.dir.display()
    );

    let (tx, commands) = mpsc::channel::<Command>();
    let shared = Arc::new(Shared {
        state: Mutex::new(DaemonState {
            version: env!("CARGO_PKG_VERSION"),
            started_unix_ms: store::now_unix_ms(),
            interval_ms: cfg.sampling.interval.0.as_millis() as u64,
            fault_source: accounting.fault_source().describe().into(),
            capabilities,
            config_path: config_path.display().to_string(),
            config_toml: cfg.to_toml(),
            ..DaemonState::default()
        }),
        store: Arc::clone(&store),
        commands: tx,
        allowed_uids: Mutex::new(cfg.control.allowed_uids.clone()),
        max_request_bytes: AtomicU64::new(u64::from(cfg.control.max_request_bytes)),
        counters: Default::default(),
    });
    server::spawn(listener, Arc::clone(&shared)).map_err(ServiceError::Thread)?;

    let hz = system::clock_ticks_per_second()?;
    let mut sampler = Sampler::new(
        &cfg.sampling.proc_root,
        SampleOptions {
            threads: false,
            status: true,
            cmdline: true,
        },
    );
    let mut tracker = Tracker::new(hz);
    let mut totals = Totals::new();
    let mut history = History::new(cfg.history_len());
    let mut engine = Engine::new(
        cfg.rules.clone(),
        cfg.budget.clone(),
        cfg.conditions.clone(),
    );
    let mut sample = Sample::default();
    let mut capture: Option<RunningCapture> = None;
    let mut heap: Option<RunningHeap> = None;
    let mut runner = Arc::new(heap_runner(&cfg));
    let mut next_tick = Instant::now();
    let mut last_expiry = Instant::now();
    let mut read_errors = ReadErrors::default();
    // eBPF counters of the previous sample, for per-window deltas.
    let mut bpf_prev = HashMap::new();
    let mut bpf_delta_drops = DropCounters::default();

    loop {
        let now = Instant::now();
        if !signals.stop.load(Ordering::SeqCst) && now < next_tick {
            // Signals unpark us; control commands wait at most one interval.
            std::thread::park_timeout(next_tick - now);
        }
        let stopping = signals.stop.load(Ordering::SeqCst);
        if stopping {
            if let Some(c) = capture.take() {
                log::info!(
                    "stopping: cutting capture {} at a packet boundary",
                    c.pending.id
                );
                c.stop.store(true, Ordering::SeqCst);
                c.thread.thread().unpark();
                finish_capture(c, &store, &shared, "stopped by daemon shutdown");
            }
            if let Some(h) = heap.take() {
                // SIGTERM makes the client stop the session and flush.
                h.stop.store(true, Ordering::SeqCst);
                finish_heap(h, &store, &shared);
            }
            log::info!("vitalsd stopped");
            return Ok(());
        }

        if signals.reload.swap(false, Ordering::SeqCst) {
            match Config::load(&config_path) {
                Ok(new) => {
                    log::info!("config reloaded from {}", config_path.display());
                    if new.sampling.fault_source != cfg.sampling.fault_source
                        || new.sampling.max_tasks != cfg.sampling.max_tasks
                        || new.sampling.runq_wait != cfg.sampling.runq_wait
                        || new.sampling.classic_tracepoints != cfg.sampling.classic_tracepoints
                        || new.store.dir != cfg.store.dir
                        || new.control.socket != cfg.control.socket
                    {
                        log::warn!(
                            "eBPF, store dir and socket settings take effect at the next start"
                        );
                    }
                    engine.reconfigure(
                        new.rules.clone(),
                        new.budget.clone(),
                        new.conditions.clone(),
                    );
                    history.set_capacity(new.history_len());
                    store.lock().unwrap().set_limits(limits(&new));
                    *shared.allowed_uids.lock().unwrap() = new.control.allowed_uids.clone();
                    shared
                        .max_request_bytes
                        .store(u64::from(new.control.max_request_bytes), Ordering::Relaxed);
                    let mut st = shared.state.lock().unwrap();
                    st.config_toml = new.to_toml();
                    st.interval_ms = new.sampling.interval.0.as_millis() as u64;
                    st.last_reload_error = None;
                    drop(st);
                    cfg = new;
                    if heap.is_none() {
                        runner = Arc::new(heap_runner(&cfg));
                    }
                }
                Err(e) => {
                    log::error!("config reload failed, keeping the running config: {e}");
                    shared.state.lock().unwrap().last_reload_error = Some(e.to_string());
                }
            }
        }

        if capture.as_ref().is_some_and(|c| c.thread.is_finished()) {
            let c = capture.take().unwrap();
            finish_capture(c, &store, &shared, "complete");
        }

        if heap.as_ref().is_some_and(|h| h.thread.is_finished()) {
            finish_heap(heap.take().unwrap(), &store, &shared);
        }

        // Manual captures from the control socket.
        while let Ok(cmd) = commands.try_recv() {
            match cmd {
                Command::Capture {
                    duration,
                    sched,
                    faults,
                    reply,
                } => {
                    if capture.is_some() {
                        let _ =
                            reply.send(Err("a capture is already running (one at a time)".into()));
                        continue;
                    }
                    let spec = CaptureSpec {
                        duration: crate::config::Dur(duration),
                        sched,
                        faults,
                        ..CaptureSpec::default()
                    };
                    let trigger = TriggerInfo {
                        rule: "manual".into(),
                        value: None,
                        threshold: None,
                        offender_pid: None,
                        offender_name: None,
                    };
                    let c = start_capture(
                        &cfg,
                        &accounting_cfg,
                        &store,
                        &history,
                        &spec,
                        trigger,
                        &shared,
                    );
                    let _ = reply.send(Ok(c.pending.id.clone()));
                    capture = Some(c);
                }
                Command::Heap {
                    name,
                    pid,
                    duration,
                    reply,
                } => {
                    if heap.is_some() {
                        let _ = reply.send(Err(
                            "a heapprofd session is already running (one at a time)".into(),
                        ));
                        continue;
                    }
                    let trigger = TriggerInfo {
                        rule: "manual-heap".into(),
                        value: None,
                        threshold: None,
                        offender_pid: pid.map(|p| p as i32),
                        offender_name: name.clone(),
                    };
                    let request = heap_request(&cfg, name, pid, duration, Vec::new());
                    match start_heap(&runner, &store, request, trigger, &shared) {
                        Ok(h) => {
                            let _ = reply.send(Ok(h.pending.id.clone()));
                            heap = Some(h);
                        }
                        Err(e) => {
                            let _ = reply.send(Err(e));
                        }
                    }
                }
            }
        }

        if Instant::now() < next_tick {
            continue;
        }
        next_tick += cfg.sampling.interval.0;
        if next_tick < Instant::now() {
            // Overran (suspend, a stall): resynchronise instead of bursting.
            next_tick = Instant::now() + cfg.sampling.interval.0;
        }

        // Always-on sample.
        // A failed read costs this sample, never the daemon: counted and
        // logged (once per streak), and the next tick tries again.
        let mut bpf_window: HashMap<u32, BpfDelta> = HashMap::new();
        match accounting.read() {
            // Folding drains the EXITED map and keeps the drop counters current.
            Ok(snap) => {
                let rows = totals.update(&snap);
                bpf_window = bpf_deltas(&mut bpf_prev, &rows, &mut bpf_delta_drops)
                    .into_iter()
                    .map(|d| (d.tgid, d))
                    .collect();
                read_errors.bpf_streak = 0;
            }
            Err(e) => {
                read_errors.bpf += 1;
                read_errors.bpf_streak += 1;
                if read_errors.bpf_streak == 1 {
                    log::error!("reading the eBPF maps: {e}; skipping this sample");
                }
            }
        }
        let window = match sampler.sample_into(&mut sample) {
            Ok(()) => {
                read_errors.procfs_streak = 0;
                tracker.update(&sample)
            }
            Err(e) => {
                read_errors.procfs += 1;
                read_errors.procfs_streak += 1;
                if read_errors.procfs_streak == 1 {
                    log::error!("sampling procfs: {e}; skipping this sample");
                }
                None
            }
        };
        let mut st_top = Vec::new();
        if let Some(w) = &window {
            history.push(history::summarize(
                w,
                cfg.sampling.history_processes,
                &engine.watched_processes(),
                &bpf_window,
            ));
            let mut procs: Vec<&crate::tracker::TaskWindow> =
                w.processes.iter().filter(|p| p.working).collect();
            procs.sort_by(|a, b| {
                b.core_equivalent_pct
                    .unwrap_or(0.0)
                    .total_cmp(&a.core_equivalent_pct.unwrap_or(0.0))
            });
            st_top = procs
                .iter()
                .take(50)
                .map(|p| TopRow {
                    pid: p.pid,
                    name: p.name(),
                    core_equivalent_pct: p.core_equivalent_pct.unwrap_or(0.0),
                    machine_share_pct: p.machine_share_pct.unwrap_or(0.0),
                    minflt: p.delta.map(|d| d.minflt).unwrap_or(0),
                    majflt: p.delta.map(|d| d.majflt).unwrap_or(0),
                    rss_kb: p.status.as_ref().and_then(|s| s.vm_rss_kb),
                    ebpf: bpf_window.get(&(p.pid as u32)).map(|d| TopEbpf {
                        oncpu_ms: d.oncpu_ns as f64 / 1e6,
                        runq_wait_ms: d.runq_wait_ns as f64 / 1e6,
                        voluntary_switches: d.voluntary_switches,
                        involuntary_switches: d.involuntary_switches,
                    }),
                })
                .collect();
        }

        // Health rules.
        let boottime = crate::clock::boottime_ns();
        let conditions = engine.conditions().clone();
        if let Some(fired) = engine.evaluate(
            &history,
            boottime,
            capture.is_some(),
            &SysfsProbe(&conditions),
        ) {
            let trigger = trigger_info(&fired);
            if fired.capture.heap_profile {
                heap_profile_offender(&fired, &cfg, &runner, &store, &shared, &trigger, &mut heap);
            }
            capture = Some(start_capture(
                &cfg,
                &accounting_cfg,
                &store,
                &history,
                &fired.capture,
                trigger,
                &shared,
            ));
        }

        if last_expiry.elapsed() > Duration::from_secs(60) {
            last_expiry = Instant::now();
            if let Err(e) = store.lock().unwrap().expire(store::now_unix_ms()) {
                log::warn!("store expiry: {e}");
            }
        }

        // Publish for the control socket.
        let mut st = shared.state.lock().unwrap();
        st.samples += 1;
        st.history_samples = history.len();
        if let Some(w) = &window {
            st.top = st_top;
            st.local_busy_pct = w.system.as_ref().map(|s| s.local_busy_pct);
            st.loadavg = w.loadavg.as_ref().map(|l| [l.load1, l.load5, l.load15]);
            let d = tracker.drop_totals();
            st.procfs_drops = BTreeMap::from([
                ("read_failures".into(), d.read_failures),
                ("vanished_pids".into(), d.vanished_pids),
                ("vanished_tids".into(), d.vanished_tids),
                ("negative_deltas".into(), d.negative_deltas),
                ("clock_not_advancing".into(), d.clock_not_advancing),
                ("starttime_changes".into(), d.starttime_changes),
            ]);
        }
        st.sample_errors = BTreeMap::from([
            ("bpf_map_reads".to_string(), read_errors.bpf),
            ("procfs_scans".to_string(), read_errors.procfs),
        ]);
        st.bpf_drops = vitals_common::drop_reason::NAMES
            .iter()
            .zip(totals.drops)
            .map(|(n, v)| (n.to_string(), v))
            .collect();
        st.bpf_drops
            .insert("negative_deltas".into(), bpf_delta_drops.negative_deltas);
        st.triggers_fired = engine.fired_total;
        st.triggers_skipped = engine
            .skipped
            .iter()
            .map(|(k, v)| (k.name().to_string(), *v))
            .collect();
    }
}

fn trigger_info(f: &Fired) -> TriggerInfo {
    TriggerInfo {
        rule: f.rule.clone(),
        value: Some(f.value),
        threshold: Some(f.threshold),
        offender_pid: f.offender.as_ref().map(|o| o.pid),
        offender_name: f.offender.as_ref().map(|o| o.name.clone()),
    }
}
