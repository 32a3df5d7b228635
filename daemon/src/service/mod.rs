//! `vitalsd run`: the long-running daemon.
//!
//! The main thread runs the pipeline (eBPF maps and procfs) every interval
//! and hands each tick to its sinks: the history, status and top, the
//! Perfetto producer, and at most one capture at a time, recorded on its
//! own thread from the ticks it is handed (a bounded recording into the
//! store); then it evaluates the health rules. The control socket runs on
//! its own thread and reads what the main thread publishes.
//!
//! This file holds start-up, [`run`]'s loop, the store lock and
//! `cleanup-after-crash`; each step of the loop lives with its concern:
//! `signals` (stop and reload), `captures` and `heap` (the two session
//! lifecycles), `requests` (the control socket's manual requests), `tick`
//! (the sampling schedule, the always-on sample and what is published) and
//! `rules` (rule evaluation).

mod backends;
mod heap;
mod producer;
mod recordings;
mod requests;
mod rings;
mod rules;
mod signals;
mod state;
mod tick;

use std::{
    path::PathBuf,
    sync::{
        atomic::{AtomicU64, Ordering},
        mpsc, Arc, Mutex,
    },
    time::{Duration, Instant},
};

use thiserror::Error;

pub use signals::Signals;

use heap::{heap_runner, RunningHeap};
use recordings::RunningRecording;
use state::{DaemonState, Shared};
use tick::ReadErrors;

use crate::{
    accounting::CounterOrigin,
    bpf::{self, denied::ProcOnly, AccountingConfig, BpfError, MapLimits, Opened},
    config::Config,
    control::{
        protocol::{DaemonStatus, TriggerOutcome, TriggerRecord},
        server::{self, Command, ServerError},
    },
    heapprofd::SessionRunner,
    history::History,
    pipeline::Pipeline,
    privileges::{self, PrivilegeError},
    procfs::sampler::SamplerError,
    sources::ebpf::Programs,
    store::{self, Limits, Store, StoreError, TriggerInfo},
    system::{self, SystemError},
    triggers::Engine,
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

/// The capabilities the daemon keeps after start-up where it has them (a
/// Linux host loading its own programs: init/vitalsd.service grants exactly
/// this set), so a capture can attach its programs later. On Android it has
/// none and needs none: it attaches bpfloader's pins, which SELinux alone
/// gates, and init/vitalsd.rc grants nothing
/// (android::tests::init::rc_grants_no_capability).
pub const DAEMON_CAPS: &[caps::Capability] =
    &[caps::Capability::CAP_BPF, caps::Capability::CAP_PERFMON];

/// Recent triggers kept for `status` and `dump`.
const RECENT_TRIGGERS: usize = 32;

/// Applies the store settings of `cfg` (at start and at every reload).
fn configure_store(store: &mut Store, cfg: &Config) {
    store.set_limits(limits(cfg));
    store.set_max_capture_bytes(Some(cfg.store.max_capture_bytes));
    // A session's output (heapprofd's, or a Perfetto-backend capture's,
    // which may run up to MAX_CAPTURE_DURATION) older than the longest
    // session plus perfetto's flush and stop timeouts is a crash's leftover.
    // A rule's ring session runs until its trigger timeout, then the
    // capture's duration.
    let ring = cfg
        .rules
        .iter()
        .any(|r| r.capture.prelude == crate::config::Prelude::Ring);
    let longest = match cfg.capture.backend {
        crate::config::BackendChoice::Ebpf => cfg.heapprofd.max_duration.0,
        _ if ring => rings::longest_session(),
        _ => cfg
            .heapprofd
            .max_duration
            .0
            .max(crate::config::MAX_CAPTURE_DURATION),
    };
    store.set_heapprofd_stale_after(longest + Duration::from_secs(600));
}

fn limits(cfg: &Config) -> Limits {
    Limits {
        quota_bytes: cfg.store.quota_bytes,
        max_captures: cfg.store.max_captures,
        max_age_ms: cfg.store.max_age.0.as_millis() as u64,
    }
}

fn push_trigger(st: &mut DaemonState, t: &TriggerInfo, unix_ms: u64, outcome: TriggerOutcome) {
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

/// What the daemon's main loop holds from one iteration to the next.
///
/// Fields drop in declaration order, which is the reverse of the order
/// start-up creates them (as `run`'s locals did): the samplers and sessions
/// first, then the control state, the store, the always-on eBPF programs,
/// and the store lock last of all.
struct Service {
    /// The Perfetto data source (feature `producer`); before the eBPF
    /// programs it reads in drop order.
    producer: producer::MaybeProducer,
    /// Why the configured producer is not running (status's producer_error).
    producer_off: Option<String>,
    read_errors: ReadErrors,
    last_expiry: Instant,
    next_tick: Instant,
    /// Replaced on a reload unless a session is running on it.
    runner: Arc<SessionRunner>,
    heap: Option<RunningHeap>,
    capture: Option<RunningRecording>,
    /// Rules' ring sessions (`capture.prelude = "ring"`).
    rings: rings::Rings,
    engine: Engine,
    history: History,
    shared: Arc<Shared>,
    /// Requests the control socket's thread hands to the main loop.
    commands: mpsc::Receiver<Command>,
    store: Arc<Mutex<Store>>,
    /// The one pipeline and its sources. Its eBPF room holds the
    /// always-on programs, read by the tick; a capture's recording takes
    /// its ticks and switches the capture tier on in them. No eBPF room:
    /// /proc-only (BPF denied, or asked for; `proc_only` says why), and
    /// captures fail (`CaptureNeedsBpf`); see `DaemonState::accounting`.
    /// Then its schedstat room, when the kernel has it, is the CTS tier.
    pipeline: Pipeline,
    proc_only: Option<ProcOnly>,
    /// The flock on `<store>/.lock`, held for the daemon's life.
    _store_lock: std::fs::File,
    signals: Signals,
    /// The running config; replaced by a successful reload.
    cfg: Config,
    config_path: PathBuf,
}

/// Runs the daemon until [`Signals::stop`]. Each iteration, in this order:
/// stop, reload, store the sessions that ended, serve control requests;
/// then, when a tick is due, sample, evaluate the rules, expire the store
/// and publish.
pub fn run(config_path: PathBuf, cfg: Config, signals: Signals) -> Result<(), ServiceError> {
    let mut svc = Service::start(config_path, cfg, signals)?;
    loop {
        svc.wait_for_tick();
        let stopping = svc.signals.stop.load(Ordering::SeqCst);
        if stopping {
            svc.shutdown();
            return Ok(());
        }
        svc.reload_if_asked();
        svc.reap_recording();
        svc.reap_heap();
        svc.serve_requests();
        if !svc.tick_due() {
            continue;
        }
        let sampled = svc.sample();
        svc.evaluate_rules();
        svc.maintain_rings();
        svc.expire_store();
        svc.publish(sampled);
    }
}

/// The always-on programs, as the config asks for them.
/// What the tier gives, as status says it; for eBPF also where runqueue
/// wait comes from (the kernel's run_delay on tp_btf, else wakeup times).
fn tier_gives(tier: crate::accounting::Tier, wait_from_kernel: bool) -> String {
    if wait_from_kernel {
        format!(
            "{}; runqueue wait from the kernel's sched_info.run_delay",
            tier.gives()
        )
    } else {
        tier.gives().into()
    }
}

/// The BPF maps' kernel memory of `vitalsd run` with `cfg` on `machine`:
/// what it holds for its life (`bpf::memory::kernel_memory`) and what
/// each capture makes for itself while it runs
/// (`bpf::memory::capture_memory`), `[capture]` taken as the default for
/// the machine's CPUs where `cfg` leaves it at this machine's default.
pub fn run_kernel_memory(
    cfg: &Config,
    machine: crate::bpf::MachineBounds,
    run_delay: bool,
    page: u32,
) -> Result<RunMapMemory, crate::bpf::BpfError> {
    use crate::bpf::memory::{capture_memory, kernel_memory};
    let cfg = accounting_config(&machine_capture_default(cfg, machine));
    Ok(RunMapMemory {
        held: kernel_memory(&cfg, machine, run_delay, page)?,
        per_capture: capture_memory(&cfg, machine, run_delay, page)?,
    })
}

/// `run_kernel_memory`'s two parts.
#[derive(Debug)]
pub struct RunMapMemory {
    /// Every map the daemon holds for its life.
    pub held: Vec<crate::bpf::memory::MapMemory>,
    /// The maps each capture makes for itself, held while it runs (the
    /// ring buffer only if captures write to one).
    pub per_capture: Vec<crate::bpf::memory::MapMemory>,
}

/// `cfg` with `[capture]`'s memory sized for `machine`'s CPUs where it is
/// left at this machine's default.
fn machine_capture_default(cfg: &Config, machine: crate::bpf::MachineBounds) -> Config {
    let mut cfg = cfg.clone();
    if cfg.capture.memory() == crate::bpf::EventMemory::default() {
        let m = crate::bpf::EventMemory::for_cpus(machine.possible_cpus);
        cfg.capture.buffer_bytes = m.buffer_bytes;
        cfg.capture.stack_entries = m.stack_entries;
    }
    cfg
}

fn accounting_config(cfg: &Config) -> AccountingConfig {
    AccountingConfig {
        choice: cfg.sampling.accounting,
        fault_source: cfg.sampling.fault_source,
        limits: MapLimits {
            max_tasks: cfg.sampling.max_tasks,
            max_exited: crate::bpf::exited_entries(
                cfg.sampling.exits_per_second,
                cfg.sampling.interval.0,
            ),
            ..MapLimits::default()
        },
        runq_wait: cfg.sampling.runq_wait,
        offcpu: cfg.sampling.offcpu.then_some(crate::bpf::OffcpuSettings {
            long_block_us: cfg.sampling.long_block.0.as_micros() as u32,
            max_waker_pairs: cfg.sampling.max_waker_pairs,
        }),
        force_classic_tracepoints: cfg.sampling.classic_tracepoints,
        // Captures (a rule's, `vitalsctl capture`) switch the capture tier
        // on in these programs, so its kernel memory is reserved now: the
        // maps' sizes are fixed once the programs that use them load.
        capture: Some(cfg.capture.memory().sizing()),
        pins: cfg
            .sampling
            .pin_dir
            .clone()
            .map(crate::bpf::PinMode::AttachFrom)
            .unwrap_or_default(),
        ..AccountingConfig::default()
    }
}

impl Service {
    /// Start-up, in this order: the store lock (one daemon per store), the
    /// always-on eBPF programs, the store (repaired), the control socket,
    /// then privileges drop to [`DAEMON_CAPS`] and the control thread starts.
    fn start(config_path: PathBuf, cfg: Config, signals: Signals) -> Result<Self, ServiceError> {
        let accounting_cfg = accounting_config(&cfg);
        let store_lock = try_lock_store(&cfg.store.dir)?
            .ok_or_else(|| ServiceError::StoreBusy(cfg.store.dir.clone()))?;
        let (accounting, proc_only) = match bpf::open(&accounting_cfg)? {
            Opened::Ebpf(acc) => (Some(Programs::new(acc)), None),
            Opened::ProcOnly(why) => {
                crate::record::log_proc_only(&why, "running");
                (None, Some(why))
            }
        };
        let hz = system::clock_ticks_per_second()?;
        let has_bpf = accounting.is_some();
        let wait_from_kernel = accounting
            .as_ref()
            .is_some_and(|p| p.with(|acc| acc.runq_wait_from_kernel()));
        let pipeline = Pipeline::open(&cfg.sampling.proc_root, hz, accounting);
        let origin = pipeline.origin();
        let tier = crate::accounting::tier_of(origin);
        let fault_source = match origin {
            Some(CounterOrigin::Ebpf { fault_source, .. }) => fault_source.describe().to_owned(),
            _ => crate::accounting::PROC_FAULT_SOURCE.to_owned(),
        };
        let accounting_mode = crate::record::accounting_mode(proc_only.as_ref());
        let (producer, producer_off) = producer::start(&cfg, origin, proc_only.as_ref());
        let mut store = Store::open(&cfg.store.dir, limits(&cfg))?;
        configure_store(&mut store, &cfg);
        let store = Arc::new(Mutex::new(store));
        let listener = server::bind_or_inherit(&cfg.control.socket, cfg.control.group.as_deref())?;
        let kept = privileges::drop_to(DAEMON_CAPS)?;
        let capabilities = privileges::describe(&kept);
        log::info!(
            "vitalsd running; accounting {accounting_mode}; tier {}; capabilities {capabilities}; store {}",
            tier.name(),
            cfg.store.dir.display()
        );

        let (tx, commands) = mpsc::channel::<Command>();
        let shared = Arc::new(Shared {
            state: Mutex::new(DaemonState {
                status: DaemonStatus {
                    version: env!("CARGO_PKG_VERSION").into(),
                    started_unix_ms: store::now_unix_ms(),
                    interval_ms: cfg.sampling.interval.0.as_millis() as u64,
                    fault_source,
                    accounting: accounting_mode,
                    tier: tier.name().into(),
                    tier_gives: tier_gives(tier, wait_from_kernel),
                    capture_backend: backends::resolve(cfg.capture.backend, has_bpf)
                        .name()
                        .into(),
                    capabilities,
                    config_path: config_path.display().to_string(),
                    ..DaemonStatus::default()
                },
                config_toml: cfg.to_toml(),
            }),
            store: Arc::clone(&store),
            commands: tx,
            allowed_uids: Mutex::new(cfg.control.allowed_uids.clone()),
            max_request_bytes: AtomicU64::new(u64::from(cfg.control.max_request_bytes)),
            counters: Default::default(),
        });
        server::spawn(listener, Arc::clone(&shared) as Arc<server::Shared>)
            .map_err(ServiceError::Thread)?;

        // Written in the order `run` once created these as locals.
        Ok(Self {
            producer,
            producer_off,
            history: History::new(cfg.history_len()),
            engine: Engine::new(
                cfg.rules.clone(),
                cfg.budget.clone(),
                cfg.conditions.clone(),
            ),
            capture: None,
            rings: rings::Rings::default(),
            heap: None,
            runner: Arc::new(heap_runner(&cfg)),
            next_tick: Instant::now(),
            last_expiry: Instant::now(),
            read_errors: ReadErrors::default(),
            shared,
            commands,
            store,
            pipeline,
            proc_only,
            _store_lock: store_lock,
            signals,
            cfg,
            config_path,
        })
    }
}

#[cfg(test)]
mod kernel_memory_tests;
