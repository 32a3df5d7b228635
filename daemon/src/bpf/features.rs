//! What this kernel offers the accounting programs, probed before loading:
//! `Features` (kernel BTF, the page-fault tracepoint, the release), the
//! tracepoints vitalsd cannot run without, BPF_MAP_TYPE_RINGBUF, global
//! data and helpers, pid_max and the possible CPUs. What each probe's
//! answer means, and what vitalsd does below it, is the pure table in
//! `object::feature_table`.
//!
//! `Features::probe` runs on both paths, loading with aya and attaching
//! bpfloader's pins, so it only looks at files. Probes that need a bpf()
//! syscall (`ringbuf_map_supported` creates a map) belong to the load path
//! alone: on Android user builds `map_create` is bpfloader's
//! (sepolicy/vitalsd.te grants it only in userdebug_or_eng).

use std::path::Path;

use aya::{
    maps::MapType,
    programs::ProgramType,
    sys::{is_helper_supported, BpfHelper},
};

use super::{object::feature_table::Feature, tracefs::Tracefs, BpfError};

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

/// Refuses the load, naming the feature and the kernel that introduced it,
/// when the kernel lacks something every program needs (rows whose `below`
/// is a refusal of the load). Probes with bpf(): the load path only.
pub(super) fn require_program_features() -> Result<(), BpfError> {
    // aya probed this when it started (a frozen read-only array map).
    if !aya::features().bpf_global_data() {
        return Err(Feature::GlobalData.unsupported("no read-only array map with freeze"));
    }
    match is_helper_supported(
        ProgramType::TracePoint,
        BpfHelper::BPF_FUNC_ktime_get_boot_ns,
    ) {
        Ok(true) => Ok(()),
        Ok(false) => {
            Err(Feature::KtimeGetBootNs
                .unsupported("a tracepoint program calling it does not verify"))
        }
        // The probe itself failed (e.g. a policy refusing the load): let the
        // real load report what is wrong.
        Err(e) => {
            log::debug!("probing bpf_ktime_get_boot_ns: {e}");
            Ok(())
        }
    }
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
