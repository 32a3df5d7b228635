//! The object's layout, which needs no kernel: the embedded object, which
//! program serves which event in which layout, which maps each path reads,
//! and the names programs and maps are pinned under on a bpffs
//! (bpfloader's `prog_vitals_*` and `map_vitals_*` scheme, and the names
//! `vitalsd pin` gives).

use std::path::{Path, PathBuf};

use vitals_common::names;

use super::{SchedPrograms, TracepointLayout};

/// The object built from `ebpf-programs/` by build.rs, 8-byte aligned as
/// the ELF parser wants (aya's include_bytes_aligned!).
pub(super) static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(env!("VITALS_EBPF_OBJ"));

/// The program for scheduler `event` ("sched_switch", "sched_wakeup",
/// "sched_wakeup_new").
pub(super) fn sched_program(
    kind: SchedPrograms,
    layout: TracepointLayout,
    event: &str,
) -> &'static str {
    use names::*;
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
pub(super) const ACCOUNTING_MAPS: [&str; 5] = [
    names::TASKS,
    names::PROCESS_FAULTS,
    names::EXITED,
    names::CPU_STATE,
    names::DROPS,
];

/// The maps a capture reads or writes besides the ring buffer.
pub(super) const CAPTURE_MAPS: [&str; 3] =
    [names::CAPTURE, names::CAPTURE_LOST, names::CAPTURE_STACKS];

#[cfg(test)]
mod pin_name_tests {
    use super::*;

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
