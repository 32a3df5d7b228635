//! Attaching the programs bpfloader pinned on a bpffs, the only way in on
//! Android user builds (`PinMode::AttachFrom`), the capture tier included
//! when pinned. The pin names are `object`'s.

use std::{collections::HashMap, path::Path};

use aya::{
    maps::MapData,
    programs::{perf_event::SoftwareEvent, PerfEvent, TracePoint},
};
use vitals_common::names;

use super::{
    super::stale::StaleSweep,
    super::{
        attach_err, map_err,
        object::{
            feature_table::{log_missing, Feature},
            pinned_map_path, pinned_prog_candidates, waking_program, EventTransport, MapRead,
            SchedPrograms, TracepointLayout, ACCOUNTING_MAPS, CAPTURE_MAPS,
        },
        tracefs::Tracefs,
        AccountingConfig, BpfError, EventSizing, EventTransportChoice, FaultSource,
        FaultSourceChoice, Features,
    },
    attach::attach_perf_on_cpus,
    capture_tier::{IdleTransport, TransportSlot},
    free_misses::FreeMisses,
    Accounting,
};

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
        if let Some(why) = tids_past_the_array(&pinned_maps) {
            log::warn!("{why}");
        }
        let mut pins = PinnedAttach {
            dir,
            programs: Vec::new(),
            free_misses: FreeMisses::default(),
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
            wait_from_kernel: false,
            // bpfloader's vitals.o has no off-CPU program (yet).
            offcpu: None,
            capture_sizing,
            transport: EventTransport::RingBuf,
            slot: TransportSlot {
                idle: ring,
                lent: false,
                // bpfloader's SWITCH_COUNTERS stays empty: its captures
                // mark only the windows `switch_missed` finds.
                switch_counters: Default::default(),
                // bpfloader's copy has the plain capture maps, sized at boot.
                per_capture: None,
            },
            pinned_waking,
            waking_link: None,
            // tp_btf only; bpfloader's programs are classic.
            switch_in: None,
            switch_in_link: None,
            map_read: MapRead::Batch,
            mapped: Default::default(),
            free_misses: pins.free_misses,
            stale: StaleSweep::for_this_host(),
        })
    }
}

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
    sizing: EventSizing,
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
        let mut maps = open_pinned_maps(dir, &CAPTURE_MAPS).map_err(|e| e.to_string())?;
        // Optional: an object pinned before off-CPU captures has none, and
        // its capture tier works without them (no FLAG_OFFCPU code).
        if let Ok(offcpu) = open_pinned_maps(dir, &[names::OFFCPU_START]) {
            maps.extend(offcpu);
        }
        // Optional the same way: without it a capture can watch every
        // thread only (`events::transport::watch_tgids` says so).
        if let Ok(watch) = open_pinned_maps(dir, &[names::OFFCPU_WATCH]) {
            maps.extend(watch);
        }
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
        let sizing = EventSizing {
            ring_bytes: entries(&data),
            stack_entries,
            fault_processes: MapData::from_pin(pinned_map_path(dir, names::CAPTURE_FAULT_CTR))
                .map_or(0, |m| entries(&m)),
            transport: EventTransportChoice::RingBuf,
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

/// What this kernel's pid_max costs with the pinned maps, when they cover
/// fewer tids: bpfloader's vitals.o is sized at build time for a phone's
/// pid_max (`PHONE_PID_MAX`, xtask/src/android_bpf/mod.rs), and a tid past
/// TASKS_BY_TID falls back to the small TASKS hash.
fn tids_past_the_array(maps: &HashMap<&'static str, aya::maps::Map>) -> Option<String> {
    let entries = |name| match maps.get(name) {
        Some(aya::maps::Map::Array(m) | aya::maps::Map::HashMap(m)) => {
            m.info().ok().map(|i| i.max_entries())
        }
        _ => None,
    };
    let covered = entries(names::TASKS_BY_TID)?;
    let fallback = entries(names::TASKS)?;
    match super::super::features::read_pid_max() {
        Ok(pid_max) => tid_coverage_warning(covered, fallback, pid_max),
        // Android's policy may not grant reading it: say what is covered.
        Err(e) => {
            log::info!(
                "{e}: cannot tell whether the pinned {} (tids below {covered}) covers every tid",
                names::TASKS_BY_TID
            );
            None
        }
    }
}

fn tid_coverage_warning(covered: u32, fallback: u32, pid_max: u32) -> Option<String> {
    (pid_max > covered).then(|| {
        format!(
            "the pinned {} covers tids below {covered} but this kernel's pid_max is {pid_max}: \
             tasks with a tid past it share the {fallback}-entry {} hash, and once that is \
             full their counters are dropped (drops.bpf.tasks_map_full); build vitals.o for \
             this pid_max (PHONE_PID_MAX in xtask/src/android_bpf/mod.rs)",
            names::TASKS_BY_TID,
            names::TASKS,
        )
    })
}

/// Attaching the programs pinned in `dir`. Each one attached is kept in
/// `programs`: dropping it would detach it.
struct PinnedAttach<'a> {
    dir: &'a Path,
    programs: Vec<PinnedProgram>,
    /// The pinned sched_process_free, watched for skipped runs.
    free_misses: FreeMisses,
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
        // bpfloader's programs are classic: skipped under bpf_prog_active.
        if let Ok(fd) = free.fd() {
            self.free_misses = FreeMisses::watch(fd);
        }
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
            attach_perf_on_cpus(&mut prog, name, event, &cpus, " (pinned)")?;
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
mod tests {
    use super::tid_coverage_warning;

    #[test]
    fn a_pid_max_past_the_pinned_tid_array_is_said() {
        // A phone's vitals.o on a phone, and on a kernel that raised it.
        assert_eq!(tid_coverage_warning(32768, 16, 32768), None);
        let why = tid_coverage_warning(32768, 16, 4_194_304).expect("a warning");
        assert!(
            why.contains("below 32768") && why.contains("pid_max is 4194304"),
            "{why}"
        );
        assert!(why.contains("16-entry TASKS"), "{why}");
    }
}
