//! What every per-task accounting source produces, whichever tier it runs
//! in: cumulative counters per process (the eBPF programs' maps, folded by
//! `bpf::totals`, or the kernel's schedstat files, folded by
//! `sources::schedstat`), and the name of the tier. Sinks (trace tracks, top,
//! rules, the Perfetto data source) take these and know no source.

use vitals_common::{FaultCounters, OffcpuCounters};

/// Cumulative counters of one process since accounting started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcessCounters {
    pub tgid: u32,
    pub oncpu_ns: u64,
    pub runq_wait_ns: u64,
    pub voluntary_switches: u64,
    pub involuntary_switches: u64,
    pub faults: FaultCounters,
    pub live_threads: u32,
    pub exited_threads: u32,
    /// The thread-group leader was freed: this is the process's final row.
    /// A new process reusing the tgid can have a row of its own after it,
    /// in the same update.
    pub ended: bool,
    /// Ended rows: the leader's comm as sched_process_free recorded it
    /// (None when the record had none, or was lost), which names a process
    /// no procfs scan saw alive.
    pub exit_comm: Option<[u8; 16]>,
    /// Blocked time (S, D), long blocks and wakeups; zero while off-CPU
    /// accounting is off (only the eBPF tier has it).
    pub offcpu: OffcpuCounters,
    /// Long blocks of the main thread (tid == tgid) alone, cumulative.
    pub main_thread_long_blocks: u64,
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

/// Where the per-task counters come from, which names their tracks and
/// columns so a reader knows which source produced them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CounterOrigin {
    /// The eBPF programs: sched_switch time, wakeup-to-switch wait (when
    /// `runq_wait`), faults from `fault_source`.
    Ebpf {
        fault_source: FaultSource,
        runq_wait: bool,
        /// Off-CPU accounting (blocked time, long blocks) is on.
        offcpu: bool,
    },
    /// The kernel's own per-thread accounting in procfs (`schedstat`,
    /// `status`), faults from `/proc/<pid>/stat` (minflt + majflt).
    Schedstat,
}

impl CounterOrigin {
    /// Whether runqueue wait is measured (always, from schedstat).
    pub fn runq_wait(self) -> bool {
        match self {
            CounterOrigin::Ebpf { runq_wait, .. } => runq_wait,
            CounterOrigin::Schedstat => true,
        }
    }
}

/// The tier the always-on accounting runs in, chosen by what the device
/// grants; named in status, traces and record's summary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    /// The eBPF programs (Linux hosts, userdebug with the platform policy
    /// change, or bpfloader's pins where the policy lets vitalsd read them).
    Ebpf,
    /// No eBPF: the kernel's per-thread schedstat and status files (what an
    /// unmodified AOSP policy grants a platform daemon, so CTS user builds),
    /// and captures through Perfetto's own data sources.
    Cts,
    /// Neither eBPF nor schedstat: clock-tick CPU time from stat only.
    Ticks,
}

impl Tier {
    pub fn name(self) -> &'static str {
        match self {
            Tier::Ebpf => "ebpf",
            Tier::Cts => "cts",
            Tier::Ticks => "ticks",
        }
    }

    /// What the tier gives, in one line.
    pub fn gives(self) -> &'static str {
        match self {
            Tier::Ebpf => {
                "per-task on-CPU ns, runqueue wait, switches and faults from eBPF; captures from \
                 eBPF (sched timeline, fault stacks)"
            }
            Tier::Cts => {
                "per-task on-CPU ns, runqueue wait and switches from the kernel's schedstat/status, \
                 faults from stat; captures through Perfetto's data sources"
            }
            Tier::Ticks => {
                "per-process CPU in clock ticks and faults from stat only; captures through \
                 Perfetto's data sources"
            }
        }
    }
}

/// Where faults come from without eBPF, as status says after "faults from".
pub const PROC_FAULT_SOURCE: &str = "/proc/<pid>/stat minflt + majflt (successful faults, no eBPF)";

/// The tier a daemon or recording runs in, from where its counters come.
pub fn tier_of(origin: Option<CounterOrigin>) -> Tier {
    match origin {
        Some(CounterOrigin::Ebpf { .. }) => Tier::Ebpf,
        Some(CounterOrigin::Schedstat) => Tier::Cts,
        None => Tier::Ticks,
    }
}
