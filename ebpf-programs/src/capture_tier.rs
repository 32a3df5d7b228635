//! The capture tier's side of the programs: the capture maps (sized by
//! the loader: 1 page / 1 entry when no capture is configured), the
//! capture flag read on the always-on path, writing records to the ring
//! buffer or the perf event array, the sched_waking programs (attached only
//! for a capture) and the sampled fault records with their user stacks.

use core::ffi::c_void;

use aya_ebpf::{
    bindings::{BPF_F_CURRENT_CPU, BPF_F_USER_STACK, BPF_RB_NO_WAKEUP},
    helpers::{
        bpf_get_current_pid_tgid, bpf_get_smp_processor_id, bpf_ktime_get_boot_ns,
        generated::bpf_perf_event_output,
    },
    macros::{map, tracepoint},
    maps::{Array, PerCpuArray, PerfEventByteArray},
    programs::{tracing::StackIdContext, TracePointContext},
    EbpfContext,
};
use vitals_common::{
    capture, fixed_layout, CaptureControl, EventHeader, FaultEvent, SwitchEvent, WakingEvent,
};

use crate::{
    capture_maps, setting, CAPTURE_TRANSPORT, WAKING_COMM_OFF, WAKING_PID_OFF, WAKING_PRIO_OFF,
    WAKING_TARGET_CPU_OFF,
};

// ---- maps (the large ones are `capture_maps`') ----

/// flags == 0: no capture. User space writes it; frozen .rodata could not.
#[map(name = "CAPTURE")]
static CAPTURE: Array<CaptureControl> = Array::with_max_entries(1, 0);

/// The same records through bpf_perf_event_output, one perf buffer per CPU
/// (max_entries 0: aya sizes it to the possible CPUs), for kernels without
/// BPF_MAP_TYPE_RINGBUF (before 5.8) or when forced.
#[map(name = "CAPTURE_PERF")]
static CAPTURE_PERF: PerfEventByteArray = PerfEventByteArray::new(0);

/// Per-CPU counts of records that could not be written, by `capture::lost`.
#[map(name = "CAPTURE_LOST")]
static CAPTURE_LOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(capture::lost::COUNT, 0);

/// The capture flags: an array lookup the verifier inlines, one load, so
/// the always-on path pays only this and a branch while no capture runs.
#[inline(always)]
pub(crate) fn capture_control() -> CaptureControl {
    match CAPTURE.get(0) {
        Some(c) => *c,
        None => CaptureControl::default(),
    }
}

#[inline(always)]
fn capture_lost(reason: u32) {
    if let Some(p) = CAPTURE_LOST.get_ptr_mut(reason) {
        unsafe { *p += 1 };
    }
}

#[inline(always)]
pub(crate) fn header(kind: u32) -> EventHeader {
    EventHeader {
        kind,
        cpu: unsafe { bpf_get_smp_processor_id() },
        ts: unsafe { bpf_ktime_get_boot_ns() },
    }
}

/// Ring buffer submit flags of a record that user space polls for: the
/// timeline's and fault samples, many a second, where a wakeup per record
/// would cost an irq_work each.
pub(crate) const RING_POLLED: u64 = BPF_RB_NO_WAKEUP as u64;
/// Of a record that wakes a reader waiting on the ring: a long block's,
/// a few a second at most per thread. The kernel's adaptive wakeup (no
/// flag) wakes only a reader that had caught up, so an off-CPU-only
/// capture's drain sleeps until one comes instead of polling
/// (`events::drain::Pace`). The perf array wakes its reader per its own
/// watermark either way.
pub(crate) const RING_WAKES: u64 = 0;

/// Writes one capture record to the transport chosen at load. `ctx` is the
/// program's context (bpf_perf_event_output needs it). Either way a record
/// that does not fit is counted in CAPTURE_LOST[lost] on this CPU.
#[inline(always)]
pub(crate) fn emit<T: 'static>(ctx: *mut c_void, ev: T, lost: u32, ring_flags: u64) {
    if setting(&CAPTURE_TRANSPORT) == capture::TRANSPORT_PERF_ARRAY {
        // aya-ebpf's PerfEventByteArray::output drops the helper's return
        // value; call it directly to see -ENOSPC (perf buffer full).
        let ret = unsafe {
            bpf_perf_event_output(
                ctx,
                &CAPTURE_PERF as *const _ as *mut c_void,
                BPF_F_CURRENT_CPU,
                &ev as *const T as *mut c_void,
                core::mem::size_of::<T>() as u64,
            )
        };
        if ret != 0 {
            capture_lost(lost);
        }
        return;
    }
    if !capture_maps::ring_write(ev, ring_flags) {
        capture_lost(lost);
    }
}

/// `emit` for a record built in a map (too large for the BPF stack).
#[inline(always)]
pub(crate) fn emit_ref<T: 'static>(ctx: *mut c_void, ev: &T, lost: u32, ring_flags: u64) {
    let ret = if setting(&CAPTURE_TRANSPORT) == capture::TRANSPORT_PERF_ARRAY {
        unsafe {
            bpf_perf_event_output(
                ctx,
                &CAPTURE_PERF as *const _ as *mut c_void,
                BPF_F_CURRENT_CPU,
                ev as *const T as *mut c_void,
                core::mem::size_of::<T>() as u64,
            )
        }
    } else {
        capture_maps::ring_output(ev, ring_flags)
    };
    if ret != 0 {
        capture_lost(lost);
    }
}

#[inline(always)]
pub(crate) fn emit_switch(
    ctx: *mut c_void,
    prev: u32,
    prev_state: i64,
    next: u32,
    prev_prio: i32,
    next_prio: i32,
    comm: [u8; 16],
    next_tgid: u32,
) {
    emit(
        ctx,
        SwitchEvent {
            hdr: header(capture::KIND_SWITCH),
            prev_state,
            prev_pid: prev as i32,
            prev_prio,
            next_pid: next as i32,
            next_prio,
            next_comm: comm,
            prev_tgid: (bpf_get_current_pid_tgid() >> 32) as u32,
            next_tgid,
        },
        capture::lost::SCHED,
        RING_POLLED,
    );
}

/// A char[16] comm from the tracepoint context as two 8-byte loads at
/// constant offsets (the verifier rejects loads through a ctx pointer that
/// was moved first, which is what a 16-byte copy compiles to).
#[inline(always)]
pub(crate) unsafe fn ctx_comm(base: *const u8, off: usize) -> [u64; 2] {
    unsafe {
        [
            core::ptr::read_volatile(base.add(off) as *const u64),
            core::ptr::read_volatile(base.add(off + 8) as *const u64),
        ]
    }
}

#[inline(always)]
fn emit_waking(ctx: *mut c_void, pid: i32, prio: i32, target_cpu: i32, comm: [u8; 16]) {
    emit(
        ctx,
        WakingEvent {
            hdr: header(capture::KIND_WAKING),
            pid,
            prio,
            target_cpu,
            _pad: 0,
            comm,
        },
        capture::lost::SCHED,
        RING_POLLED,
    );
}

/// Capture only: attached for the duration of a capture.
#[tracepoint(category = "sched", name = "sched_waking")]
pub fn sched_waking(ctx: TracePointContext) -> u32 {
    let c = capture_control();
    let flags = c.flags;
    if flags & (capture::FLAG_SCHED | capture::FLAG_OFFCPU) != 0 {
        let f = unsafe {
            (
                ctx.read_at::<i32>(setting(&WAKING_PID_OFF) as usize),
                ctx.read_at::<i32>(setting(&WAKING_PRIO_OFF) as usize),
                ctx.read_at::<i32>(setting(&WAKING_TARGET_CPU_OFF) as usize),
                ctx.read_at::<[u8; 16]>(setting(&WAKING_COMM_OFF) as usize),
            )
        };
        if let (Ok(pid), Ok(prio), Ok(cpu), Ok(comm)) = f {
            if flags & capture::FLAG_SCHED != 0 {
                emit_waking(ctx.as_ptr(), pid, prio, cpu, comm);
            }
            crate::offcpu_capture::on_waking(&ctx, &c, pid, comm);
        }
    }
    0
}

#[tracepoint(category = "sched", name = "sched_waking")]
pub fn sched_waking_fixed(ctx: TracePointContext) -> u32 {
    let c = capture_control();
    let flags = c.flags;
    if flags & (capture::FLAG_SCHED | capture::FLAG_OFFCPU) != 0 {
        let base = ctx.as_ptr() as *const u8;
        let (pid, prio, cpu, comm) = unsafe {
            (
                *(base.add(fixed_layout::WAKING_PID as usize) as *const i32),
                *(base.add(fixed_layout::WAKING_PRIO as usize) as *const i32),
                *(base.add(fixed_layout::WAKING_TARGET_CPU as usize) as *const i32),
                ctx_comm(base, fixed_layout::WAKING_COMM as usize),
            )
        };
        let comm = unsafe { core::mem::transmute::<[u64; 2], [u8; 16]>(comm) };
        if flags & capture::FLAG_SCHED != 0 {
            emit_waking(ctx.as_ptr(), pid, prio, cpu, comm);
        }
        crate::offcpu_capture::on_waking(&ctx, &c, pid, comm);
    }
    0
}

/// Capture only: one fault in `fault_period` of each process goes to the
/// ring buffer with its user stack.
#[inline(always)]
pub(crate) fn maybe_sample_fault<C: StackIdContext + EbpfContext>(ctx: &C) {
    let c = capture_control();
    if c.flags & capture::FLAG_FAULTS == 0 {
        return;
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    let (tid, tgid) = (pid_tgid as u32, (pid_tgid >> 32) as u32);
    if tgid == 0 {
        return;
    }
    match capture_maps::fault_ctr(&tgid) {
        Some(n) => {
            let seen = unsafe { *n } + 1;
            if seen < c.fault_period {
                unsafe { *n = seen };
                return;
            }
            unsafe { *n = 0 };
        }
        None => {
            // First fault of this process in the capture: sample it.
            // The 0 lives on the stack: a `&0` becomes a pointer into
            // .rodata, which the linker may share with a load-time setting
            // of value 0 (it did: NR_CPUS, WAKE_ARRAY), so the loader's
            // override changed it; and bpfloader has no .rodata at all.
            let mut zero = 0u32;
            unsafe { core::ptr::write_volatile(&mut zero, 0) };
            capture_maps::fault_ctr_insert(&tgid, &zero);
        }
    }
    let stack_id = capture_maps::stack_id(ctx, BPF_F_USER_STACK as u64);
    if stack_id < 0 && stack_id != capture_maps::SLOT_EMPTY {
        capture_lost(capture::lost::STACK);
    }
    emit(
        ctx.as_ptr(),
        FaultEvent {
            hdr: header(capture::KIND_FAULT),
            tgid,
            tid,
            stack_id,
        },
        capture::lost::FAULT,
        RING_POLLED,
    );
}
