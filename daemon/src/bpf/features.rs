//! What this kernel offers the accounting programs, probed before loading:
//! `Features` (kernel BTF, the page-fault tracepoint, the release), the
//! tracepoints vitalsd cannot run without, BPF_MAP_TYPE_RINGBUF, pid_max
//! and the possible CPUs; and the two kernel-dependent kinds of scheduler
//! program the probes choose between (`TracepointLayout`, `SchedPrograms`).
//!
//! `Features::probe` runs on both paths, loading with aya and attaching
//! bpfloader's pins, so it only looks at files. Probes that need a bpf()
//! syscall (`ringbuf_map_supported` creates a map) belong to the load path
//! alone: on Android user builds `map_create` is bpfloader's
//! (sepolicy/vitalsd.te grants it only in userdebug_or_eng).

use std::path::Path;

use aya::maps::MapType;

use super::{tracefs::Tracefs, BpfError};

/// The kernel's BTF, which tp_btf programs and `btf::task_struct_offsets`
/// read (CONFIG_DEBUG_INFO_BTF).
pub(super) const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

/// Tracepoints the accounting cannot do without, as (category, event,
/// path for the error).
const REQUIRED_TRACEPOINTS: [(&str, &str, &str); 2] = [
    ("sched", "sched_switch", "sched/sched_switch"),
    ("sched", "sched_process_free", "sched/sched_process_free"),
];

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
            btf_vmlinux: Path::new(VMLINUX_BTF).exists(),
            page_fault_user_tracepoint: tracefs.has_event("exceptions", "page_fault_user"),
            kernel_release: crate::system::utsname()?.release,
        })
    }
}

/// Fails naming the first of `REQUIRED_TRACEPOINTS` this kernel lacks.
pub(super) fn require_tracepoints(tracefs: &Tracefs) -> Result<(), BpfError> {
    for (cat, name, path) in REQUIRED_TRACEPOINTS {
        if !tracefs.has_event(cat, name) {
            return Err(BpfError::NoTracepoint(path));
        }
    }
    Ok(())
}

/// Can this kernel create a BPF_MAP_TYPE_RINGBUF (Linux 5.8+)? aya asks by
/// creating one. `assume_no` answers no without asking, for tests of the
/// perf-array path.
pub(super) fn ringbuf_map_supported(assume_no: bool) -> bool {
    !assume_no && aya::sys::is_map_supported(MapType::RingBuf).unwrap_or(false)
}

/// pid_max, or u32::MAX if it does not parse; its size decides where
/// wakeup times go (see `WAKE_ARRAY_MAX_PIDS`).
pub(super) fn read_pid_max() -> Result<u32, BpfError> {
    let path = "/proc/sys/kernel/pid_max";
    let text = std::fs::read_to_string(path).map_err(|source| {
        BpfError::System(crate::system::SystemError::Read {
            path: path.into(),
            source,
        })
    })?;
    Ok(text.trim().parse().unwrap_or(u32::MAX))
}

/// The possible CPUs, which size every per-CPU map value.
pub(super) fn possible_cpu_count() -> Result<usize, BpfError> {
    aya::util::nr_cpus().map_err(|(path, source)| {
        BpfError::System(crate::system::SystemError::Read {
            path: path.into(),
            source,
        })
    })
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
