//! Loading, attaching and reading the eBPF accounting programs.
//!
//! The kernel side keeps monotonic counters; this module only reads them
//! (summing per-CPU slots over *possible* CPUs) and drains the EXITED map of
//! final counters of freed tasks. It never clears a live map.

pub mod totals;
pub mod tracefs;

use std::collections::HashMap;

use aya::{
    maps::{HashMap as AyaHashMap, MapData, MapError, PerCpuArray, PerCpuHashMap},
    programs::{
        perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent},
        PerfEvent, ProgramError, TracePoint,
    },
    Ebpf, EbpfError, EbpfLoader,
};
use thiserror::Error;
use vitals_common::{
    drop_reason, fixed_layout, names, CpuState, ExitKey, ExitedTask, FaultCounters, TaskCounters,
};

use self::tracefs::{Tracefs, TracefsError};

/// The object built from `ebpf-programs/` by build.rs, 8-byte aligned as
/// the ELF parser wants (aya's include_bytes_aligned!).
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(env!("VITALS_EBPF_OBJ"));

#[derive(Debug, Error)]
pub enum BpfError {
    #[error(
        "loading eBPF needs {missing} (effective capabilities: {have}); run as root or grant them \
         (on Android user builds only bpfloader may load programs)"
    )]
    MissingCapabilities { missing: String, have: String },
    #[error(transparent)]
    Tracefs(#[from] TracefsError),
    #[error("loading the eBPF object: {0} (loading BPF needs CAP_BPF and CAP_PERFMON, or root)")]
    Load(#[source] EbpfError),
    #[error("eBPF program `{name}`: {source}")]
    Program {
        name: &'static str,
        #[source]
        source: ProgramError,
    },
    #[error("attaching `{name}` to {target}: {source}")]
    Attach {
        name: &'static str,
        target: String,
        #[source]
        source: ProgramError,
    },
    #[error("eBPF object has no map or program `{0}`")]
    Missing(&'static str),
    #[error("eBPF map `{name}`: {source}")]
    Map {
        name: &'static str,
        #[source]
        source: MapError,
    },
    #[error("the kernel has no tracepoint {0}; vitalsd cannot account scheduling without it")]
    NoTracepoint(&'static str),
    #[error("fault source `tracepoint` was requested but exceptions/page_fault_user does not exist on this kernel (arm64 has none); use `perf` or `auto`")]
    NoFaultTracepoint,
    #[error(transparent)]
    System(#[from] crate::system::SystemError),
}

/// Which fault source to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FaultSourceChoice {
    /// The tracepoint where it exists, else perf software events.
    #[default]
    Auto,
    Tracepoint,
    PerfEvent,
    Off,
}

impl std::str::FromStr for FaultSourceChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "tracepoint" => Ok(Self::Tracepoint),
            "perf" | "perf-event" => Ok(Self::PerfEvent),
            "off" => Ok(Self::Off),
            _ => Err(format!(
                "unknown fault source {s:?} (auto, tracepoint, perf, off)"
            )),
        }
    }
}

/// The fault source in use: reported with every output, because the two
/// count different things.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultSource {
    /// exceptions/page_fault_user: fault *entries* (retries and failed faults too).
    Tracepoint,
    /// perf software events minor-faults/major-faults: successful faults, the
    /// same accounting as minflt/majflt in /proc/<pid>/stat.
    PerfEvent,
    None,
}

impl FaultSource {
    pub fn name(self) -> &'static str {
        match self {
            FaultSource::Tracepoint => "tracepoint",
            FaultSource::PerfEvent => "perf",
            FaultSource::None => "none",
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            FaultSource::Tracepoint => {
                "tracepoint exceptions/page_fault_user (counts fault entries, incl. retries)"
            }
            FaultSource::PerfEvent => {
                "perf software events minor-faults + major-faults (successful faults, as minflt/majflt)"
            }
            FaultSource::None => "none (fault accounting off)",
        }
    }

    /// The fault count this source measures, from a counter set.
    pub fn faults(self, f: &FaultCounters) -> u64 {
        match self {
            FaultSource::Tracepoint => f.entries,
            FaultSource::PerfEvent => f.minflt + f.majflt,
            FaultSource::None => 0,
        }
    }
}

/// Bounds of every hash map. Per-CPU values cost `entries x value size x
/// possible CPUs` of kernel memory, preallocated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapLimits {
    pub max_tasks: u32,
    pub max_processes: u32,
    pub max_exited: u32,
}

impl Default for MapLimits {
    fn default() -> Self {
        Self {
            max_tasks: 16384,
            max_processes: 8192,
            max_exited: 4096,
        }
    }
}

#[derive(Debug, Clone)]
pub struct AccountingConfig {
    pub fault_source: FaultSourceChoice,
    pub limits: MapLimits,
    /// Account runqueue wait. Needs the sched_wakeup programs, which cost
    /// about as much again as sched_switch on wakeup-heavy loads.
    pub runq_wait: bool,
    /// Use the portable (offsets-from-tracefs) scheduler programs even where
    /// the fast fixed-layout ones would do; for tests of that path.
    pub force_portable_layout: bool,
    /// Keep wakeup times in the bounded hash even where pid_max would
    /// allow the array; for tests of that path.
    pub force_wake_hash: bool,
}

impl Default for AccountingConfig {
    fn default() -> Self {
        Self {
            fault_source: FaultSourceChoice::default(),
            limits: MapLimits::default(),
            runq_wait: true,
            force_portable_layout: false,
            force_wake_hash: false,
        }
    }
}

/// Above this pid_max the wakeup array would cost more than 2 MiB; use the
/// bounded hash instead (systemd hosts set pid_max to 4194304).
pub const WAKE_ARRAY_MAX_PIDS: u32 = 1 << 18;

fn read_pid_max() -> Result<u32, BpfError> {
    let path = "/proc/sys/kernel/pid_max";
    let text = std::fs::read_to_string(path).map_err(|source| {
        BpfError::System(crate::system::SystemError::Read {
            path: path.into(),
            source,
        })
    })?;
    Ok(text.trim().parse().unwrap_or(u32::MAX))
}

/// Which scheduler programs are attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TracepointLayout {
    /// The kernel's fields sit where `vitals_common::fixed_layout` says:
    /// programs read them with direct context loads.
    Fixed,
    /// Offsets from tracefs format files, read with bpf_probe_read_kernel.
    Portable,
}

/// What the kernel offers, probed before loading.
#[derive(Debug, Clone)]
pub struct Features {
    pub btf_vmlinux: bool,
    pub page_fault_user_tracepoint: bool,
    pub kernel_release: String,
}

impl Features {
    pub fn probe(tracefs: &Tracefs) -> Result<Self, BpfError> {
        Ok(Self {
            btf_vmlinux: std::path::Path::new("/sys/kernel/btf/vmlinux").exists(),
            page_fault_user_tracepoint: tracefs.has_event("exceptions", "page_fault_user"),
            kernel_release: crate::system::utsname()?.release,
        })
    }
}

/// Everything read from the maps at one instant.
#[derive(Debug, Clone, Default)]
pub struct BpfSnapshot {
    /// CLOCK_MONOTONIC (bpf_ktime_get_ns's clock) when CPU_STATE was read.
    pub monotonic_ns: u64,
    /// Live tasks, per-CPU slots summed. `oncpu_ns` here is only what was
    /// attributed at switch-outs; see `inflight_ns`.
    pub tasks: HashMap<u32, TaskCounters>,
    /// On-CPU time of tasks running right now since their last switch-in,
    /// not yet attributed by the kernel side. Read after `tasks`, so
    /// `tasks[t].oncpu_ns + inflight_ns[t]` never exceeds the truth.
    pub inflight_ns: HashMap<u32, u64>,
    /// Freed tasks drained from EXITED by this read.
    pub exited: Vec<(ExitKey, ExitedTask)>,
    /// tgid -> fault counters of the whole process.
    pub process_faults: HashMap<u32, FaultCounters>,
    /// Cumulative drop counters, indexed by `drop_reason`.
    pub drops: [u64; drop_reason::COUNT as usize],
}

/// The loaded and attached accounting programs.
pub struct Accounting {
    ebpf: Ebpf,
    fault_source: FaultSource,
    features: Features,
    limits: MapLimits,
    layout: TracepointLayout,
    runq_wait: bool,
}

impl Accounting {
    /// Mounts tracefs if needed, probes, loads and attaches everything.
    pub fn load(cfg: &AccountingConfig) -> Result<Self, BpfError> {
        check_capabilities()?;
        let tracefs = Tracefs::find_or_mount()?;
        let features = Features::probe(&tracefs)?;
        let fault_source = match (cfg.fault_source, features.page_fault_user_tracepoint) {
            (FaultSourceChoice::Off, _) => FaultSource::None,
            (FaultSourceChoice::PerfEvent, _) | (FaultSourceChoice::Auto, false) => {
                FaultSource::PerfEvent
            }
            (FaultSourceChoice::Tracepoint | FaultSourceChoice::Auto, true) => {
                FaultSource::Tracepoint
            }
            (FaultSourceChoice::Tracepoint, false) => return Err(BpfError::NoFaultTracepoint),
        };
        for (cat, name) in [("sched", "sched_switch"), ("sched", "sched_process_free")] {
            if !tracefs.has_event(cat, name) {
                return Err(BpfError::NoTracepoint(if name == "sched_switch" {
                    "sched/sched_switch"
                } else {
                    "sched/sched_process_free"
                }));
            }
        }

        let switch = tracefs.format("sched", "sched_switch")?;
        let wakeup = tracefs.format("sched", "sched_wakeup")?;
        let free = tracefs.format("sched", "sched_process_free")?;
        let offsets: [(&str, u32); 5] = [
            (names::G_SWITCH_PREV_PID, switch.offset_of("prev_pid", 4)?),
            (
                names::G_SWITCH_PREV_STATE,
                switch.offset_of("prev_state", 8)?,
            ),
            (names::G_SWITCH_NEXT_PID, switch.offset_of("next_pid", 4)?),
            (names::G_WAKEUP_PID, wakeup.offset_of("pid", 4)?),
            (names::G_FREE_PID, free.offset_of("pid", 4)?),
        ];
        let nr_cpus = aya::util::nr_cpus().map_err(|(path, source)| {
            BpfError::System(crate::system::SystemError::Read {
                path: path.into(),
                source,
            })
        })? as u32;

        // Wakeup times in an array indexed by tid when pid_max keeps it
        // small (8 bytes a pid): its lookups are inlined, a hash's are not.
        // Not fatal: Android's policy does not grant pid_max (see
        // android::NOT_GRANTED), and the bounded hash works everywhere.
        let pid_max = read_pid_max().unwrap_or_else(|e| {
            log::warn!("{e}; keeping wakeup times in the bounded hash");
            u32::MAX
        });
        let wake_array = pid_max <= WAKE_ARRAY_MAX_PIDS && !cfg.force_wake_hash;
        let (wake_array_len, wake_hash_len) = if wake_array {
            (pid_max, 1)
        } else {
            (1, cfg.limits.max_tasks)
        };
        let wake_array_flag = u32::from(wake_array);
        let track_wait_flag = u32::from(cfg.runq_wait);
        let mut loader = EbpfLoader::new();
        loader
            .override_global(names::G_NR_CPUS, &nr_cpus, true)
            .override_global(names::G_WAKE_ARRAY, &wake_array_flag, true)
            .override_global(names::G_TRACK_WAIT, &track_wait_flag, true)
            .map_max_entries(names::TASKS, cfg.limits.max_tasks)
            .map_max_entries(names::WAKE_TS, wake_hash_len)
            .map_max_entries(names::WAKE_TS_ARRAY, wake_array_len)
            .map_max_entries(names::PROCESS_FAULTS, cfg.limits.max_processes)
            .map_max_entries(names::EXITED, cfg.limits.max_exited);
        for (name, off) in &offsets {
            loader.override_global(name, off, true);
        }
        let mut ebpf = loader.load(EBPF_OBJECT).map_err(BpfError::Load)?;

        let wakeup_new = tracefs.format("sched", "sched_wakeup_new")?;
        let fixed_matches = offsets[0].1 == fixed_layout::SWITCH_PREV_PID
            && offsets[1].1 == fixed_layout::SWITCH_PREV_STATE
            && offsets[2].1 == fixed_layout::SWITCH_NEXT_PID
            && offsets[3].1 == fixed_layout::WAKEUP_PID
            && wakeup_new.offset_of("pid", 4)? == fixed_layout::WAKEUP_PID;
        let layout = if fixed_matches && !cfg.force_portable_layout {
            TracepointLayout::Fixed
        } else {
            TracepointLayout::Portable
        };
        let (switch_prog, wakeup_prog, wakeup_new_prog) = match layout {
            TracepointLayout::Fixed => (
                names::PROG_SCHED_SWITCH_FIXED,
                names::PROG_SCHED_WAKEUP_FIXED,
                names::PROG_SCHED_WAKEUP_NEW_FIXED,
            ),
            TracepointLayout::Portable => (
                names::PROG_SCHED_SWITCH,
                names::PROG_SCHED_WAKEUP,
                names::PROG_SCHED_WAKEUP_NEW,
            ),
        };
        attach_tracepoint(&mut ebpf, switch_prog, "sched", "sched_switch")?;
        if cfg.runq_wait {
            attach_tracepoint(&mut ebpf, wakeup_prog, "sched", "sched_wakeup")?;
            attach_tracepoint(&mut ebpf, wakeup_new_prog, "sched", "sched_wakeup_new")?;
        }
        attach_tracepoint(
            &mut ebpf,
            names::PROG_SCHED_PROCESS_FREE,
            "sched",
            "sched_process_free",
        )?;
        match fault_source {
            FaultSource::Tracepoint => attach_tracepoint(
                &mut ebpf,
                names::PROG_PAGE_FAULT_USER,
                "exceptions",
                "page_fault_user",
            )?,
            FaultSource::PerfEvent => {
                let cpus = crate::system::online_cpus(std::path::Path::new("/sys"))?;
                attach_perf_sw(
                    &mut ebpf,
                    names::PROG_PERF_MINFLT,
                    SoftwareEvent::PageFaultsMin,
                    &cpus,
                )?;
                attach_perf_sw(
                    &mut ebpf,
                    names::PROG_PERF_MAJFLT,
                    SoftwareEvent::PageFaultsMaj,
                    &cpus,
                )?;
            }
            FaultSource::None => {}
        }
        log::info!(
            "eBPF accounting attached: fault source {}; {:?} tracepoint layout; wakeup times in {}; {} possible CPUs; BTF {}",
            fault_source.describe(),
            layout,
            if wake_array { "an array (pid_max small)" } else { "a bounded hash" },
            nr_cpus,
            if features.btf_vmlinux { "yes" } else { "no" }
        );
        Ok(Self {
            ebpf,
            fault_source,
            features,
            limits: cfg.limits,
            layout,
            runq_wait: cfg.runq_wait,
        })
    }

    /// Is `runq_wait_ns` measured? When not, it is not zero but unknown.
    pub fn runq_wait(&self) -> bool {
        self.runq_wait
    }

    pub fn layout(&self) -> TracepointLayout {
        self.layout
    }

    pub fn fault_source(&self) -> FaultSource {
        self.fault_source
    }

    pub fn features(&self) -> &Features {
        &self.features
    }

    pub fn limits(&self) -> MapLimits {
        self.limits
    }

    /// Reads every map. Tasks first, then CPU_STATE, so in-flight time is a
    /// lower bound (see `BpfSnapshot::inflight_ns`). Drains EXITED.
    pub fn read(&mut self) -> Result<BpfSnapshot, BpfError> {
        let mut snap = BpfSnapshot::default();

        // Freed tasks first: a task freed between this drain and the TASKS
        // walk below is then seen live now and exited next time, never lost.
        {
            let map = self.map_mut(names::EXITED)?;
            let mut exited: AyaHashMap<&mut MapData, ExitKey, ExitedTask> =
                AyaHashMap::try_from(map).map_err(map_err(names::EXITED))?;
            let keys: Vec<ExitKey> = exited.keys().filter_map(Result::ok).collect();
            for key in keys {
                match exited.get(&key, 0) {
                    Ok(v) => snap.exited.push((key, v)),
                    Err(MapError::KeyNotFound) => continue,
                    Err(e) => {
                        return Err(BpfError::Map {
                            name: names::EXITED,
                            source: e,
                        })
                    }
                }
                // Drained records are final values, not live counters.
                let _ = exited.remove(&key);
            }
        }

        {
            let tasks: PerCpuHashMap<&MapData, u32, TaskCounters> =
                PerCpuHashMap::try_from(self.map(names::TASKS)?).map_err(map_err(names::TASKS))?;
            for item in tasks.iter() {
                let (tid, per_cpu) = match item {
                    Ok(kv) => kv,
                    // Freed between get_next_key and lookup: normal.
                    Err(MapError::KeyNotFound) => continue,
                    Err(e) => {
                        return Err(BpfError::Map {
                            name: names::TASKS,
                            source: e,
                        })
                    }
                };
                let mut sum = TaskCounters::default();
                for c in per_cpu.iter() {
                    sum.add(c);
                }
                snap.tasks.insert(tid, sum);
            }
        }

        {
            let faults: PerCpuHashMap<&MapData, u32, FaultCounters> =
                PerCpuHashMap::try_from(self.map(names::PROCESS_FAULTS)?)
                    .map_err(map_err(names::PROCESS_FAULTS))?;
            for item in faults.iter() {
                let (tgid, per_cpu) = match item {
                    Ok(kv) => kv,
                    Err(MapError::KeyNotFound) => continue,
                    Err(e) => {
                        return Err(BpfError::Map {
                            name: names::PROCESS_FAULTS,
                            source: e,
                        })
                    }
                };
                let mut sum = FaultCounters::default();
                for c in per_cpu.iter() {
                    sum.add(c);
                }
                snap.process_faults.insert(tgid, sum);
            }
        }

        {
            let cpu_state: PerCpuArray<&MapData, CpuState> =
                PerCpuArray::try_from(self.map(names::CPU_STATE)?)
                    .map_err(map_err(names::CPU_STATE))?;
            let per_cpu = cpu_state.get(&0, 0).map_err(map_err(names::CPU_STATE))?;
            snap.monotonic_ns = crate::clock::monotonic_ns();
            for s in per_cpu.iter() {
                if s.valid != 0 && snap.monotonic_ns > s.last_switch_ns {
                    *snap.inflight_ns.entry(s.running_tid).or_default() +=
                        snap.monotonic_ns - s.last_switch_ns;
                }
            }
        }

        {
            let drops: PerCpuArray<&MapData, u64> =
                PerCpuArray::try_from(self.map(names::DROPS)?).map_err(map_err(names::DROPS))?;
            for reason in 0..drop_reason::COUNT {
                let per_cpu = drops.get(&reason, 0).map_err(map_err(names::DROPS))?;
                snap.drops[reason as usize] = per_cpu.iter().sum();
            }
        }
        Ok(snap)
    }

    fn map(&self, name: &'static str) -> Result<&aya::maps::Map, BpfError> {
        self.ebpf.map(name).ok_or(BpfError::Missing(name))
    }

    fn map_mut(&mut self, name: &'static str) -> Result<&mut aya::maps::Map, BpfError> {
        self.ebpf.map_mut(name).ok_or(BpfError::Missing(name))
    }
}

/// Names the missing capability up front instead of surfacing a bare EPERM
/// from bpf(2) or perf_event_open(2). CAP_SYS_ADMIN implies both on kernels
/// before 5.8, and still does for BPF.
fn check_capabilities() -> Result<(), BpfError> {
    use caps::{CapSet, Capability};
    let have = caps::read(None, CapSet::Effective).unwrap_or_default();
    let admin = have.contains(&Capability::CAP_SYS_ADMIN);
    let mut missing = Vec::new();
    if !admin && !have.contains(&Capability::CAP_BPF) {
        missing.push("CAP_BPF");
    }
    if !admin && !have.contains(&Capability::CAP_PERFMON) {
        missing.push("CAP_PERFMON");
    }
    if missing.is_empty() {
        return Ok(());
    }
    Err(BpfError::MissingCapabilities {
        missing: missing.join(" and "),
        have: crate::privileges::describe(&have),
    })
}

fn map_err(name: &'static str) -> impl Fn(MapError) -> BpfError {
    move |source| BpfError::Map { name, source }
}

fn attach_tracepoint(
    ebpf: &mut Ebpf,
    name: &'static str,
    category: &str,
    event: &str,
) -> Result<(), BpfError> {
    let prog: &mut TracePoint = ebpf
        .program_mut(name)
        .ok_or(BpfError::Missing(name))?
        .try_into()
        .map_err(|source| BpfError::Program { name, source })?;
    prog.load()
        .map_err(|source| BpfError::Program { name, source })?;
    prog.attach(category, event)
        .map_err(|source| BpfError::Attach {
            name,
            target: format!("tracepoint {category}/{event}"),
            source,
        })?;
    Ok(())
}

/// One perf software event per online CPU with sample_period 1, so the
/// program runs on every counted fault, in the faulting task's context.
fn attach_perf_sw(
    ebpf: &mut Ebpf,
    name: &'static str,
    event: SoftwareEvent,
    cpus: &[u32],
) -> Result<(), BpfError> {
    let prog: &mut PerfEvent = ebpf
        .program_mut(name)
        .ok_or(BpfError::Missing(name))?
        .try_into()
        .map_err(|source| BpfError::Program { name, source })?;
    prog.load()
        .map_err(|source| BpfError::Program { name, source })?;
    for &cpu in cpus {
        prog.attach(
            PerfEventConfig::Software(event),
            PerfEventScope::AllProcessesOneCpu { cpu },
            SamplePolicy::Period(1),
            false,
        )
        .map_err(|source| BpfError::Attach {
            name,
            target: format!("perf software event {event:?} on cpu {cpu}"),
            source,
        })?;
    }
    Ok(())
}
