//! The object's layout, which needs no kernel: the embedded object, which
//! program serves which event in which layout, which maps each path reads,
//! and the names programs and maps are pinned under on a bpffs
//! (bpfloader's `prog_vitals_*` and `map_vitals_*` scheme, and the names
//! `vitalsd pin` gives).

use std::path::{Path, PathBuf};

use vitals_common::{capture, names};

pub mod btf;
pub mod feature_table;
pub mod format;
pub mod patch;

use super::{BpfError, EventSizing, EventTransportChoice};

/// The object built from `ebpf-programs/` by build.rs, 8-byte aligned as
/// the ELF parser wants (aya's include_bytes_aligned!).
pub(super) static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(env!("VITALS_EBPF_OBJ"));

/// The program for scheduler `event` ("sched_switch", "sched_wakeup",
/// "sched_wakeup_new", "sched_waking": off-CPU accounting's).
pub(super) fn sched_program(
    kind: SchedPrograms,
    layout: TracepointLayout,
    event: &str,
) -> &'static str {
    use names::*;
    if event == "sched_waking" {
        return offcpu_waking_program(kind, layout);
    }
    let [switch, wakeup, wakeup_new] = match (kind, layout) {
        (SchedPrograms::Btf, _) => [
            PROG_SCHED_SWITCH_BTF,
            PROG_SCHED_WAKEUP_BTF,
            PROG_SCHED_WAKEUP_NEW_BTF,
        ],
        (SchedPrograms::Classic, TracepointLayout::Fixed) => [
            PROG_SCHED_SWITCH_FIXED,
            PROG_SCHED_WAKEUP_FIXED,
            PROG_SCHED_WAKEUP_NEW_FIXED,
        ],
        (SchedPrograms::Classic, TracepointLayout::Portable) => {
            [PROG_SCHED_SWITCH, PROG_SCHED_WAKEUP, PROG_SCHED_WAKEUP_NEW]
        }
    };
    match event {
        "sched_switch" => switch,
        "sched_wakeup" => wakeup,
        _ => wakeup_new,
    }
}

/// The always-on (off-CPU accounting) sched_waking program. Its one
/// field, `pid`, sits where sched_wakeup's does (one template), so the
/// always-on layout applies.
fn offcpu_waking_program(kind: SchedPrograms, layout: TracepointLayout) -> &'static str {
    match (kind, layout) {
        (SchedPrograms::Btf, _) => names::PROG_OFFCPU_WAKING_BTF,
        (SchedPrograms::Classic, TracepointLayout::Fixed) => names::PROG_OFFCPU_WAKING_FIXED,
        (SchedPrograms::Classic, TracepointLayout::Portable) => names::PROG_OFFCPU_WAKING,
    }
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

/// How the always-on scheduler programs (sched_switch, sched_wakeup,
/// sched_wakeup_new) are attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchedPrograms {
    /// BTF raw tracepoints (tp_btf, Linux 5.5+ with CONFIG_DEBUG_INFO_BTF):
    /// the program gets the tracepoint's arguments as they are, without
    /// the perf buffer record a classic tracepoint fills first, and it is
    /// not skipped while user space sits in a bpf() syscall.
    Btf,
    /// Classic tracepoints, in `Accounting::layout`'s variant; the only
    /// kind Android's bpfloader attaches.
    Classic,
}

/// How `Accounting::read` walks the hashes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MapRead {
    /// BPF_MAP_LOOKUP_BATCH (Linux 5.6+).
    Batch,
    /// aya's iterator: get_next_key + lookup per entry.
    Iterate,
}

/// The sched_waking program in `layout`.
pub(super) fn waking_program(layout: TracepointLayout) -> &'static str {
    match layout {
        TracepointLayout::Fixed => names::PROG_SCHED_WAKING_FIXED,
        TracepointLayout::Portable => names::PROG_SCHED_WAKING,
    }
}

/// Pin names follow bpfloader's scheme, `prog_<object>_<program>` and
/// `map_<object>_<map>`, with object name `vitals`.
pub fn pinned_prog_path(dir: &Path, prog: &str) -> PathBuf {
    dir.join(format!("prog_vitals_{prog}"))
}

/// The pin bpfloader gives a program of `cargo xtask android-bpf`'s
/// `vitals.o`: `prog_vitals_<section, '/' -> '_'>` (AOSP Loader.cpp), so
/// named after the tracepoint, not the function. Keep in step with
/// `xtask/src/android_bpf.rs` PROGRAMS.
pub fn bpfloader_prog_path(dir: &Path, prog: &str) -> Option<PathBuf> {
    let section = match prog {
        names::PROG_SCHED_SWITCH_FIXED => "tracepoint_sched_sched_switch",
        names::PROG_SCHED_WAKEUP_FIXED => "tracepoint_sched_sched_wakeup",
        names::PROG_SCHED_WAKEUP_NEW_FIXED => "tracepoint_sched_sched_wakeup_new",
        names::PROG_SCHED_PROCESS_FREE => "tracepoint_sched_sched_process_free",
        names::PROG_PAGE_FAULT_USER => "tracepoint_exceptions_page_fault_user",
        names::PROG_PERF_MINFLT => "perf_event_minflt",
        names::PROG_PERF_MAJFLT => "perf_event_majflt",
        names::PROG_SCHED_WAKING_FIXED => "tracepoint_sched_sched_waking",
        _ => return None,
    };
    Some(dir.join(format!("prog_vitals_{section}")))
}

/// Where to look for a pinned program: bpfloader's name first, then the
/// `vitalsd pin` name.
pub(super) fn pinned_prog_candidates(dir: &Path, prog: &str) -> Vec<PathBuf> {
    bpfloader_prog_path(dir, prog)
        .into_iter()
        .chain([pinned_prog_path(dir, prog)])
        .collect()
}

pub fn pinned_map_path(dir: &Path, map: &str) -> PathBuf {
    dir.join(format!("map_vitals_{map}"))
}

/// The maps the always-on path reads.
pub(super) const ACCOUNTING_MAPS: [&str; 8] = [
    names::TASKS,
    names::PROCESS_FAULTS,
    names::EXITED,
    names::CPU_STATE,
    names::DROPS,
    names::TASKS_BY_TID,
    names::FAULTS_BY_TGID,
    names::EXITED_RING,
];

/// The maps a capture reads or writes besides the ring buffer.
pub(super) const CAPTURE_MAPS: [&str; 3] =
    [names::CAPTURE, names::CAPTURE_LOST, names::CAPTURE_STACKS];

/// The capture transport in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventTransport {
    /// BPF_MAP_TYPE_RINGBUF: one buffer shared by all CPUs, no wakeups.
    RingBuf,
    /// BPF_MAP_TYPE_PERF_EVENT_ARRAY: one perf buffer per CPU.
    PerfArray,
}

impl EventTransport {
    pub fn name(self) -> &'static str {
        match self {
            EventTransport::RingBuf => "ringbuf",
            EventTransport::PerfArray => "perf_event_array",
        }
    }

    pub(crate) fn rodata(self) -> u32 {
        match self {
            EventTransport::RingBuf => capture::TRANSPORT_RINGBUF,
            EventTransport::PerfArray => capture::TRANSPORT_PERF_ARRAY,
        }
    }

    /// The transport for `choice` (None: no capture configured) on a
    /// kernel with or without the ring buffer map.
    pub(crate) fn choose(
        choice: Option<EventTransportChoice>,
        ringbuf_ok: bool,
    ) -> Result<Self, BpfError> {
        match (choice, ringbuf_ok) {
            (Some(EventTransportChoice::PerfArray), _) | (_, false) => {
                if choice == Some(EventTransportChoice::RingBuf) {
                    return Err(BpfError::NoRingBuf);
                }
                Ok(EventTransport::PerfArray)
            }
            _ => Ok(EventTransport::RingBuf),
        }
    }
}

/// max_entries of CAPTURE_EVENTS, CAPTURE_STACKS, CAPTURE_FAULT_CTR,
/// OFFCPU_START and OFFCPU_AWAIT_USER.
/// Without a capture configured (`sizing` None) the capture maps take
/// their minimum size, so the always-on tier's memory does not grow.
pub(crate) fn capture_map_sizes(
    sizing: Option<EventSizing>,
    transport: EventTransport,
    ringbuf_ok: bool,
    page: u32,
) -> [(&'static str, u32); 5] {
    // The ring buffer goes unused with the perf array: minimum.
    let ring_bytes = match (sizing, transport, ringbuf_ok) {
        (_, _, false) => 1,
        (Some(c), EventTransport::RingBuf, _) => c.ring_bytes.max(page).next_power_of_two(),
        _ => page,
    };
    [
        (names::CAPTURE_EVENTS, ring_bytes),
        (
            names::CAPTURE_STACKS,
            sizing.map_or(1, |c| c.stack_entries.max(1)),
        ),
        (
            names::CAPTURE_FAULT_CTR,
            sizing.map_or(1, |c| c.fault_processes.max(1)),
        ),
        // Blocked threads of watched processes waiting for their waking,
        // at once (LRU): bounded like the processes the fault sampler
        // tracks, about 64 bytes an entry.
        (
            names::OFFCPU_START,
            sizing.map_or(1, |c| c.fault_processes.max(1)),
        ),
        // Threads whose long block's user stack waits for their syscall's
        // return (LRU; ~64 bytes an entry), each from its waking until it
        // runs again: a quarter of the blocked ones.
        (
            names::OFFCPU_AWAIT_USER,
            sizing.map_or(1, |c| (c.fault_processes / 4).max(1)),
        ),
    ]
}

/// Data pages of each CPU's perf buffer: `ring_bytes` split over the CPUs,
/// rounded down to a power of two (perf wants one), at least one page.
pub fn perf_pages_per_cpu(ring_bytes: u32, page: u32, cpus: usize) -> usize {
    let per_cpu = (ring_bytes as usize / cpus.max(1) / page.max(1) as usize).max(1);
    1 << per_cpu.ilog2()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perf_buffers_split_the_ring_bytes_in_powers_of_two_pages() {
        assert_eq!(perf_pages_per_cpu(8 << 20, 4096, 2), 1024);
        assert_eq!(perf_pages_per_cpu(8 << 20, 4096, 3), 512);
        assert_eq!(perf_pages_per_cpu(4096, 4096, 2), 1);
        assert_eq!(perf_pages_per_cpu(0, 4096, 0), 1);
    }

    #[test]
    fn bpfloader_names_come_first_and_vitalsd_pin_names_still_work() {
        let dir = Path::new("/sys/fs/bpf");
        assert_eq!(
            pinned_prog_candidates(dir, names::PROG_SCHED_SWITCH_FIXED),
            [
                dir.join("prog_vitals_tracepoint_sched_sched_switch"),
                dir.join("prog_vitals_sched_switch_fixed"),
            ]
        );
        assert_eq!(
            pinned_prog_candidates(dir, names::PROG_PERF_MINFLT)[0],
            dir.join("prog_vitals_perf_event_minflt")
        );
        // Portable programs are not in the bpfloader object.
        assert_eq!(
            pinned_prog_candidates(dir, names::PROG_SCHED_SWITCH),
            [dir.join("prog_vitals_sched_switch")]
        );
    }
}
