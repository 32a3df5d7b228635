//! Pinned objects on a bpffs: the pin names (bpfloader's `prog_vitals_*`
//! and `map_vitals_*` scheme, and the names `vitalsd pin` gives), and
//! attaching the programs bpfloader pinned, the only way in on Android user
//! builds (`PinMode::AttachFrom`), the capture tier included when pinned.

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
    capture_maps::{waking_program, IdleTransport},
    features::{log_missing, Feature},
    map_err,
    tracefs::Tracefs,
    Accounting, AccountingConfig, BpfError, CaptureSizing, CaptureTransport,
    CaptureTransportChoice, FaultSource, FaultSourceChoice, Features, MapRead, SchedPrograms,
    TracepointLayout,
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
        names::PROG_SCHED_WAKING_FIXED => "tracepoint_sched_sched_waking",
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
    /// loader gave them, the capture tier's too: it is there when the
    /// loader pinned it (`PinnedCapture`), whatever `cfg.capture` asks.
    pub(super) fn attach_pinned(cfg: &AccountingConfig, dir: &Path) -> Result<Self, BpfError> {
        let tracefs = Tracefs::find_or_mount()?;
        let features = Features::probe(&tracefs)?;
        let mut pinned_maps = open_pinned_maps(dir, &ACCOUNTING_MAPS)?;
        let mut pins = PinnedAttach {
            dir,
            programs: Vec::new(),
        };
        let (layout, runq_wait) = pins.attach_sched()?;
        let fault_source = pins.attach_faults(cfg.fault_source, &features)?;
        let capture = PinnedCapture::open(dir);
        log::info!(
            "eBPF accounting attached from pins in {}: fault source {}; {:?} tracepoint layout; runqueue wait {}; capture tier {}",
            dir.display(),
            fault_source.describe(),
            layout,
            if runq_wait { "on" } else { "off (no pinned wakeup programs)" },
            match &capture {
                Ok(c) => format!(
                    "pinned (ring buffer {} KiB, {} stacks)",
                    c.sizing.ring_bytes >> 10,
                    c.sizing.stack_entries
                ),
                Err(why) => format!("unavailable: {why}"),
            }
        );
        let capture = capture.ok();
        // Without a pinned capture tier nothing attaches sched_waking: its
        // layout is then the always-on programs'.
        let (capture_sizing, ring, pinned_waking, waking_layout) = match capture {
            Some(c) => {
                pinned_maps.extend(c.maps);
                (
                    Some(c.sizing),
                    Some(c.ring),
                    Some(c.waking),
                    c.waking_layout,
                )
            }
            None => (None, None, None, layout),
        };
        Ok(Self {
            ebpf: None,
            pinned_maps,
            pinned_programs: pins.programs,
            fault_source,
            features,
            limits: cfg.limits,
            layout,
            // The pinned sched_waking's own: bpfloader's vitals.o carries
            // sched_waking_fixed; `vitalsd pin` pins the one load.rs chose.
            waking_layout,
            sched_programs: SchedPrograms::Classic,
            runq_wait,
            capture_sizing,
            transport: CaptureTransport::RingBuf,
            ring,
            capture_lent: false,
            pinned_waking,
            waking_link: None,
            map_read: MapRead::Batch,
        })
    }
}

/// The maps a capture reads or writes besides the ring buffer.
const CAPTURE_MAPS: [&str; 3] = [names::CAPTURE, names::CAPTURE_LOST, names::CAPTURE_STACKS];

/// The capture tier as pinned: its maps, the ring buffer and sched_waking
/// (bpfloader's vitals.o carries them, sized in `xtask/src/android_bpf.rs`;
/// `vitalsd pin` pins them). Only with a ring buffer: pinned programs
/// cannot say which transport their frozen settings chose, and
/// bpfloader's object, which needs 5.8, folds it to the ring buffer.
struct PinnedCapture {
    maps: HashMap<&'static str, aya::maps::Map>,
    ring: IdleTransport,
    waking: TracePoint,
    /// The layout of the pinned sched_waking (`waking`).
    waking_layout: TracepointLayout,
    sizing: CaptureSizing,
}

impl PinnedCapture {
    /// Err: why captures are not available from these pins.
    fn open(dir: &Path) -> Result<Self, String> {
        // sched_waking in whichever layout is pinned, fixed first (the
        // only one bpfloader's vitals.o has), as sched_switch.
        let (waking_layout, waking) = [TracepointLayout::Fixed, TracepointLayout::Portable]
            .into_iter()
            .find_map(|layout| {
                pinned_prog_candidates(dir, waking_program(layout))
                    .into_iter()
                    .find_map(|p| TracePoint::from_pin(p).ok())
                    .map(|prog| (layout, prog))
            })
            .ok_or("no pinned sched_waking program")?;
        let maps = open_pinned_maps(dir, &CAPTURE_MAPS).map_err(|e| e.to_string())?;
        let events = open_pinned_maps(dir, &[names::CAPTURE_EVENTS]).map_err(|e| e.to_string())?;
        let Some(aya::maps::Map::RingBuf(data)) = events.into_values().next() else {
            return Err(format!(
                "pinned {} is not a ring buffer",
                names::CAPTURE_EVENTS
            ));
        };
        let entries = |m: &MapData| m.info().map(|i| i.max_entries()).unwrap_or(0);
        let stack_entries = match maps.get(names::CAPTURE_STACKS) {
            Some(aya::maps::Map::StackTraceMap(m)) => entries(m),
            _ => 0,
        };
        let sizing = CaptureSizing {
            ring_bytes: entries(&data),
            stack_entries,
            fault_processes: MapData::from_pin(pinned_map_path(dir, names::CAPTURE_FAULT_CTR))
                .map_or(0, |m| entries(&m)),
            transport: CaptureTransportChoice::RingBuf,
        };
        Ok(Self {
            maps,
            ring: IdleTransport::Ring(data),
            waking,
            waking_layout,
            sizing,
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

/// The pinned maps `names` (e.g. `ACCOUNTING_MAPS`, what the always-on
/// path reads).
fn open_pinned_maps(
    dir: &Path,
    names: &[&'static str],
) -> Result<HashMap<&'static str, aya::maps::Map>, BpfError> {
    let mut pinned_maps = HashMap::new();
    for &name in names {
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
