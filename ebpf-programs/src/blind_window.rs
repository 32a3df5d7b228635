//! Capture tier, classic sched_switch programs only: blind windows
//! (`vitals_common::blind`). At every seen switch of a `--sched` capture
//! this CPU's PERF_COUNT_SW_CONTEXT_SWITCHES counter is read; when it
//! advanced by more than one since the last seen switch here, or the task
//! switching out is not the one last switched in, the stretch in between
//! goes out as a `BlindWindowEvent`. Only called in the programs' capture
//! branch, so the always-on path pays nothing for it. The tp_btf programs
//! never call it: raw tracepoints do not take bpf_prog_active.
//!
//! Cost during a capture (sched_switch_fixed under `perf bench sched
//! pipe`, bpf run statistics, median of 5 rounds against the same object
//! with this returning at once): +300 ns a switch with
//! bpf_perf_event_read_value and a clock read here, +170 ns with
//! bpf_perf_event_read, +120 ns reusing on_switch's timestamp.

use core::ffi::c_void;

use aya_ebpf::{
    bindings::BPF_F_CURRENT_CPU,
    helpers::{bpf_ktime_get_ns, generated::bpf_perf_event_read},
    macros::map,
    maps::{PerCpuArray, PerfEventByteArray},
};
use vitals_common::{
    blind::{
        BlindState, BlindWindowEvent, KIND_BLIND_WINDOW, SEEN_BY_COUNTER, SEEN_BY_RUNNING_TID,
    },
    capture,
};

use crate::capture_tier::{capture_control, emit, header, RING_POLLED};

/// One CPU-wide context-switch counter per CPU, put here by the loader
/// for a capture tier (max_entries 0: aya sizes it to the possible CPUs;
/// 8 bytes a slot). Empty (bpfloader's pins): the read fails with -ENOENT
/// and only `SEEN_BY_RUNNING_TID` windows are found.
#[map(name = "SWITCH_COUNTERS")]
static SWITCH_COUNTERS: PerfEventByteArray = PerfEventByteArray::new(0);

/// This CPU's last seen switch in the running capture.
#[map(name = "BLIND_STATE")]
static BLIND_STATE: PerCpuArray<BlindState> = PerCpuArray::with_max_entries(1, 0);

/// A seen switch on this CPU; `missed`: on_switch found the task switching
/// out was not the one running (`switch_missed`).
#[inline(always)]
pub(crate) fn on_switch(ctx: *mut c_void, missed: bool) {
    let Some(state) = BLIND_STATE.get_ptr_mut(0) else {
        return;
    };
    let state = unsafe { &mut *state };
    let id = capture_control().capture_id;
    // This switch's CLOCK_MONOTONIC time as on_switch stamped it, moved to
    // CLOCK_BOOTTIME only when a window goes out: no clock read per switch.
    let Some(now) = crate::mapped::cpu_state().map(|c| c.last_switch_ns) else {
        return;
    };
    // bpf_perf_event_read (4.3), not _read_value: the counter alone, without
    // the enabled/running times. Errors come back as -errno in the u64; a
    // context-switch count never gets near those values.
    let count = unsafe {
        bpf_perf_event_read(
            &SWITCH_COUNTERS as *const _ as *mut c_void,
            BPF_F_CURRENT_CPU,
        )
    };
    let read = count < (-4095i64) as u64;
    if state.capture_id == id && state.ts != 0 {
        let (mut unseen, mut seen_by) = (0u64, 0u32);
        if read && state.counted != 0 {
            // It has counted the earlier seen switch too: an advance of 1
            // is none unseen. Where it is read it decides: a mismatch it
            // does not confirm is the exec rename (`sched_info::follow_exec`).
            if count > state.switch_count + 1 {
                unseen = count - state.switch_count - 1;
                seen_by = SEEN_BY_COUNTER | if missed { SEEN_BY_RUNNING_TID } else { 0 };
            }
        } else if missed {
            // No counter: at least one switch went unseen.
            (unseen, seen_by) = (1, SEEN_BY_RUNNING_TID);
        }
        if seen_by != 0 {
            let hdr = header(KIND_BLIND_WINDOW);
            let boot_minus_mono = hdr.ts.wrapping_sub(unsafe { bpf_ktime_get_ns() });
            emit(
                ctx,
                BlindWindowEvent {
                    hdr,
                    start_ts: state.ts.wrapping_add(boot_minus_mono),
                    unseen_switches: unseen as u32,
                    seen_by,
                },
                capture::lost::SCHED,
                RING_POLLED,
            );
        }
    }
    state.capture_id = id;
    state.ts = now;
    state.switch_count = if read { count } else { 0 };
    state.counted = read as u32;
}
