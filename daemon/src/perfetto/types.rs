//! Plain data the writer takes in; independent of the protobuf types so
//! procfs/BPF code need not know the schema.

/// A TrackDescriptor uuid. Never 0 (trace_processor treats 0 as "no track").
pub type TrackUuid = u64;

/// Unit of a counter track. The three builtin units map to
/// `CounterDescriptor.unit`, which the UI formats (durations, byte sizes);
/// anything else goes to the free-text `unit_name`, which Perfetto reads only
/// when `unit` is unspecified.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum CounterUnit {
    TimeNs,
    Count,
    SizeBytes,
    Custom(String),
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CounterSpec {
    pub name: String,
    pub unit: CounterUnit,
    pub description: Option<String>,
}

impl CounterSpec {
    pub fn new(name: impl Into<String>, unit: CounterUnit) -> Self {
        Self {
            name: name.into(),
            unit,
            description: None,
        }
    }

    pub fn with_description(mut self, description: impl Into<String>) -> Self {
        self.description = Some(description.into());
        self
    }
}

/// `TrackEvent.counter_value` (int64) or `double_counter_value` (double).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum CounterValue {
    Int(i64),
    Double(f64),
}

/// Machine facts for SystemInfo. trace_processor derives the kernel version
/// from `utsname.release` (it decodes sched_switch prev_state by version).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SystemFacts {
    pub utsname: crate::system::Utsname,
    /// USER_HZ (sysconf(_SC_CLK_TCK)).
    pub hz: u64,
    pub page_size_bytes: u64,
    pub num_cpus: u32,
    pub system_ram_bytes: Option<u64>,
}

/// identifies a process instance: pid plus /proc/<pid>/stat starttime (ticks since boot) so pid reuse makes a new track
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProcessKey {
    pub pid: i32,
    pub starttime_ticks: u64,
}

/// One process for ProcessTree.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ProcessTreeEntry {
    pub pid: i32,
    pub ppid: i32,
    /// argv, or `[comm]` for kernel threads/zombies (then `cmdline_is_comm`).
    pub cmdline: Vec<String>,
    pub cmdline_is_comm: bool,
    pub uid: Option<i32>,
    /// (tid, thread name) for this process's threads.
    pub threads: Vec<(i32 /*tid*/, String /*name*/)>,
}

/// One CPU's /proc/stat line, already converted from USER_HZ ticks to ns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CpuTimesNs {
    pub cpu_id: u32,
    pub user_ns: u64,
    pub user_nice_ns: u64,
    pub system_mode_ns: u64,
    pub idle_ns: u64,
    pub io_wait_ns: u64,
    pub irq_ns: u64,
    pub softirq_ns: u64,
    pub steal_ns: u64,
}

/// One process for ProcessStats. Memory in kB (as in /proc/<pid>/status and
/// as ProcessStats expects); runtimes in ns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ProcessStatsEntry {
    pub pid: i32,
    pub vm_size_kb: Option<u64>,
    pub vm_rss_kb: Option<u64>,
    pub rss_anon_kb: Option<u64>,
    pub rss_file_kb: Option<u64>,
    pub rss_shmem_kb: Option<u64>,
    pub vm_swap_kb: Option<u64>,
    pub runtime_user_mode_ns: Option<u64>,
    pub runtime_kernel_mode_ns: Option<u64>,
}

/// /proc/pressure/{cpu,io,memory} lines; `total` there is in µs, callers pass ns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PsiResource {
    CpuSome,
    CpuFull,
    IoSome,
    IoFull,
    MemorySome,
    MemoryFull,
}
