//! The capture tier's maps: the transport choice (`CaptureTransportChoice`,
//! `CaptureTransport`) and its user-space end (`CaptureOutput`: the ring
//! buffer or one perf buffer per CPU), starting, pausing and stopping a
//! capture (the CAPTURE control flag, the sched_waking link), its loss
//! counters and user stacks, and the copy of the object without
//! BPF_MAP_TYPE_RINGBUF for kernels before 5.8.

use std::{os::fd::AsFd, path::Path};

use crate::event_set::EventSet;
use aya::{
    maps::{
        perf::{PerfEventArray, PerfEventArrayBuffer},
        Array, MapData, MapError, PerCpuArray, RingBuf, StackTraceMap,
    },
    programs::TracePoint,
    Ebpf,
};
use vitals_common::{capture, names, CaptureControl};

use super::{
    attach_err, map_err, program, program_err, Accounting, BpfError, CaptureSizing,
    TracepointLayout,
};

/// How capture records get from the programs to user space.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CaptureTransportChoice {
    /// The ring buffer where the kernel has one, else the perf array.
    #[default]
    Auto,
    RingBuf,
    PerfArray,
}

impl std::str::FromStr for CaptureTransportChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "ringbuf" | "ring" => Ok(Self::RingBuf),
            "perf" | "perf-array" => Ok(Self::PerfArray),
            _ => Err(format!(
                "unknown capture transport {s:?} (auto, ringbuf, perf)"
            )),
        }
    }
}

/// The capture transport in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaptureTransport {
    /// BPF_MAP_TYPE_RINGBUF: one buffer shared by all CPUs, no wakeups.
    RingBuf,
    /// BPF_MAP_TYPE_PERF_EVENT_ARRAY: one perf buffer per CPU.
    PerfArray,
}

impl CaptureTransport {
    pub fn name(self) -> &'static str {
        match self {
            CaptureTransport::RingBuf => "ringbuf",
            CaptureTransport::PerfArray => "perf_event_array",
        }
    }

    pub(super) fn rodata(self) -> u32 {
        match self {
            CaptureTransport::RingBuf => capture::TRANSPORT_RINGBUF,
            CaptureTransport::PerfArray => capture::TRANSPORT_PERF_ARRAY,
        }
    }

    /// The transport for `choice` (None: no capture configured) on a
    /// kernel with or without the ring buffer map.
    pub(super) fn choose(
        choice: Option<CaptureTransportChoice>,
        ringbuf_ok: bool,
    ) -> Result<Self, BpfError> {
        match (choice, ringbuf_ok) {
            (Some(CaptureTransportChoice::PerfArray), _) | (_, false) => {
                if choice == Some(CaptureTransportChoice::RingBuf) {
                    return Err(BpfError::NoRingBuf);
                }
                Ok(CaptureTransport::PerfArray)
            }
            _ => Ok(CaptureTransport::RingBuf),
        }
    }
}

/// The user-space end of the capture transport: lent to a capture by
/// `capture_start`, handed back by `capture_stop`.
pub enum CaptureOutput {
    Ring(RingBuf<MapData>),
    /// (cpu, that CPU's perf buffer), for every online CPU.
    Perf(Vec<(u32, PerfEventArrayBuffer<MapData>)>),
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
    /// Perf buffers stay mapped: opening one is a perf_event_open, which
    /// needs CAP_PERFMON, and a daemon that dropped it must still capture.
    Perf(Vec<(u32, PerfEventArrayBuffer<MapData>)>),
}

impl IdleTransport {
    /// The output a capture drains; `Perf` is left empty until handed back.
    fn lend(&mut self) -> Result<CaptureOutput, BpfError> {
        match self {
            Self::Ring(data) => {
                let fd = data
                    .fd()
                    .as_fd()
                    .try_clone_to_owned()
                    .map_err(|e| BpfError::Map {
                        name: names::CAPTURE_EVENTS,
                        source: MapError::SyscallError(aya::sys::SyscallError {
                            call: "dup",
                            io_error: e,
                        }),
                    })?;
                let dup = MapData::from_fd(fd).map_err(map_err(names::CAPTURE_EVENTS))?;
                let ring = RingBuf::try_from(aya::maps::Map::RingBuf(dup))
                    .map_err(map_err(names::CAPTURE_EVENTS))?;
                Ok(CaptureOutput::Ring(ring))
            }
            Self::Perf(bufs) => Ok(CaptureOutput::Perf(std::mem::take(bufs))),
        }
    }

    /// Takes `out` back: a ring buffer's mapping is dropped (unmapped), perf
    /// buffers are kept for the next capture.
    fn give_back(&mut self, out: CaptureOutput) {
        match (self, out) {
            (Self::Perf(bufs), CaptureOutput::Perf(lent)) => *bufs = lent,
            (_, CaptureOutput::Ring(mapping)) => drop(mapping),
            (Self::Ring(_), CaptureOutput::Perf(_)) => {
                log::warn!("capture handed back perf buffers to a ring-buffer transport")
            }
        }
    }
}

impl Accounting {
    /// Starts emitting capture records: attaches sched_waking (with
    /// `events.sched`) and sets the CAPTURE flag to `events`. Returns the ring
    /// buffer, which the caller drains and hands back to `capture_stop`.
    /// Attaching needs CAP_PERFMON: start captures before dropping it.
    pub fn capture_start(
        &mut self,
        events: EventSet,
        fault_period: u32,
    ) -> Result<CaptureOutput, BpfError> {
        if self.capture_sizing.is_none() {
            return Err(BpfError::CaptureNotConfigured);
        }
        if self.capture_lent {
            return Err(BpfError::CaptureRunning);
        }
        // Stacks of an earlier capture are stale; ids are reused by hash.
        // Cleared before the ring buffer is taken: an error here must not
        // lose it (the daemon's accounting serves every later capture).
        if let Ok(mut stacks) = StackTraceMap::try_from(self.map_mut(names::CAPTURE_STACKS)?) {
            let ids: Vec<u32> = stacks.stack_ids().filter_map(Result::ok).collect();
            for id in ids {
                let _ = stacks.remove(&id);
            }
        }
        let ring = self
            .ring
            .as_mut()
            .ok_or(BpfError::CaptureNotConfigured)?
            .lend()?;
        self.capture_lent = true;
        if events.sched {
            let attached = self.waking_prog().and_then(|(name, prog)| {
                prog.attach("sched", "sched_waking")
                    .map_err(attach_err(name, "tracepoint sched/sched_waking"))
            });
            match attached {
                Ok(link) => self.waking_link = Some(link),
                Err(e) => {
                    // The transport stays here for the next capture.
                    self.give_back(ring);
                    return Err(e);
                }
            }
        }
        self.set_capture(CaptureControl {
            flags: events.flags(),
            fault_period: fault_period.max(1),
        })?;
        Ok(ring)
    }

    /// Clears the CAPTURE flag and detaches sched_waking. Records already
    /// in `ring` stay readable; drain it before or after handing it back.
    /// `None`: the output was lost (its drain thread panicked). A ring
    /// buffer is mapped anew by the next capture; lost perf buffers end
    /// captures until the daemon restarts, which the log says.
    pub fn capture_stop(&mut self, ring: Option<CaptureOutput>) -> Result<(), BpfError> {
        let res = self.capture_pause();
        match ring {
            Some(out) => self.give_back(out),
            None => {
                if matches!(self.ring, Some(IdleTransport::Perf(_))) {
                    log::error!("capture: the perf buffers were lost with their drain thread; no more captures until restart");
                    self.ring = None;
                }
                self.capture_lent = false;
            }
        }
        res
    }

    fn give_back(&mut self, out: CaptureOutput) {
        if let Some(idle) = self.ring.as_mut() {
            idle.give_back(out);
        }
        self.capture_lent = false;
    }

    /// Clears the CAPTURE flag and detaches sched_waking; idempotent.
    pub fn capture_pause(&mut self) -> Result<(), BpfError> {
        let res = self.set_capture(CaptureControl::default());
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
        res
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

    fn set_capture(&mut self, c: CaptureControl) -> Result<(), BpfError> {
        let mut arr: Array<&mut MapData, CaptureControl> =
            Array::try_from(self.map_mut(names::CAPTURE)?).map_err(map_err(names::CAPTURE))?;
        arr.set(0, c, 0).map_err(map_err(names::CAPTURE))
    }

    /// Per-CPU cumulative capture loss counters, `[cpu][capture::lost::*]`.
    pub fn capture_lost(&self) -> Result<Vec<[u64; capture::lost::COUNT as usize]>, BpfError> {
        let arr: PerCpuArray<&MapData, u64> = PerCpuArray::try_from(self.map(names::CAPTURE_LOST)?)
            .map_err(map_err(names::CAPTURE_LOST))?;
        let mut out = Vec::new();
        for reason in 0..capture::lost::COUNT {
            let per_cpu = arr.get(&reason, 0).map_err(map_err(names::CAPTURE_LOST))?;
            if out.len() < per_cpu.len() {
                out.resize(per_cpu.len(), [0; capture::lost::COUNT as usize]);
            }
            for (cpu, v) in per_cpu.iter().enumerate() {
                out[cpu][reason as usize] = *v;
            }
        }
        Ok(out)
    }

    /// The user stack (instruction pointers, innermost first) under
    /// `stack_id`, or None if the map has no such entry.
    pub fn capture_stack(&self, stack_id: u32) -> Result<Option<Vec<u64>>, BpfError> {
        let map: StackTraceMap<&MapData> =
            StackTraceMap::try_from(self.map(names::CAPTURE_STACKS)?)
                .map_err(map_err(names::CAPTURE_STACKS))?;
        match map.get(&stack_id, 0) {
            Ok(st) => Ok(Some(st.frames().iter().map(|f| f.ip).collect())),
            Err(MapError::KeyNotFound) => Ok(None),
            Err(source) => Err(BpfError::Map {
                name: names::CAPTURE_STACKS,
                source,
            }),
        }
    }
}

/// max_entries of CAPTURE_EVENTS, CAPTURE_STACKS and CAPTURE_FAULT_CTR.
/// Without a capture configured (`sizing` None) the capture maps take
/// their minimum size, so the always-on tier's memory does not grow.
pub(super) fn capture_map_sizes(
    sizing: Option<CaptureSizing>,
    transport: CaptureTransport,
    ringbuf_ok: bool,
    page: u32,
) -> [(&'static str, u32); 3] {
    // The ring buffer goes unused with the perf array: minimum.
    let ring_bytes = match (sizing, transport, ringbuf_ok) {
        (_, _, false) => 1,
        (Some(c), CaptureTransport::RingBuf, _) => c.ring_bytes.max(page).next_power_of_two(),
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
    ]
}

/// The sched_waking program in `layout`.
pub(super) fn waking_program(layout: TracepointLayout) -> &'static str {
    match layout {
        TracepointLayout::Fixed => names::PROG_SCHED_WAKING_FIXED,
        TracepointLayout::Portable => names::PROG_SCHED_WAKING,
    }
}

/// With a capture configured (`sizing`): loads (verifies) sched_waking
/// now, attached only while a capture runs, and takes the transport's
/// buffers. None without one.
/// With `pin_to`, sched_waking is pinned there too (`vitalsd pin`: a
/// reader of the pins runs captures as bpfloader's vitals.o allows).
pub(super) fn load_capture_tier(
    ebpf: &mut Ebpf,
    layout: TracepointLayout,
    sizing: Option<CaptureSizing>,
    transport: CaptureTransport,
    page: u32,
    pin_to: Option<&Path>,
) -> Result<Option<IdleTransport>, BpfError> {
    let Some(sizing) = sizing else {
        return Ok(None);
    };
    let name = waking_program(layout);
    let prog: &mut TracePoint = program(ebpf, name)?;
    prog.load().map_err(program_err(name))?;
    if let Some(dir) = pin_to {
        let path = super::pinned_prog_path(dir, name);
        prog.pin(&path).map_err(|e| BpfError::Pin {
            path,
            message: e.to_string(),
        })?;
    }
    take_capture_output(ebpf, transport, sizing, page).map(Some)
}

/// Takes the capture transport's map out of `ebpf`, with its buffers: for
/// the perf array one perf buffer per online CPU, opened now so the memory
/// is reserved at load as the ring buffer's is.
fn take_capture_output(
    ebpf: &mut Ebpf,
    transport: CaptureTransport,
    sizing: CaptureSizing,
    page: u32,
) -> Result<IdleTransport, BpfError> {
    match transport {
        CaptureTransport::RingBuf => match ebpf.take_map(names::CAPTURE_EVENTS) {
            Some(aya::maps::Map::RingBuf(data)) => Ok(IdleTransport::Ring(data)),
            Some(_) => Err(BpfError::Unsupported(format!(
                "{} is not a ring buffer",
                names::CAPTURE_EVENTS
            ))),
            None => Err(BpfError::Missing(names::CAPTURE_EVENTS)),
        },
        CaptureTransport::PerfArray => {
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

/// Data pages of each CPU's perf buffer: `ring_bytes` split over the CPUs,
/// rounded down to a power of two (perf wants one), at least one page.
pub fn perf_pages_per_cpu(ring_bytes: u32, page: u32, cpus: usize) -> usize {
    let per_cpu = (ring_bytes as usize / cpus.max(1) / page.max(1) as usize).max(1);
    1 << per_cpu.ilog2()
}

/// A copy of the eBPF object in which the CAPTURE_EVENTS map definition
/// (aya-ebpf's legacy `bpf_map_def` in the `maps` section: type, key size,
/// value size, max entries, ...) says BPF_MAP_TYPE_ARRAY with 4-byte keys
/// and values, which every kernel can create.
pub(super) fn object_without_ringbuf(obj: &[u8]) -> Result<AlignedObject, BpfError> {
    use object::{Object, ObjectSection, ObjectSymbol};
    const BPF_MAP_TYPE_ARRAY: u32 = 2;
    let file = object::File::parse(obj).map_err(|_| BpfError::Missing(names::CAPTURE_EVENTS))?;
    let sym = file
        .symbols()
        .find(|s| s.name() == Ok(names::CAPTURE_EVENTS))
        .ok_or(BpfError::Missing(names::CAPTURE_EVENTS))?;
    let section = sym
        .section_index()
        .and_then(|i| file.section_by_index(i).ok())
        .ok_or(BpfError::Missing(names::CAPTURE_EVENTS))?;
    let (file_off, _) = section
        .file_range()
        .ok_or(BpfError::Missing(names::CAPTURE_EVENTS))?;
    let at = (file_off + sym.address() - section.address()) as usize;
    let mut out = AlignedObject::new(obj);
    for (i, v) in [BPF_MAP_TYPE_ARRAY, 4, 4, 1].into_iter().enumerate() {
        out.bytes_mut()[at + 4 * i..at + 4 * i + 4].copy_from_slice(&v.to_le_bytes());
    }
    Ok(out)
}

/// An ELF image in 8-byte-aligned memory, as aya's parser wants it (what
/// `include_bytes_aligned!` gives the embedded object).
pub(super) struct AlignedObject {
    words: Vec<u64>,
    len: usize,
}

impl AlignedObject {
    fn new(bytes: &[u8]) -> Self {
        let mut o = Self {
            words: vec![0; bytes.len().div_ceil(8)],
            len: bytes.len(),
        };
        o.bytes_mut().copy_from_slice(bytes);
        o
    }

    pub(super) fn bytes(&self) -> &[u8] {
        // SAFETY: `words` holds at least `len` initialised bytes.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr() as *const u8, self.len) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above; u8 has no alignment or validity requirements.
        unsafe { std::slice::from_raw_parts_mut(self.words.as_mut_ptr() as *mut u8, self.len) }
    }
}

#[cfg(test)]
mod transport_tests {
    use super::{super::EBPF_OBJECT, *};

    #[test]
    fn perf_buffers_split_the_ring_bytes_in_powers_of_two_pages() {
        assert_eq!(perf_pages_per_cpu(8 << 20, 4096, 2), 1024);
        assert_eq!(perf_pages_per_cpu(8 << 20, 4096, 3), 512);
        assert_eq!(perf_pages_per_cpu(4096, 4096, 2), 1);
        assert_eq!(perf_pages_per_cpu(0, 4096, 0), 1);
    }

    #[test]
    fn the_no_ringbuf_object_has_capture_events_as_a_one_entry_array() {
        use object::{Object, ObjectSection, ObjectSymbol};
        let patched = object_without_ringbuf(EBPF_OBJECT).unwrap();
        assert_eq!(patched.bytes().as_ptr() as usize % 8, 0);
        let def = |obj: &[u8]| -> Vec<u32> {
            let f = object::File::parse(obj).unwrap();
            let sym = f
                .symbols()
                .find(|s| s.name() == Ok(names::CAPTURE_EVENTS))
                .unwrap();
            let sec = f.section_by_index(sym.section_index().unwrap()).unwrap();
            let data = sec.data().unwrap();
            let at = (sym.address() - sec.address()) as usize;
            (0..4)
                .map(|i| u32::from_le_bytes(data[at + 4 * i..at + 4 * i + 4].try_into().unwrap()))
                .collect()
        };
        // BPF_MAP_TYPE_RINGBUF (27) with the placeholder size before.
        assert_eq!(def(EBPF_OBJECT)[0], 27);
        assert_eq!(def(patched.bytes()), vec![2, 4, 4, 1]);
        assert_eq!(patched.bytes().len(), EBPF_OBJECT.len());
    }
}
