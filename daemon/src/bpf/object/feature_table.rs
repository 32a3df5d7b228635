//! `Feature` is the one table of what vitalsd uses that a kernel may lack:
//! the kernel release that introduced it, how it is probed, and what
//! happens below it (a fallback, or the feature refused with a log line
//! naming it and that release: never a silent zero). The decision is the
//! probe's (`bpf::features`), not the version's; the version is
//! documentation, and README.md and docs/android.md carry the same rows
//! (`markdown_table`, checked by a test). The floor is Linux 5.10 (Android
//! GKI 5.10): everything the always-on programs need is in it.

use std::fmt::Display;

use super::super::BpfError;

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
                "tp_btf sched_switch in a known prototype (`prev_state` last since 5.18; before, prev's state read from the task)",
                "5.5",
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

    pub(crate) fn unsupported(self, why: &str) -> BpfError {
        BpfError::Unsupported(self.missing_message(why))
    }
}

/// Logs that `feature` is missing and what is done instead. A fallback
/// is info; a feature refused is a warning.
pub(crate) fn log_missing(feature: Feature, why: impl Display) {
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
            ("README.md", include_str!("../../../../README.md")),
            (
                "docs/android.md",
                include_str!("../../../../docs/android.md"),
            ),
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
