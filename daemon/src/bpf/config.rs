//! What the caller asks of the accounting programs: `AccountingConfig` with
//! eBPF or /proc only (`AccountingChoice`), the capture transport
//! (`EventTransportChoice`), its map bounds (`MapLimits`), the capture tier's kernel memory
//! (`EventSizing`), where programs come from (`PinMode`), and the fault
//! source asked for (`FaultSourceChoice`; the one in use, `FaultSource`,
//! is `accounting`'s, since every tier's counters name it).

use std::{ops::RangeInclusive, path::PathBuf, time::Duration};

use serde::{Deserialize, Serialize};
/// Whether the daemon accounts with eBPF (`sampling.accounting`,
/// `vitalsd record --accounting`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AccountingChoice {
    /// eBPF, or /proc only when BPF is denied (logged, and reported).
    #[default]
    Auto,
    /// eBPF or nothing: a denial is an error, as before /proc-only existed.
    Bpf,
    /// /proc only, without trying BPF.
    Proc,
}

impl AccountingChoice {
    pub fn name(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Bpf => "bpf",
            Self::Proc => "proc",
        }
    }
}

impl std::str::FromStr for AccountingChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "bpf" | "ebpf" => Ok(Self::Bpf),
            "proc" | "proc-only" => Ok(Self::Proc),
            _ => Err(format!("unknown accounting {s:?} (auto, bpf, proc)")),
        }
    }
}

/// How capture records get from the programs to user space.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EventTransportChoice {
    /// The ring buffer where the kernel has one, else the perf array.
    #[default]
    Auto,
    RingBuf,
    PerfArray,
}

impl std::str::FromStr for EventTransportChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "ringbuf" | "ring" => Ok(Self::RingBuf),
            "perf" | "perf-array" => Ok(Self::PerfArray),
            _ => Err(format!(
                "unknown capture transport {s:?} (auto, ringbuf, perf)"
            )),
        }
    }
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
            max_exited: exited_entries(DEFAULT_EXITS_PER_SECOND, Duration::from_secs(1)),
        }
    }
}

/// Thread exits per second the EXITED map absorbs between two reads by
/// default. A busy host (a build, an app launch storm) frees thousands of
/// tasks a second; this is what the map held before it was sized by
/// rate (4096 at the 1 s interval).
pub const DEFAULT_EXITS_PER_SECOND: u32 = 2048;
/// Smallest EXITED: a few bursts' worth even for a tiny rate.
pub const MIN_EXITED: u32 = 16;
/// Largest EXITED: about 130 bytes an entry (key, value, hash element),
/// preallocated, so 16 MiB of kernel memory.
pub const MAX_EXITED: u32 = 1 << 17;

/// EXITED's bound for `exits_per_second` read every `interval`: the
/// exits of one interval, twice over (a read can come late by up to an
/// interval when the daemon stalls), clamped to [`MIN_EXITED`,
/// `MAX_EXITED`]. Records that find the map full are lost and counted
/// (`drop_reason::EXITED_MAP_FULL`); user space then folds those threads
/// from their last counters (`totals`).
pub fn exited_entries(exits_per_second: u32, interval: Duration) -> u32 {
    let want = (f64::from(exits_per_second) * interval.as_secs_f64() * 2.0).ceil();
    want.clamp(f64::from(MIN_EXITED), f64::from(MAX_EXITED)) as u32
}

/// What the machine bounds the maps by, read when the programs load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MachineBounds {
    /// /proc/sys/kernel/pid_max: every tid and tgid is below it (32768 on
    /// most phones), so no per-task or per-process map can use more entries.
    pub pid_max: u32,
    /// Possible CPUs: what per-CPU maps are allocated for, and how many
    /// CPUs can write capture records at once.
    pub possible_cpus: u32,
}

// One function per map, so that a map's sizing reads in one place. Each
// bound is a preallocated map's max_entries: the kernel charges it in full
// at creation (fdinfo `memlock`), used or not.

/// TASKS: one entry a live thread, `max_tasks` of them, never more than
/// there can be tids. A thread that finds it full is counted
/// (`drop_reason::TASKS_MAP_FULL`).
pub fn tasks_entries(limits: &MapLimits, machine: &MachineBounds) -> u32 {
    limits.max_tasks.min(machine.pid_max).max(1)
}

/// PROCESS_FAULTS: one entry a live process, never more than there can
/// be tgids.
pub fn process_faults_entries(limits: &MapLimits, machine: &MachineBounds) -> u32 {
    limits.max_processes.min(machine.pid_max).max(1)
}

/// EXITED: the exits of two sampling intervals (`exited_entries`), never
/// more than there can be tids.
pub fn exited_map_entries(limits: &MapLimits, machine: &MachineBounds) -> u32 {
    limits.max_exited.min(machine.pid_max).max(1)
}

/// Capture ring buffer bytes a possible CPU adds to the default: a CPU
/// switching flat out (`perf bench sched pipe`) writes ~20 MB/s of
/// records, so this is ~13 ms of that, over twice the drain thread's 5 ms
/// poll (`events::EventOptions::poll`). Records that find the ring full
/// are dropped and counted (`capture_ringbuf_lost_events`).
pub const RING_BYTES_PER_CPU: u32 = 256 << 10;
/// Largest default ring: what every machine got before it scaled with
/// CPUs (a bigger one is `[capture] buffer_bytes`).
pub const MAX_DEFAULT_RING_BYTES: u32 = 8 << 20;

/// CAPTURE_EVENTS' default bytes for `possible_cpus`: [`RING_BYTES_PER_CPU`]
/// each, a power of two (the ring buffer needs one), at most
/// [`MAX_DEFAULT_RING_BYTES`].
pub fn capture_ring_bytes(possible_cpus: u32) -> u32 {
    RING_BYTES_PER_CPU
        .saturating_mul(possible_cpus.max(1))
        .min(MAX_DEFAULT_RING_BYTES)
        .next_power_of_two()
}

/// Default entries of the sampled-fault stack map (~1 KiB each): the
/// distinct user stacks of one capture's sampled faults. A stack that
/// finds it full is counted (`lost_stacks`), its sample kept without it.
pub const DEFAULT_STACK_ENTRIES: u32 = 1024;

#[derive(Debug, Clone)]
pub struct AccountingConfig {
    /// eBPF, /proc only, or eBPF falling back to /proc only when BPF is
    /// denied (`bpf::open`; `Accounting::load` itself always loads).
    pub choice: AccountingChoice,
    pub fault_source: FaultSourceChoice,
    pub limits: MapLimits,
    /// Account runqueue wait. Needs the sched_wakeup programs, which cost
    /// about as much again as sched_switch on wakeup-heavy loads.
    pub runq_wait: bool,
    /// Off-CPU accounting (blocked time in S and D, long blocks, wakers):
    /// a sched_waking program beside sched_switch. None: off.
    pub offcpu: Option<OffcpuSettings>,
    /// Use the portable (offsets-from-tracefs) scheduler programs even where
    /// the fast fixed-layout ones would do; for tests of that path.
    pub force_portable_layout: bool,
    /// Attach the classic scheduler tracepoints even where the kernel's BTF
    /// allows the raw (tp_btf) ones; for tests of that path.
    pub force_classic_tracepoints: bool,
    /// Attach the pre-5.18 tp_btf sched_switch program (prev's state read
    /// from the task) on a kernel with the 5.18+ prototype too, which only
    /// adds an argument it does not read; for tests of that path.
    pub force_switch_task_state: bool,
    /// Keep wakeup times in the bounded hash even where pid_max would
    /// allow the array; for tests of that path.
    pub force_wake_hash: bool,
    /// Keep task and process counters in the TASKS / PROCESS_FAULTS
    /// hashes only (TASKS_BY_TID / FAULTS_BY_TGID get one slot), as for
    /// ids past pid_max's array; for tests of the hashes' bounds.
    #[doc(hidden)]
    pub force_task_hash: bool,
    /// Keep freed tasks' records in the EXITED hash even where the kernel
    /// has ring buffers (EXITED_RING holds at least a page of records);
    /// for tests of the hash's one-record bound.
    #[doc(hidden)]
    pub force_exited_hash: bool,
    /// Leave sched_process_free's pid offset unset, as bpfloader does, so
    /// the program tells it from the record; for tests of that path.
    pub free_pid_from_record: bool,
    /// Reserve the capture tier's kernel memory (ring buffer, stack map).
    /// None: those maps get their minimum size and captures are refused.
    pub capture: Option<EventSizing>,
    /// Pinned objects on a bpffs (Android user builds: bpfloader's pins).
    pub pins: PinMode,
    /// Behave as on a kernel without BPF_MAP_TYPE_RINGBUF (the object
    /// rewrite and the perf array); for tests of that path.
    pub assume_no_ringbuf: bool,
}

/// What off-CPU accounting is loaded with (frozen at load).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OffcpuSettings {
    /// A block at least this long counts as a long block (µs).
    pub long_block_us: u32,
    /// Bound of the (wakee process, waker process) map.
    pub max_waker_pairs: u32,
}

impl Default for OffcpuSettings {
    fn default() -> Self {
        Self {
            // One 60 Hz frame.
            long_block_us: 16_000,
            max_waker_pairs: 4096,
        }
    }
}

/// Where programs and maps come from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum PinMode {
    /// Load with aya and attach (userdebug/eng builds, Linux).
    #[default]
    Load,
    /// Attach the programs pinned in this directory and read the pinned
    /// maps, if they are there; load with aya otherwise. On Android user
    /// builds only bpfloader may load programs (SELinux neverallow), so
    /// this is the only way in.
    AttachFrom(PathBuf),
    /// Load with aya, pin every program and map here, attach nothing: what
    /// bpfloader does on a device, for testing the attach path on Linux.
    PinTo(PathBuf),
}

/// Kernel memory of the capture tier, reserved at load time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventSizing {
    /// Ring buffer bytes: a power of two, at least one page.
    pub ring_bytes: u32,
    /// Distinct user stacks the stack-trace map holds (about 1 KiB each).
    pub stack_entries: u32,
    /// Processes whose fault-sampling counters are tracked at once (LRU).
    pub fault_processes: u32,
    /// Ring buffer or perf event array (`vitalsd record --capture-transport`).
    /// With the perf array, `ring_bytes` is split over the online CPUs.
    pub transport: EventTransportChoice,
}

impl Default for EventSizing {
    fn default() -> Self {
        Self {
            // perf bench sched pipe on 2 CPUs writes ~40 MB/s of records;
            // 8 MiB is ~200 ms of that, far more than one poll period.
            ring_bytes: 8 << 20,
            stack_entries: 4096,
            fault_processes: 4096,
            transport: EventTransportChoice::Auto,
        }
    }
}

/// `[capture]` of the daemon's config: the capture tier's kernel memory,
/// which `vitalsd run` reserves when its programs load (a map's size is
/// fixed then) and holds for its life, for the captures of its rules and
/// of `vitalsctl capture`. A reload cannot resize it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EventMemory {
    /// Capture ring buffer bytes (with the perf array, split over the
    /// online CPUs): a power of two in [`EventMemory::BUFFER_BYTES`].
    /// Records that find it full are dropped and counted.
    pub buffer_bytes: u32,
    /// Distinct sampled-fault user stacks the stack map holds, about 1 KiB
    /// each; in [`EventMemory::STACK_ENTRIES`]. A stack that finds it
    /// full is counted (`lost_stacks`) and its sample kept without it.
    pub stack_entries: u32,
}

impl Default for EventMemory {
    /// What `vitalsd run` reserves for captures unless `[capture]` says:
    /// the ring scaled to this machine's possible CPUs
    /// ([`capture_ring_bytes`]) and [`DEFAULT_STACK_ENTRIES`] stacks.
    fn default() -> Self {
        let cpus = crate::system::possible_cpus(std::path::Path::new("/sys"))
            .map_or(1, |c| c.len() as u32);
        Self::for_cpus(cpus)
    }
}

impl EventMemory {
    /// The default on a machine with `possible_cpus` (the kernel memory
    /// computed for another machine, `bpf::memory`).
    pub fn for_cpus(possible_cpus: u32) -> Self {
        Self {
            buffer_bytes: capture_ring_bytes(possible_cpus),
            stack_entries: DEFAULT_STACK_ENTRIES,
        }
    }

    /// 64 KiB (a page on every Linux page size) to 256 MiB.
    pub const BUFFER_BYTES: RangeInclusive<u32> = (64 << 10)..=(256 << 20);
    pub const STACK_ENTRIES: RangeInclusive<u32> = 64..=65536;

    /// The key (under `capture.`) out of range, and why.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        let (lo, hi) = Self::BUFFER_BYTES.into_inner();
        if !self.buffer_bytes.is_power_of_two() || !Self::BUFFER_BYTES.contains(&self.buffer_bytes)
        {
            return Err((
                "buffer_bytes",
                format!(
                    "{} is not a power of two between {lo} (64 KiB) and {hi} (256 MiB)",
                    self.buffer_bytes
                ),
            ));
        }
        if !Self::STACK_ENTRIES.contains(&self.stack_entries) {
            let (lo, hi) = Self::STACK_ENTRIES.into_inner();
            return Err((
                "stack_entries",
                format!("{} is not between {lo} and {hi}", self.stack_entries),
            ));
        }
        Ok(())
    }

    /// What the programs load with.
    pub fn sizing(&self) -> EventSizing {
        EventSizing {
            ring_bytes: self.buffer_bytes,
            stack_entries: self.stack_entries,
            ..EventSizing::default()
        }
    }
}

impl Default for AccountingConfig {
    fn default() -> Self {
        Self {
            choice: Default::default(),
            fault_source: FaultSourceChoice::default(),
            limits: MapLimits::default(),
            runq_wait: true,
            offcpu: Some(OffcpuSettings::default()),
            force_portable_layout: false,
            force_classic_tracepoints: false,
            force_switch_task_state: false,
            force_wake_hash: false,
            force_task_hash: false,
            force_exited_hash: false,
            free_pid_from_record: false,
            capture: None,
            pins: PinMode::Load,
            assume_no_ringbuf: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exited_is_sized_by_rate_and_interval_within_bounds() {
        let s = Duration::from_secs(1);
        assert_eq!(MapLimits::default().max_exited, 4096);
        assert_eq!(exited_entries(2048, 10 * s), 40960);
        assert_eq!(exited_entries(100, Duration::from_millis(250)), 50);
        assert_eq!(exited_entries(1, s), MIN_EXITED);
        assert_eq!(exited_entries(1_000_000, 3600 * s), MAX_EXITED);
    }

    #[test]
    fn maps_are_bounded_by_pid_max() {
        let limits = MapLimits::default();
        let phone = MachineBounds {
            pid_max: 32768,
            possible_cpus: 8,
        };
        assert_eq!(tasks_entries(&limits, &phone), 16384);
        assert_eq!(process_faults_entries(&limits, &phone), 8192);
        assert_eq!(exited_map_entries(&limits, &phone), 4096);
        let tiny = MachineBounds {
            pid_max: 1000,
            possible_cpus: 1,
        };
        assert_eq!(tasks_entries(&limits, &tiny), 1000);
        assert_eq!(process_faults_entries(&limits, &tiny), 1000);
        let busy = MapLimits {
            max_exited: exited_entries(2048, Duration::from_secs(10)),
            ..limits
        };
        assert_eq!(exited_map_entries(&busy, &tiny), 1000);
    }

    #[test]
    fn the_default_capture_ring_scales_with_cpus() {
        assert_eq!(capture_ring_bytes(1), 256 << 10);
        assert_eq!(capture_ring_bytes(2), 512 << 10);
        assert_eq!(capture_ring_bytes(3), 1 << 20);
        assert_eq!(capture_ring_bytes(8), 2 << 20);
        assert_eq!(capture_ring_bytes(32), 8 << 20);
        assert_eq!(capture_ring_bytes(4096), MAX_DEFAULT_RING_BYTES);
        for cpus in 0..300 {
            let bytes = capture_ring_bytes(cpus);
            assert!(bytes.is_power_of_two());
            assert!(
                EventMemory::BUFFER_BYTES.contains(&bytes),
                "{cpus}: {bytes}"
            );
        }
    }

    #[test]
    fn capture_memory_is_a_bounded_power_of_two() {
        let ok = EventMemory::default();
        assert_eq!(ok.check(), Ok(()));
        let cpus = crate::system::possible_cpus(std::path::Path::new("/sys"))
            .unwrap()
            .len() as u32;
        assert_eq!(ok.sizing().ring_bytes, capture_ring_bytes(cpus));
        assert_eq!(ok.sizing().stack_entries, DEFAULT_STACK_ENTRIES);
        for bytes in [0, 3 << 20, 32 << 10, 512 << 20] {
            let (key, why) = EventMemory {
                buffer_bytes: bytes,
                ..ok
            }
            .check()
            .unwrap_err();
            assert_eq!(key, "buffer_bytes");
            assert!(why.contains("power of two between 65536"), "{why}");
        }
        for entries in [0, 63, 65537] {
            let (key, _) = EventMemory {
                stack_entries: entries,
                ..ok
            }
            .check()
            .unwrap_err();
            assert_eq!(key, "stack_entries");
        }
        let small = EventMemory {
            buffer_bytes: 64 << 10,
            stack_entries: 64,
        };
        assert_eq!(small.check(), Ok(()));
        assert_eq!(small.sizing().ring_bytes, 64 << 10);
        assert_eq!(small.sizing().stack_entries, 64);
    }
}
