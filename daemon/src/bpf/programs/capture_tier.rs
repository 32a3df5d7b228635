//! The capture tier's kernel end, as the load leaves it in the programs
//! handle: sched_waking loaded (attached only while a capture with
//! `FLAG_SCHED` runs), the transport's map taken out of the object with
//! its buffers (`IdleTransport`), and whether a capture holds them
//! (`TransportSlot`). `events::transport` lends them to a capture and
//! flips the capture flag; attaching sched_waking is the handle's.

use std::path::Path;

use aya::{
    maps::{
        perf::{PerfEventArray, PerfEventArrayBuffer},
        MapData,
    },
    programs::TracePoint,
    Ebpf,
};
use vitals_common::names;

use super::{
    super::{
        attach_err, map_err,
        object::{perf_pages_per_cpu, pinned_prog_path, waking_program, EventTransport},
        BpfError, EventSizing, TracepointLayout,
    },
    program, program_err, Accounting,
};

/// The transport between captures, and whether a capture holds its
/// output (`events::transport::start` lent it).
pub(crate) struct TransportSlot {
    /// None: no capture tier, or its perf buffers were lost.
    pub(crate) idle: Option<IdleTransport>,
    pub(crate) lent: bool,
    /// Blind-window witnesses (`switch_counters`), enabled for a capture.
    pub(crate) switch_counters: super::SwitchCounters,
    /// The daemon's own load: each capture's own large maps
    /// (`capture_slots`). None: the plain maps, sized at load or by
    /// bpfloader.
    pub(crate) per_capture: Option<super::capture_slots::CaptureSlots>,
}

/// The capture transport between captures.
pub(crate) enum IdleTransport {
    /// The ring buffer's map, not mapped into this process: a capture maps
    /// it through a duplicate of its fd and unmaps it at the end. Mapped
    /// for the daemon's life, its data pages (mapped twice, for records
    /// that wrap around) cost the idle daemon 16 MiB of RSS with the
    /// default 4 MiB ring (issue #14); the kernel's pages stay allocated
    /// either way, and the records in them stay put between mappings.
    Ring(MapData),
    /// Each capture makes its own ring buffer (`capture_slots`): between
    /// captures there is none.
    RingPerCapture,
    /// Perf buffers stay mapped: opening one is a perf_event_open, which
    /// needs CAP_PERFMON, and a daemon that dropped it must still capture.
    Perf(Vec<(u32, PerfEventArrayBuffer<MapData>)>),
}

/// With a capture configured (`sizing`): loads (verifies) sched_waking
/// now, attached only while a capture runs, and takes the transport's
/// buffers (none for a ring buffer made per capture: `per_capture`).
/// None without one.
/// With `pin_to`, sched_waking is pinned there too (`vitalsd pin`: a
/// reader of the pins runs captures as bpfloader's vitals.o allows).
pub(super) fn load_capture_tier(
    ebpf: &mut Ebpf,
    layout: TracepointLayout,
    sizing: Option<EventSizing>,
    transport: EventTransport,
    page: u32,
    pin_to: Option<&Path>,
    per_capture: bool,
) -> Result<Option<IdleTransport>, BpfError> {
    let Some(sizing) = sizing else {
        return Ok(None);
    };
    let name = waking_program(layout);
    let prog: &mut TracePoint = program(ebpf, name)?;
    prog.load().map_err(program_err(name))?;
    if let Some(dir) = pin_to {
        let path = pinned_prog_path(dir, name);
        prog.pin(&path).map_err(|e| BpfError::Pin {
            path,
            message: e.to_string(),
        })?;
    }
    if per_capture && transport == EventTransport::RingBuf {
        return Ok(Some(IdleTransport::RingPerCapture));
    }
    take_capture_output(ebpf, transport, sizing, page).map(Some)
}

/// Takes the capture transport's map out of `ebpf`, with its buffers: for
/// the perf array one perf buffer per online CPU, opened now so the memory
/// is reserved at load as the ring buffer's is.
fn take_capture_output(
    ebpf: &mut Ebpf,
    transport: EventTransport,
    sizing: EventSizing,
    page: u32,
) -> Result<IdleTransport, BpfError> {
    match transport {
        EventTransport::RingBuf => match ebpf.take_map(names::CAPTURE_EVENTS) {
            Some(aya::maps::Map::RingBuf(data)) => Ok(IdleTransport::Ring(data)),
            Some(_) => Err(BpfError::Unsupported(format!(
                "{} is not a ring buffer",
                names::CAPTURE_EVENTS
            ))),
            None => Err(BpfError::Missing(names::CAPTURE_EVENTS)),
        },
        EventTransport::PerfArray => {
            let map = ebpf
                .take_map(names::CAPTURE_PERF)
                .ok_or(BpfError::Missing(names::CAPTURE_PERF))?;
            let mut arr: PerfEventArray<MapData> =
                PerfEventArray::try_from(map).map_err(map_err(names::CAPTURE_PERF))?;
            let cpus = crate::system::online_cpus(Path::new("/sys"))?;
            let pages = perf_pages_per_cpu(sizing.ring_bytes, page, cpus.len());
            let mut bufs = Vec::with_capacity(cpus.len());
            for cpu in cpus {
                let buf = arr
                    .open(cpu, Some(pages))
                    .map_err(|e| BpfError::PerfBuffer {
                        cpu,
                        message: e.to_string(),
                    })?;
                bufs.push((cpu, buf));
            }
            Ok(IdleTransport::Perf(bufs))
        }
    }
}

impl Accounting {
    /// The capture tier's kernel memory (None: not sized at load, and
    /// captures are refused).
    pub fn capture_sizing(&self) -> Option<EventSizing> {
        self.capture_sizing
    }

    /// The transport's kernel end, for `events::transport` to lend out
    /// and take back.
    pub(crate) fn transport_slot(&mut self) -> &mut TransportSlot {
        &mut self.slot
    }

    /// Attaches sched_waking for a capture with `capture::FLAG_SCHED`.
    pub(crate) fn attach_waking(&mut self) -> Result<(), BpfError> {
        let (name, prog) = self.waking_prog()?;
        let link = prog
            .attach("sched", "sched_waking")
            .map_err(attach_err(name, "tracepoint sched/sched_waking"))?;
        self.waking_link = Some(link);
        Ok(())
    }

    /// Detaches sched_waking if a capture attached it; failures are logged.
    pub(crate) fn detach_waking(&mut self) {
        if let Some(link) = self.waking_link.take() {
            match self.waking_prog() {
                Ok((name, prog)) => {
                    if let Err(e) = prog.detach(link) {
                        log::warn!("detaching {name}: {e}");
                    }
                }
                Err(e) => log::warn!("detaching sched_waking: {e}"),
            }
        }
    }

    /// Attaches the switch-in program (`switch_in`) for an off-CPU
    /// capture; false (and logged) where none loaded or the attach fails:
    /// the capture then takes user stacks at the switch-out.
    pub(crate) fn attach_switch_in(&mut self) -> bool {
        let (Some(which), Some(ebpf)) = (self.switch_in.as_ref(), self.ebpf.as_mut()) else {
            return false;
        };
        match super::switch_in::attach(ebpf, which) {
            Ok(link) => {
                self.switch_in_link = Some(link);
                true
            }
            Err(e) => {
                log::warn!("{e}: this capture takes user stacks at the switch-out");
                false
            }
        }
    }

    /// Detaches the switch-in program if a capture attached it.
    pub(crate) fn detach_switch_in(&mut self) {
        if let (Some(link), Some(ebpf)) = (self.switch_in_link.take(), self.ebpf.as_mut()) {
            super::switch_in::detach(ebpf, link);
        }
    }

    /// The sched_waking program: the pinned one when attached from pins,
    /// else the object's, in sched_waking's own layout (`waking_layout`).
    fn waking_prog(&mut self) -> Result<(&'static str, &mut TracePoint), BpfError> {
        let name = waking_program(self.waking_layout);
        if let Some(p) = self.pinned_waking.as_mut() {
            return Ok((name, p));
        }
        let ebpf = self.ebpf.as_mut().ok_or(BpfError::CaptureNotConfigured)?;
        Ok((name, program(ebpf, name)?))
    }
}
