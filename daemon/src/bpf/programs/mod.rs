//! The programs handle: `Accounting` owns the loaded object (aya's `Ebpf`)
//! or the programs and maps opened from pins, and the links that keep the
//! programs attached. `load` loads with aya and attaches (or pins, with
//! `PinMode::PinTo`), `pins` attaches what bpfloader pinned, `attach`
//! holds what both attach with, `settings` what the load sets in the
//! object, and `capture_tier` the capture tier's kernel end (sched_waking
//! and the transport's buffers). The maps are read by `bpf::counters` and
//! `events::transport` through `map`.

mod attach;
mod capture_slots;
mod capture_tier;
mod free_misses;
mod load;
pub mod memory;
mod pins;
mod settings;
mod switch_counters;
mod switch_in;

use std::collections::HashMap;

use aya::{
    programs::{trace_point::TracePointLinkId, ProgramError},
    Ebpf,
};

pub(crate) use self::capture_tier::{IdleTransport, TransportSlot};
pub use self::settings::WAKE_ARRAY_MAX_PIDS;
pub(crate) use self::switch_counters::SwitchCounters;
use self::{free_misses::FreeMisses, pins::PinnedProgram};
use super::{
    mapped::Mappings,
    object::{EventTransport, MapRead, SchedPrograms, TracepointLayout},
    program_err,
    stale::StaleSweep,
    BpfError, EventSizing, FaultSource, Features, MapLimits, OffcpuSettings,
};

/// The loaded and attached accounting programs.
pub struct Accounting {
    /// The aya object (None when attached from pins).
    ebpf: Option<Ebpf>,
    /// Maps opened from pins; looked up before `ebpf`'s.
    pinned_maps: HashMap<&'static str, aya::maps::Map>,
    /// Programs opened from pins; dropping one detaches its links.
    #[allow(dead_code)]
    pinned_programs: Vec<PinnedProgram>,
    fault_source: FaultSource,
    features: Features,
    limits: MapLimits,
    layout: TracepointLayout,
    /// The capture-only sched_waking program's layout, judged apart.
    waking_layout: TracepointLayout,
    sched_programs: SchedPrograms,
    runq_wait: bool,
    /// Runqueue wait is the kernel's `sched_info.run_delay` (tp_btf), not
    /// the wakeup programs' timestamps.
    wait_from_kernel: bool,
    /// Off-CPU accounting as loaded (None: off, or pins without it).
    offcpu: Option<OffcpuSettings>,
    capture_sizing: Option<EventSizing>,
    /// Where capture records go (meaningful only with `capture_sizing`).
    transport: EventTransport,
    /// The transport's kernel end between captures.
    slot: TransportSlot,
    /// The pinned sched_waking program (attached from pins; None: `ebpf`'s).
    pinned_waking: Option<aya::programs::TracePoint>,
    /// sched_waking link while a capture with FLAG_SCHED runs.
    waking_link: Option<TracePointLinkId>,
    /// The switch-in program that loaded (tp_btf, off-CPU accounting and
    /// a capture tier), and its link while an off-CPU capture runs.
    switch_in: Option<switch_in::SwitchIn>,
    switch_in_link: Option<switch_in::SwitchInLink>,
    /// How the hashes are read; `Batch` falls back to `Iterate` for
    /// good on a kernel without batch lookups.
    map_read: MapRead,
    /// The arrays read through mmap, mapped at the first read.
    mapped: Mappings,
    /// sched_process_free's runs the kernel skipped (`free_missed`).
    free_misses: FreeMisses,
    /// The slots those skips left behind, found against /proc.
    stale: StaleSweep,
}

impl Accounting {
    /// sched_process_free's runs the kernel skipped so far (`free_missed`);
    /// None where the kernel does not count them.
    pub(in crate::bpf) fn free_missed(&mut self) -> Option<u64> {
        let n = self.free_misses.read();
        self.free_misses.counted().then_some(n)
    }

    pub(in crate::bpf) fn stale_sweep(&mut self) -> &mut StaleSweep {
        &mut self.stale
    }

    /// Task slots freed from user space because sched_process_free was
    /// skipped (`counters::stale`).
    pub fn stale_slots_freed(&self) -> u64 {
        self.stale.freed
    }

    /// Where capture records go (set at load).
    pub fn capture_transport(&self) -> EventTransport {
        self.transport
    }

    /// Is `runq_wait_ns` measured? When not, it is not zero but unknown.
    pub fn runq_wait(&self) -> bool {
        self.runq_wait
    }

    /// Is runqueue wait read from the kernel's own `sched_info.run_delay`
    /// (tp_btf programs, CONFIG_SCHED_INFO), with no wakeup programs?
    /// Else, when measured, the wakeup programs time it.
    pub fn runq_wait_from_kernel(&self) -> bool {
        self.wait_from_kernel
    }

    /// Off-CPU accounting, if its program is attached.
    pub fn offcpu(&self) -> Option<OffcpuSettings> {
        self.offcpu
    }

    /// Is the always-on sched_waking the tp_btf one, which has the wakee's
    /// task? An off-CPU capture then takes a long block's kernel stack
    /// at its waking (`CaptureControl::offcpu_kernel_at_waking`).
    pub fn offcpu_waking_has_task(&self) -> bool {
        self.sched_programs == SchedPrograms::Btf && self.offcpu.is_some()
    }

    /// The classic always-on programs' layout (the scheduler programs
    /// when `sched_programs` is `Classic`).
    pub fn layout(&self) -> TracepointLayout {
        self.layout
    }

    /// The layout of sched_waking, attached during captures.
    pub fn waking_layout(&self) -> TracepointLayout {
        self.waking_layout
    }

    pub fn sched_programs(&self) -> SchedPrograms {
        self.sched_programs
    }

    pub fn fault_source(&self) -> FaultSource {
        self.fault_source
    }

    pub fn features(&self) -> &Features {
        &self.features
    }

    pub fn limits(&self) -> MapLimits {
        self.limits
    }

    pub(crate) fn map(&self, name: &'static str) -> Result<&aya::maps::Map, BpfError> {
        self.pinned_maps
            .get(name)
            .or_else(|| self.ebpf.as_ref().and_then(|e| e.map(name)))
            .ok_or(BpfError::Missing(name))
    }

    /// The running (or last unreleased) capture's own map `name`, on a
    /// load that makes them per capture (`capture_slots`).
    pub(crate) fn capture_map(&self, name: &str) -> Option<&aya::maps::Map> {
        self.slot.per_capture.as_ref()?.live(name)
    }

    pub(crate) fn map_mut(&mut self, name: &'static str) -> Result<&mut aya::maps::Map, BpfError> {
        if self.pinned_maps.contains_key(name) {
            return self
                .pinned_maps
                .get_mut(name)
                .ok_or(BpfError::Missing(name));
        }
        self.ebpf
            .as_mut()
            .and_then(|e| e.map_mut(name))
            .ok_or(BpfError::Missing(name))
    }

    /// The mmap-read arrays (`bpf::mapped`).
    pub(crate) fn mappings(&self) -> &Mappings {
        &self.mapped
    }

    pub(crate) fn mappings_mut(&mut self) -> &mut Mappings {
        &mut self.mapped
    }

    /// How the hashes are read now.
    pub fn map_read(&self) -> MapRead {
        self.map_read
    }

    /// Forces a way of reading the hashes; for tests comparing them.
    #[doc(hidden)]
    pub fn set_map_read(&mut self, how: MapRead) {
        self.map_read = how;
    }

    /// Where the programs came from: "pins" or "aya".
    pub fn source(&self) -> &'static str {
        if self.ebpf.is_none() {
            "pins"
        } else {
            "aya"
        }
    }
}

/// Program `name` of the object, as its program type.
pub(super) fn program<'a, P>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut P, BpfError>
where
    &'a mut P: TryFrom<&'a mut aya::programs::Program, Error = ProgramError>,
{
    ebpf.program_mut(name)
        .ok_or(BpfError::Missing(name))?
        .try_into()
        .map_err(program_err(name))
}
