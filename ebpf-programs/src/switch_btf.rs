//! The tp_btf sched_switch programs, one per prototype of the raw
//! tracepoint (the loader attaches the one the kernel's BTF declares), and
//! what they share.
//!
//! A raw tracepoint skips what a classic one does before the program runs
//! (perf_trace_sched_switch filling a perf buffer record, trace_call_bpf),
//! and it is not skipped while user space is inside a bpf() syscall on
//! this CPU (raw tracepoints use a per-program recursion guard, not
//! bpf_prog_active), so the reader's own map reads cannot hide a switch.

use aya_ebpf::{macros::btf_tracepoint, programs::BtfTracePointContext, EbpfContext};
use vitals_common::{capture, reported_prev_state};

use crate::{
    capture_tier::{capture_control, emit_switch},
    offcpu_capture, on_switch, sched_info, task_comm, task_field, TASK_EXIT_STATE_OFF,
    TASK_PID_OFF, TASK_PRIO_OFF, TASK_TGID_OFF,
};

/// `task_struct.__state` (5.14+) or `state` (a `long` before): the
/// pre-5.18 program reads its low 32 bits (the bpfel target is
/// little-endian; every state bit is below bit 13).
#[no_mangle]
static TASK_STATE_OFF: u32 = 0;

/// Arguments: (bool preempt, struct task_struct *prev, struct task_struct
/// *next, unsigned int prev_state), since Linux 5.18 (prev_state moved to
/// the end): `prev_state` is the state __schedule loaded and decided by.
#[btf_tracepoint(function = "sched_switch")]
pub fn sched_switch_btf(ctx: BtfTracePointContext) -> u32 {
    let preempt: u64 = ctx.arg(0);
    let prev_task: *const u8 = ctx.arg(1);
    let next_task: *const u8 = ctx.arg(2);
    let prev_state: u64 = ctx.arg(3);
    on_btf_switch(
        &ctx,
        preempt as u8 != 0,
        prev_task,
        next_task,
        prev_state as u32,
    );
    0
}

/// Before Linux 5.18 the arguments are (bool preempt, struct task_struct
/// *prev, struct task_struct *next): prev's state is read from the task,
/// as the classic tracepoint's own `__trace_sched_switch_state` does at
/// the same point. __schedule (5.10, 5.15) loaded it once, under the rq
/// lock with IRQs off, and counted nvcsw when `!preempt && prev_state`;
/// by the tracepoint the task's state can differ from that load only by
/// - signal_pending_state(): __schedule set it to TASK_RUNNING and did
///   not dequeue, yet counted nvcsw. Read here as 0, so such a switch
///   counts as involuntary where /proc/<pid>/status counts it voluntary
///   (the classic tracepoint reports it "R" alike); 5.18+ passes the
///   loaded state and has no such difference.
/// - a concurrent try_to_wake_up() on another CPU, which sees the task
///   already dequeued (on_rq 0) and stores TASK_WAKING (0x200) before
///   waiting for it to leave the CPU: non-zero, so still voluntary as
///   the kernel counted it; it reports "R" in the capture, as the classic
///   tracepoint does (0x200 is outside TASK_REPORT), and starts no
///   off-CPU block (its sched_waking has fired already).
/// No other writer can run meanwhile: wakers of a queued task take the rq
/// lock, and IRQs on this CPU are off.
#[btf_tracepoint(function = "sched_switch")]
pub fn switch_pre5_18(ctx: BtfTracePointContext) -> u32 {
    let preempt: u64 = ctx.arg(0);
    let prev_task: *const u8 = ctx.arg(1);
    let next_task: *const u8 = ctx.arg(2);
    let prev_state = unsafe { task_field::<u32>(prev_task, &TASK_STATE_OFF) };
    on_btf_switch(&ctx, preempt as u8 != 0, prev_task, next_task, prev_state);
    0
}

/// One switch seen by a tp_btf program; `prev_state` is the raw
/// `prev->__state` (`state` before 5.14).
#[inline(always)]
fn on_btf_switch(
    ctx: &BtfTracePointContext,
    preempt: bool,
    prev_task: *const u8,
    next_task: *const u8,
    prev_state: u32,
) {
    let (prev, next) = unsafe {
        (
            task_field::<i32>(prev_task, &TASK_PID_OFF) as u32,
            task_field::<i32>(next_task, &TASK_PID_OFF) as u32,
        )
    };
    // __schedule counts a voluntary switch (nvcsw) exactly when it was not
    // a preemption and the raw task state was not TASK_RUNNING.
    let blocked = !preempt && prev_state != 0;
    on_switch(
        prev,
        blocked,
        next,
        || unsafe { task_field::<i32>(prev_task, &TASK_TGID_OFF) as u32 },
        Some(sched_info::read(prev_task, next_task)),
        vitals_common::offcpu::raw_state(preempt, prev_state),
    );
    let c = capture_control();
    let sched = c.flags & capture::FLAG_SCHED != 0;
    // An off-CPU capture fed by the accounting (which just began any block
    // in `on_switch`) has nothing to do at a switch-out.
    let offcpu = c.flags & capture::FLAG_OFFCPU != 0 && !c.blocks_from_accounting();
    if !sched && !offcpu {
        return;
    }
    // The classic tracepoint's prev_state encoding, so the capture decoder
    // sees one format whichever program recorded it.
    let exit_state = unsafe { task_field::<u32>(prev_task, &TASK_EXIT_STATE_OFF) };
    let state = reported_prev_state(preempt, prev_state, exit_state);
    if sched {
        let (prev_prio, next_prio, next_tgid, comm) = unsafe {
            (
                task_field::<i32>(prev_task, &TASK_PRIO_OFF),
                task_field::<i32>(next_task, &TASK_PRIO_OFF),
                task_field::<i32>(next_task, &TASK_TGID_OFF) as u32,
                task_comm(next_task),
            )
        };
        emit_switch(
            ctx.as_ptr(),
            prev,
            state,
            next,
            prev_prio,
            next_prio,
            comm,
            // The idle task's tgid is 0 as well: "unknown" and "swapper"
            // agree.
            next_tgid,
        );
    }
    // With or without the timeline (`record --offcpu` alone).
    if offcpu {
        offcpu_capture::on_switch_out(ctx, &c, prev, state, prev_task);
    }
}
