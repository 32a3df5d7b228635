//! The capture transport as the capture tier drives it: its user-space end
//! (`EventOutput`: the ring buffer mapped for a capture, or one perf
//! buffer per CPU), lent out of the loaded programs' handle for a capture
//! and handed back; the CAPTURE control flag and the sched_waking link
//! that start, pause and stop one; its loss counters and the user stacks
//! it recorded. The readers of each end (`ringbuf`, `perf_array`) drain
//! records for the drain thread.
//!
//! The kernel end is the programs handle's (`bpf::Accounting`): which
//! transport the load chose, the map it took out of the object and the
//! perf buffers it opened then (opening one needs CAP_PERFMON, which the
//! daemon drops after loading).

pub mod perf_array;
pub mod ringbuf;

use std::os::fd::AsFd;

use aya::maps::{
    perf::PerfEventArrayBuffer, Array, HashMap, MapData, MapError, PerCpuArray, RingBuf,
    StackTraceMap,
};
use vitals_common::{capture, names, AwaitUserStack, CaptureControl, OffcpuStart};

use crate::{
    bpf::{map_err, Accounting, BpfError, IdleTransport},
    event_set::EventSet,
    events::{OffcpuWatch, WatchedProcesses},
};

/// The user-space end of the capture transport: lent to a capture by
/// `start`, handed back by `stop`.
pub enum EventOutput {
    Ring(RingBuf<MapData>),
    /// (cpu, that CPU's perf buffer), for every online CPU.
    Perf(Vec<(u32, PerfEventArrayBuffer<MapData>)>),
}

/// The output a capture drains; `Perf` is left empty until handed back.
fn lend(idle: &mut IdleTransport) -> Result<EventOutput, BpfError> {
    match idle {
        // `start` makes it with the capture's maps: nothing to lend.
        IdleTransport::RingPerCapture => Err(BpfError::Missing(names::CAPTURE_EVENTS)),
        IdleTransport::Ring(data) => {
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
            Ok(EventOutput::Ring(ring))
        }
        IdleTransport::Perf(bufs) => Ok(EventOutput::Perf(std::mem::take(bufs))),
    }
}

/// Takes `out` back: a ring buffer's mapping is dropped (unmapped), perf
/// buffers are kept for the next capture.
fn give_back(idle: &mut IdleTransport, out: EventOutput) {
    match (idle, out) {
        (IdleTransport::Perf(bufs), EventOutput::Perf(lent)) => *bufs = lent,
        (_, EventOutput::Ring(mapping)) => drop(mapping),
        (IdleTransport::Ring(_) | IdleTransport::RingPerCapture, EventOutput::Perf(_)) => {
            log::warn!("capture handed back perf buffers to a ring-buffer transport")
        }
    }
}

/// A started capture's output, which the caller drains and hands back to
/// `stop`, and how many watched processes `OFFCPU_WATCH` had no room for.
pub struct Started {
    pub output: EventOutput,
    pub offcpu_watch_dropped: u64,
}

/// Starts emitting capture records: fills `OFFCPU_WATCH` with the watched
/// processes, attaches sched_waking (with `events.sched`, or `offcpu`
/// where no always-on tp_btf sched_waking ends the blocks) and sets the
/// CAPTURE flag to `events`. Attaching needs CAP_PERFMON: start captures
/// before dropping it.
pub fn start(
    acc: &mut Accounting,
    events: EventSet,
    fault_period: u32,
    offcpu: Option<&OffcpuWatch>,
) -> Result<Started, BpfError> {
    if acc.capture_sizing().is_none() {
        return Err(BpfError::CaptureNotConfigured);
    }
    if acc.transport_slot().lent {
        return Err(BpfError::CaptureRunning);
    }
    // A capture with maps of its own starts with them empty.
    let per_capture = acc.transport_slot().per_capture.is_some();
    if !per_capture {
        clear_plain_maps(acc)?;
    }
    if let Ok(map) = acc.map_mut(names::OFFCPU_AWAITING) {
        if let Ok(mut count) = Array::<_, u64>::try_from(map) {
            let _ = count.set(0, 0, 0);
        }
    }
    let offcpu_watch_dropped = match offcpu.map(|w| &w.processes) {
        Some(WatchedProcesses::Tgids(tgids)) => watch_tgids(acc, tgids)?,
        _ => 0,
    };
    let offcpu_kernel_at_waking = u32::from(acc.offcpu_waking_has_task());
    let slot = acc.transport_slot();
    let ring = match slot.per_capture.as_mut() {
        // The capture's maps go in their slots before the flag is set.
        Some(maps) => match maps.fill(events, offcpu.is_some())? {
            Some(ring) => EventOutput::Ring(ring),
            None => lend(slot.idle.as_mut().ok_or(BpfError::CaptureNotConfigured)?)?,
        },
        None => lend(slot.idle.as_mut().ok_or(BpfError::CaptureNotConfigured)?)?,
    };
    slot.lent = true;
    start_emitting(
        acc,
        events,
        fault_period,
        offcpu,
        offcpu_kernel_at_waking,
        ring,
    )
    .map(|output| Started {
        output,
        offcpu_watch_dropped,
    })
}

/// Empties the plain capture maps (bpfloader's pins, or a load that made
/// them at full size), which outlive a capture. Done before the output is
/// taken: an error here must not lose it (the daemon's accounting serves
/// every later capture).
fn clear_plain_maps(acc: &mut Accounting) -> Result<(), BpfError> {
    // Stacks of an earlier capture are stale; ids are reused by hash.
    if let Ok(mut stacks) = StackTraceMap::try_from(acc.map_mut(names::CAPTURE_STACKS)?) {
        let ids: Vec<u32> = stacks.stack_ids().filter_map(Result::ok).collect();
        for id in ids {
            let _ = stacks.remove(&id);
        }
    }
    // Blocks an earlier capture left waiting for their waking (pinned maps
    // outlive a recording) started before this capture, with ids of the
    // stacks just cleared: forgotten too.
    if let Ok(map) = acc.map_mut(names::OFFCPU_START) {
        if let Ok(mut starts) = HashMap::<_, u32, OffcpuStart>::try_from(map) {
            let tids: Vec<u32> = starts.keys().filter_map(Result::ok).collect();
            for tid in tids {
                let _ = starts.remove(&tid);
            }
        }
    }
    // Likewise blocks an earlier capture left waiting for a user stack.
    if let Ok(map) = acc.map_mut(names::OFFCPU_AWAIT_USER) {
        if let Ok(mut awaiting) = HashMap::<_, u32, AwaitUserStack>::try_from(map) {
            let tids: Vec<u32> = awaiting.keys().filter_map(Result::ok).collect();
            for tid in tids {
                let _ = awaiting.remove(&tid);
            }
        }
    }
    Ok(())
}

/// Attaches what the capture needs and sets the flag; on an error the
/// output is handed back (and the capture's own maps dropped).
fn start_emitting(
    acc: &mut Accounting,
    events: EventSet,
    fault_period: u32,
    offcpu: Option<&OffcpuWatch>,
    offcpu_kernel_at_waking: u32,
    ring: EventOutput,
) -> Result<EventOutput, BpfError> {
    // The capture's sched_waking writes the timeline's wakings and, where
    // the always-on tp_btf one cannot (no task at hand), ends the blocks.
    if events.sched || (offcpu.is_some() && offcpu_kernel_at_waking == 0) {
        if let Err(e) = acc.attach_waking() {
            abandon(acc, ring);
            return Err(e);
        }
    }
    // A user thread's long block takes its user stack as the thread
    // switches in again, where that program loaded (tp_btf, beside the
    // waking that takes the kernel stack); else at every blocking
    // switch-out (README, "User stacks at the switch-in").
    let offcpu_user_at_switch_in =
        u32::from(offcpu.is_some() && offcpu_kernel_at_waking != 0 && acc.attach_switch_in());
    if events.sched {
        // Blind windows: harmless to leave off on failure (fewer marked).
        if let Err(e) = acc.transport_slot().switch_counters.set_enabled(true) {
            log::warn!("capture: blind windows only from running-task mismatches: {e}");
        }
    }
    let flag = set_flag(
        acc,
        CaptureControl {
            flags: events.flags() | offcpu.map_or(0, |_| capture::FLAG_OFFCPU),
            fault_period: fault_period.max(1),
            offcpu_min_ns: offcpu.map_or(0, |w| w.min_block_ns),
            offcpu_scope: match offcpu.map(|w| &w.processes) {
                Some(WatchedProcesses::Tgids(_)) => capture::OFFCPU_SCOPE_WATCHED,
                _ => capture::OFFCPU_SCOPE_ALL,
            },
            capture_id: capture_id(),
            offcpu_kernel_at_waking,
            offcpu_user_at_switch_in,
            // Before the flag is set: a block the accounting began from
            // here on is this capture's (`blocks_from_accounting`).
            offcpu_since_ns: crate::clock::monotonic_ns(),
        },
    );
    if let Err(e) = flag {
        abandon(acc, ring);
        return Err(e);
    }
    Ok(ring)
}

/// Undoes a start that failed after the output was taken: the flag off,
/// the programs detached, the output back for the next capture and this
/// one's own maps out of their slots and dropped.
fn abandon(acc: &mut Accounting, ring: EventOutput) {
    if let Err(e) = pause(acc) {
        log::warn!("undoing a capture start: {e}");
    }
    take_back(acc, ring);
    release(acc);
}

/// `OFFCPU_WATCH` holds exactly `tgids` (an earlier capture's are
/// removed); returns how many did not fit (the map is full at
/// `capture::OFFCPU_WATCH_MAX_TGIDS`). An object pinned before the map
/// existed has none: it then watches nothing, every tgid counted dropped.
fn watch_tgids(acc: &mut Accounting, tgids: &[u32]) -> Result<u64, BpfError> {
    let Ok(map) = acc.map_mut(names::OFFCPU_WATCH) else {
        log::warn!(
            "capture: the loaded programs have no {}; no process is watched",
            names::OFFCPU_WATCH
        );
        return Ok(tgids.len() as u64);
    };
    let mut watch: HashMap<_, u32, u32> =
        HashMap::try_from(map).map_err(map_err(names::OFFCPU_WATCH))?;
    let old: Vec<u32> = watch.keys().filter_map(Result::ok).collect();
    for tgid in old {
        let _ = watch.remove(&tgid);
    }
    Ok(add_watched(&mut watch, tgids))
}

/// Adds `tgids` to the running capture's `OFFCPU_WATCH` (processes that
/// started during it); returns how many did not fit. The programs see
/// each from its insert on.
pub fn watch_more(acc: &mut Accounting, tgids: &[u32]) -> Result<u64, BpfError> {
    let Ok(map) = acc.map_mut(names::OFFCPU_WATCH) else {
        return Ok(tgids.len() as u64);
    };
    let mut watch: HashMap<_, u32, u32> =
        HashMap::try_from(map).map_err(map_err(names::OFFCPU_WATCH))?;
    Ok(add_watched(&mut watch, tgids))
}

/// Inserts `tgids`; returns how many did not fit.
fn add_watched(watch: &mut HashMap<&mut MapData, u32, u32>, tgids: &[u32]) -> u64 {
    let mut dropped = 0;
    for &tgid in tgids {
        // E2BIG once full: counted, the capture goes on with the others.
        if watch.insert(tgid, 1, 0).is_err() {
            dropped += 1;
        }
    }
    if dropped > 0 {
        log::warn!(
            "capture: {dropped} of {} watched processes did not fit {} ({} entries)",
            tgids.len(),
            names::OFFCPU_WATCH,
            capture::OFFCPU_WATCH_MAX_TGIDS
        );
    }
    dropped
}

/// Clears the CAPTURE flag and detaches sched_waking. Records already in
/// `ring` stay readable; drain it before or after handing it back.
/// `None`: the output was lost (its drain thread panicked). A ring buffer
/// is mapped anew by the next capture; lost perf buffers end captures
/// until the daemon restarts, which the log says.
pub fn stop(acc: &mut Accounting, ring: Option<EventOutput>) -> Result<(), BpfError> {
    let res = pause(acc);
    match ring {
        Some(out) => take_back(acc, out),
        None => {
            let slot = acc.transport_slot();
            if matches!(slot.idle, Some(IdleTransport::Perf(_))) {
                log::error!("capture: the perf buffers were lost with their drain thread; no more captures until restart");
                slot.idle = None;
            }
            slot.lent = false;
        }
    }
    res
}

/// `out` back into the handle, which no capture holds any more.
fn take_back(acc: &mut Accounting, out: EventOutput) {
    let slot = acc.transport_slot();
    if let Some(idle) = slot.idle.as_mut() {
        give_back(idle, out);
    }
    slot.lent = false;
}

/// Clears the CAPTURE flag, takes the capture's own maps out of their
/// slots (they stay readable until `release`) and detaches sched_waking;
/// idempotent.
pub fn pause(acc: &mut Accounting) -> Result<(), BpfError> {
    let res = set_flag(acc, CaptureControl::default());
    if let Some(maps) = acc.transport_slot().per_capture.as_mut() {
        maps.empty();
    }
    acc.detach_waking();
    acc.detach_switch_in();
    if let Err(e) = acc.transport_slot().switch_counters.set_enabled(false) {
        log::warn!("capture end: {e}");
    }
    res
}

/// Drops the last capture's own maps, once its trace is written (their
/// stacks are read until then); their kernel memory goes with them.
/// Nothing for plain maps.
pub fn release(acc: &mut Accounting) {
    if let Some(maps) = acc.transport_slot().per_capture.as_mut() {
        maps.release();
    }
}

/// Tells this capture's per-CPU blind-window state from an earlier one's
/// (`vitals_common::blind::BlindState`): CLOCK_BOOTTIME in µs, never 0.
fn capture_id() -> u32 {
    let ns = crate::clock::boottime_ns();
    ((ns / 1000) as u32).max(1)
}

/// The CAPTURE control flag the programs read before emitting anything.
fn set_flag(acc: &mut Accounting, c: CaptureControl) -> Result<(), BpfError> {
    let mut arr: Array<&mut MapData, CaptureControl> =
        Array::try_from(acc.map_mut(names::CAPTURE)?).map_err(map_err(names::CAPTURE))?;
    arr.set(0, c, 0).map_err(map_err(names::CAPTURE))
}

/// Per-CPU cumulative capture loss counters, `[cpu][capture::lost::*]`.
pub fn lost(acc: &Accounting) -> Result<Vec<[u64; capture::lost::COUNT as usize]>, BpfError> {
    let arr: PerCpuArray<&MapData, u64> = PerCpuArray::try_from(acc.map(names::CAPTURE_LOST)?)
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
pub fn stack(acc: &Accounting, stack_id: u32) -> Result<Option<Vec<u64>>, BpfError> {
    let data = match acc.capture_map(names::CAPTURE_STACKS) {
        Some(own) => own,
        None => acc.map(names::CAPTURE_STACKS)?,
    };
    let map: StackTraceMap<&MapData> =
        StackTraceMap::try_from(data).map_err(map_err(names::CAPTURE_STACKS))?;
    match map.get(&stack_id, 0) {
        Ok(st) => Ok(Some(st.frames().iter().map(|f| f.ip).collect())),
        Err(MapError::KeyNotFound) => Ok(None),
        Err(source) => Err(BpfError::Map {
            name: names::CAPTURE_STACKS,
            source,
        }),
    }
}
