//! What this kernel offers the accounting programs, probed before loading:
//! `Features` (kernel BTF, the page-fault tracepoint, the release), the
//! tracepoints vitalsd cannot run without, BPF_MAP_TYPE_RINGBUF, global
//! data and helpers, pid_max and the possible CPUs; and the two
//! kernel-dependent kinds of scheduler program the probes choose between
//! (`TracepointLayout`, `SchedPrograms`).
//!
//! `Feature` is the one table of what vitalsd uses that a kernel may lack:
//! the kernel release that introduced it, how it is probed, and what
//! happens below it (a fallback, or the feature refused with a log line
//! naming it and that release: never a silent zero). The decision is the
//! probe's, not the version's; the version is documentation, and README.md
//! and docs/android.md carry the same rows (`markdown_table`, checked by
//! a test). The floor is Linux 5.10 (Android GKI 5.10): everything the
//! always-on programs need is in it.
//!
//! `Features::probe` runs on both paths, loading with aya and attaching
//! bpfloader's pins, so it only looks at files. Probes that need a bpf()
//! syscall (`ringbuf_map_supported` creates a map) belong to the load path
//! alone: on Android user builds `map_create` is bpfloader's
//! (sepolicy/vitalsd.te grants it only in userdebug_or_eng).

use std::{fmt::Display, path::Path};

use aya::{
    maps::MapType,
    programs::ProgramType,
    sys::{is_helper_supported, BpfHelper},
};

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

/// What vitalsd uses that a kernel may lack. The order is `Feature::ALL`,
/// the table's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feature {
    GlobalData,
    KernelBtf,
    BatchLookup,
    RingBuf,
    KtimeGetBootNs,
    BtfSchedSwitch,
    PageFaultTracepoint,
    PerfFaultEvents,
}

/// One row of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FeatureRow {
    pub name: &'static str,
    /// The kernel release that introduced it (documentation: the probe
    /// decides).
    pub min_kernel: &'static str,
    pub probe: &'static str,
    /// What vitalsd does where the probe says no.
    pub below: &'static str,
}

impl Feature {
    pub const ALL: [Feature; 8] = [
        Feature::GlobalData,
        Feature::KernelBtf,
        Feature::BatchLookup,
        Feature::RingBuf,
        Feature::KtimeGetBootNs,
        Feature::BtfSchedSwitch,
        Feature::PageFaultTracepoint,
        Feature::PerfFaultEvents,
    ];

    pub const fn row(self) -> FeatureRow {
        let (name, min_kernel, probe, below) = match self {
            Feature::GlobalData => (
                "global data (`.rodata` load-time settings)",
                "5.2",
                "aya's probe: a frozen read-only array map",
                "refused: vitalsd does not load (every program reads its settings there)",
            ),
            Feature::KernelBtf => (
                "kernel BTF for tp_btf programs",
                "5.5",
                "`/sys/kernel/btf/vmlinux` exists and parses",
                "classic tracepoints (captures still work)",
            ),
            Feature::BatchLookup => (
                "batched map lookups (BPF_MAP_LOOKUP_BATCH)",
                "5.6",
                "the first batch lookup of TASKS",
                "per-key iteration (get_next_key + lookup)",
            ),
            Feature::RingBuf => (
                "BPF ring buffer (BPF_MAP_TYPE_RINGBUF)",
                "5.8",
                "creating a ring buffer map",
                "captures use a perf event array",
            ),
            Feature::KtimeGetBootNs => (
                "bpf_ktime_get_boot_ns (capture timestamps)",
                "5.8",
                "verifying a tracepoint program that calls it",
                "refused: vitalsd does not load (the scheduler programs call it)",
            ),
            Feature::BtfSchedSwitch => (
                "tp_btf sched_switch with `prev_state` last",
                "5.18",
                "the `btf_trace_sched_switch` prototype in kernel BTF",
                "classic tracepoints",
            ),
            Feature::PageFaultTracepoint => (
                "`exceptions/page_fault_user` tracepoint (x86 only)",
                "3.13",
                "the tracefs event exists",
                "faults counted by perf software events",
            ),
            Feature::PerfFaultEvents => (
                "perf software page-fault events with BPF programs",
                "4.9",
                "perf_event_open of the minor/major fault events and attaching",
                "refused: no fault accounting (logged; fault counters are left out, not zero)",
            ),
        };
        FeatureRow {
            name,
            min_kernel,
            probe,
            below,
        }
    }

    /// The log line for a probe that said no, `why` being what it saw.
    pub fn missing_message(self, why: impl Display) -> String {
        let r = self.row();
        format!(
            "{} (Linux {}+) is not available: {why}; {}",
            r.name, r.min_kernel, r.below
        )
    }

    fn unsupported(self, why: &str) -> BpfError {
        BpfError::Unsupported(self.missing_message(why))
    }
}

/// Logs that `feature` is missing and what is done instead. A fallback
/// is info; a feature refused is a warning.
pub(super) fn log_missing(feature: Feature, why: impl Display) {
    let msg = feature.missing_message(why);
    if feature.row().below.starts_with("refused") {
        log::warn!("{msg}");
    } else {
        log::info!("{msg}");
    }
}

/// The table as the markdown rows README.md and docs/android.md carry
/// between `<!-- kernel-features -->` and `<!-- /kernel-features -->`.
pub fn markdown_table() -> String {
    let mut out =
        String::from("| feature | introduced in | probed by | below it |\n|---|---|---|---|\n");
    for f in Feature::ALL {
        let r = f.row();
        out.push_str(&format!(
            "| {} | {} | {} | {} |\n",
            r.name, r.min_kernel, r.probe, r.below
        ));
    }
    out
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The table between the markers in `doc`.
    fn doc_table(doc: &str) -> String {
        let start = doc
            .find("<!-- kernel-features -->")
            .expect("no <!-- kernel-features --> marker")
            + "<!-- kernel-features -->".len();
        let end = doc[start..]
            .find("<!-- /kernel-features -->")
            .expect("no <!-- /kernel-features --> marker")
            + start;
        doc[start..end].trim_start_matches('\n').to_string()
    }

    #[test]
    fn the_documents_carry_the_code_table() {
        let docs = [
            ("README.md", include_str!("../../../README.md")),
            ("docs/android.md", include_str!("../../../docs/android.md")),
        ];
        let table = markdown_table();
        for (name, text) in docs {
            assert_eq!(
                doc_table(text),
                table,
                "{name}: the kernel feature table differs from bpf/features.rs; it should read:\n{table}"
            );
        }
    }

    #[test]
    fn every_feature_is_a_row_and_names_its_kernel() {
        let table = markdown_table();
        assert_eq!(table.lines().count(), 2 + Feature::ALL.len());
        for f in Feature::ALL {
            let r = f.row();
            assert!(table.contains(r.name));
            let msg = f.missing_message("probe said no");
            assert!(
                msg.contains(r.name) && msg.contains(&format!("Linux {}+", r.min_kernel)),
                "{msg}"
            );
        }
    }
}
