//! Pinned objects on a bpffs: the pin names (bpfloader's `prog_vitals_*`
//! and `map_vitals_*` scheme, and the names `vitalsd pin` gives), and
//! attaching the programs bpfloader pinned, the only way in on Android user
//! builds (`PinMode::AttachFrom`).

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
};

use aya::{
    maps::MapData,
    programs::{perf_event::SoftwareEvent, PerfEvent, TracePoint},
    Ebpf,
};
use vitals_common::names;

use super::{
    attach_err,
    features::{log_missing, Feature},
    map_err,
    tracefs::Tracefs,
    Accounting, AccountingConfig, BpfError, CaptureTransport, FaultSource, FaultSourceChoice,
    Features, MapRead, SchedPrograms, TracepointLayout,
};

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
        _ => return None,
    };
    Some(dir.join(format!("prog_vitals_{section}")))
}

/// Where to look for a pinned program: bpfloader's name first, then the
/// `vitalsd pin` name.
fn pinned_prog_candidates(dir: &Path, prog: &str) -> Vec<PathBuf> {
    bpfloader_prog_path(dir, prog)
        .into_iter()
        .chain([pinned_prog_path(dir, prog)])
        .collect()
}

pub fn pinned_map_path(dir: &Path, map: &str) -> PathBuf {
    dir.join(format!("map_vitals_{map}"))
}

/// The maps the always-on path reads.
const ACCOUNTING_MAPS: [&str; 5] = [
    names::TASKS,
    names::PROCESS_FAULTS,
    names::EXITED,
    names::CPU_STATE,
    names::DROPS,
];

/// Held for its links: dropping a program detaches what it attached.
#[allow(dead_code)]
pub(super) enum PinnedProgram {
    TracePoint(TracePoint),
    Perf(PerfEvent),
}

impl Accounting {
    /// Attaches the programs pinned in `dir` and opens the pinned maps.
    /// Their load-time settings (field offsets, map sizes) are whatever the
    /// loader gave them; the capture tier is not available this way.
    pub(super) fn attach_pinned(cfg: &AccountingConfig, dir: &Path) -> Result<Self, BpfError> {
        let tracefs = Tracefs::find_or_mount()?;
        let features = Features::probe(&tracefs)?;
        let pinned_maps = open_pinned_maps(dir)?;
        let mut pins = PinnedAttach {
            dir,
            programs: Vec::new(),
        };
        let (layout, runq_wait) = pins.attach_sched()?;
        let fault_source = pins.attach_faults(cfg.fault_source, &features)?;
        log::info!(
            "eBPF accounting attached from pins in {}: fault source {}; {:?} tracepoint layout; runqueue wait {}",
            dir.display(),
            fault_source.describe(),
            layout,
            if runq_wait { "on" } else { "off (no pinned wakeup programs)" }
        );
        Ok(Self {
            ebpf: None,
            pinned_maps,
            pinned_programs: pins.programs,
            fault_source,
            features,
            limits: cfg.limits,
            layout,
            // Pinned captures are not driven yet; when they are, the
            // pinned sched_waking's layout is judged like load.rs does.
            waking_layout: layout,
            sched_programs: SchedPrograms::Classic,
            runq_wait,
            capture_sizing: None,
            transport: CaptureTransport::RingBuf,
            ring: None,
            waking_link: None,
            map_read: MapRead::Batch,
        })
    }
}

/// Pins every map of `ebpf` in `dir` under bpfloader's names (`PinMode::PinTo`).
pub(super) fn pin_maps(ebpf: &Ebpf, dir: &Path) -> Result<(), BpfError> {
    // Internal maps (.rodata, .bss) stay with the programs that use
    // them; bpffs refuses names with a '.' anyway.
    for (name, map) in ebpf.maps().filter(|(n, _)| !n.starts_with('.')) {
        let path = pinned_map_path(dir, name);
        map.pin(&path).map_err(|e| BpfError::Pin {
            path: path.clone(),
            message: e.to_string(),
        })?;
    }
    log::info!(
        "eBPF programs and maps pinned in {} (not attached)",
        dir.display()
    );
    Ok(())
}

/// The pinned maps the always-on path reads (`ACCOUNTING_MAPS`).
fn open_pinned_maps(dir: &Path) -> Result<HashMap<&'static str, aya::maps::Map>, BpfError> {
    let mut pinned_maps = HashMap::new();
    for name in ACCOUNTING_MAPS {
        let path = pinned_map_path(dir, name);
        let data = MapData::from_pin(&path).map_err(map_err(name))?;
        pinned_maps.insert(
            name,
            aya::maps::Map::from_map_data(data).map_err(map_err(name))?,
        );
    }
    Ok(pinned_maps)
}

/// Attaching the programs pinned in `dir`. Each one attached is kept in
/// `programs`: dropping it would detach it.
struct PinnedAttach<'a> {
    dir: &'a Path,
    programs: Vec<PinnedProgram>,
}

impl PinnedAttach<'_> {
    /// The tracepoint program `name` pinned under either name.
    fn open(&self, name: &str) -> Option<TracePoint> {
        pinned_prog_candidates(self.dir, name)
            .into_iter()
            .find_map(|p| TracePoint::from_pin(p).ok())
    }

    fn attach(
        &mut self,
        mut prog: TracePoint,
        name: &'static str,
        cat: &str,
        ev: &str,
    ) -> Result<(), BpfError> {
        prog.attach(cat, ev)
            .map_err(attach_err(name, format!("tracepoint {cat}/{ev} (pinned)")))?;
        self.programs.push(PinnedProgram::TracePoint(prog));
        Ok(())
    }

    /// sched_switch in whichever layout is pinned (fixed first), the two
    /// wakeup programs if both are pinned, and sched_process_free. Returns
    /// the layout and whether runqueue wait is measured.
    fn attach_sched(&mut self) -> Result<(TracepointLayout, bool), BpfError> {
        let (layout, switch, wakeup, wakeup_new) =
            if let Some(p) = self.open(names::PROG_SCHED_SWITCH_FIXED) {
                (
                    TracepointLayout::Fixed,
                    p,
                    names::PROG_SCHED_WAKEUP_FIXED,
                    names::PROG_SCHED_WAKEUP_NEW_FIXED,
                )
            } else if let Some(p) = self.open(names::PROG_SCHED_SWITCH) {
                (
                    TracepointLayout::Portable,
                    p,
                    names::PROG_SCHED_WAKEUP,
                    names::PROG_SCHED_WAKEUP_NEW,
                )
            } else {
                return Err(BpfError::Missing("pinned sched_switch program"));
            };
        self.attach(switch, names::PROG_SCHED_SWITCH, "sched", "sched_switch")?;
        let runq_wait = match (self.open(wakeup), self.open(wakeup_new)) {
            (Some(w), Some(wn)) => {
                self.attach(w, names::PROG_SCHED_WAKEUP, "sched", "sched_wakeup")?;
                self.attach(
                    wn,
                    names::PROG_SCHED_WAKEUP_NEW,
                    "sched",
                    "sched_wakeup_new",
                )?;
                true
            }
            _ => false,
        };
        let free = self
            .open(names::PROG_SCHED_PROCESS_FREE)
            .ok_or(BpfError::Missing("pinned sched_process_free program"))?;
        self.attach(
            free,
            names::PROG_SCHED_PROCESS_FREE,
            "sched",
            "sched_process_free",
        )?;
        Ok((layout, runq_wait))
    }

    /// The page-fault tracepoint where it is pinned, the kernel has it and
    /// `choice` allows it; else the pinned perf programs; else none.
    fn attach_faults(
        &mut self,
        choice: FaultSourceChoice,
        features: &Features,
    ) -> Result<FaultSource, BpfError> {
        let fault_tp = self
            .open(names::PROG_PAGE_FAULT_USER)
            .filter(|_| features.page_fault_user_tracepoint);
        if choice == FaultSourceChoice::Off {
            Ok(FaultSource::None)
        } else if let (Some(p), false) = (fault_tp, choice == FaultSourceChoice::PerfEvent) {
            self.attach(
                p,
                names::PROG_PAGE_FAULT_USER,
                "exceptions",
                "page_fault_user",
            )?;
            Ok(FaultSource::Tracepoint)
        } else {
            let before = self.programs.len();
            match self.attach_perf_faults() {
                // As Accounting::load: perf events refused under `auto`
                // cost the fault accounting, not the accounting.
                Err(e @ BpfError::Attach { .. }) if choice == FaultSourceChoice::Auto => {
                    // Dropping a program detaches what it attached.
                    self.programs.truncate(before);
                    log_missing(Feature::PerfFaultEvents, e);
                    Ok(FaultSource::None)
                }
                r => r,
            }
        }
    }

    /// The pinned minflt and majflt programs, each on a perf software event
    /// per online CPU; `PerfEvent` if either is pinned.
    fn attach_perf_faults(&mut self) -> Result<FaultSource, BpfError> {
        let cpus = crate::system::online_cpus(Path::new("/sys"))?;
        let mut found = false;
        for (name, event) in [
            (names::PROG_PERF_MINFLT, SoftwareEvent::PageFaultsMin),
            (names::PROG_PERF_MAJFLT, SoftwareEvent::PageFaultsMaj),
        ] {
            let Some(mut prog) = pinned_prog_candidates(self.dir, name)
                .into_iter()
                .find_map(|p| PerfEvent::from_pin(p).ok())
            else {
                continue;
            };
            super::load::attach_perf_on_cpus(&mut prog, name, event, &cpus, " (pinned)")?;
            self.programs.push(PinnedProgram::Perf(prog));
            found = true;
        }
        Ok(if found {
            FaultSource::PerfEvent
        } else {
            FaultSource::None
        })
    }
}

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
