//! Off-CPU accounting, always on while `TRACK_OFFCPU` is set: per task,
//! blocked time split by the switch-out state (S, D), blocks at least
//! `LONG_BLOCK_US` long, and per (wakee process, waker process) the
//! wakeups and the blocked time they ended (WAKERS).
//!
//! A block begins at the task's blocked switch-out (sched_switch, in its
//! own context: `on_switch_out`) and ends at the sched_waking that wakes it
//! (`on_waking`, in the waker's context). sched_waking, not sched_wakeup:
//! try_to_wake_up fires it in the waker's own context, while sched_wakeup
//! fires where the wakee is enqueued, which with TTWU_QUEUE is the target
//! CPU's IPI, where `current` is not the waker.
//!
//! The waker writes the wakee's TASKS value, which otherwise only the task
//! itself writes (see TASKS in main.rs). That is safe: try_to_wake_up
//! fires sched_waking with the wakee's pi_lock held, after
//! ttwu_state_match saw it not TASK_RUNNING and before it is enqueued, so
//! two wakers of one task are serialized and the wakee cannot run, fault
//! or switch out again until after this program returns. (The one
//! exception, `p == current`, wakes a running task, which has no block in
//! flight.) The waker only touches the off-CPU fields.
//!
//! Limits (README "Reliability"): a wakeup that lands in the few
//! instructions between the wakee's dequeue in __schedule and its
//! sched_switch tracepoint finds no block in flight and ends nothing (the
//! block that tracepoint then starts ends at the task's next wakeup or
//! switch-out). Wakeups from interrupt context (timer expiry, I/O
//! completion) are charged to the interrupted task's process: no helper
//! before Linux 6.x tells hard/soft irq context; the idle task's is tgid 0.

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::{btf_tracepoint, map, tracepoint},
    maps::HashMap,
    programs::{BtfTracePointContext, TracePointContext},
    EbpfContext,
};
use vitals_common::{drop_reason, fixed_layout, offcpu, OffcpuCounters, WakerCounters, WakerKey};

use crate::{count_drop, live_task_slot, setting, task_field, xadd, TASK_PID_OFF, WAKING_PID_OFF};

// ---- load-time settings (.rodata) ----

/// 1: off-CPU accounting on (the loader sets it with the sched_waking
/// program attached); 0: sched_switch skips `on_switch_out`.
#[no_mangle]
static TRACK_OFFCPU: u32 = 0;
/// A block at least this long (µs) counts in `long_blocks`. u32 like
/// every other setting: up to 71 minutes.
#[no_mangle]
static LONG_BLOCK_US: u32 = 16_000;

/// (wakee tgid, waker tgid) -> wakeups and the blocked time they ended.
/// Written from every CPU at once, so updated with atomic adds; bounded,
/// a pair that finds it full is counted in `WAKER_MAP_FULL`. User space
/// deletes the pairs whose wakee process has ended.
#[map(name = "WAKERS")]
static WAKERS: HashMap<WakerKey, WakerCounters> = HashMap::with_max_entries(1, 0);

/// At `prev`'s switch-out, in its own context: begins a block in S or D
/// (`offcpu::STATE_*`), or clears one a missed wakeup left.
#[inline(always)]
pub(crate) fn on_switch_out(t: &mut OffcpuCounters, state: u32, now: u64) {
    if setting(&TRACK_OFFCPU) == 0 {
        return;
    }
    t.block_state = state;
    t.block_start_ns = if state == offcpu::STATE_NONE { 0 } else { now };
}

/// At sched_waking of `pid`, in the waker's context: ends its block, if
/// one is in flight (a task woken while still running has none).
#[inline(always)]
pub(crate) fn on_waking(pid: i32) {
    if pid <= 0 {
        return;
    }
    let Some(t) = live_task_slot(pid as u32) else {
        return;
    };
    let start = t.offcpu.block_start_ns;
    if start == 0 {
        return;
    }
    t.offcpu.block_start_ns = 0;
    let now = unsafe { bpf_ktime_get_ns() };
    if now <= start {
        return;
    }
    let blocked_ns = now - start;
    match t.offcpu.block_state {
        offcpu::STATE_S => t.offcpu.blocked_s_ns += blocked_ns,
        _ => t.offcpu.blocked_d_ns += blocked_ns,
    }
    t.offcpu.wakeups += 1;
    if blocked_ns >= setting(&LONG_BLOCK_US) as u64 * 1000 {
        t.offcpu.long_blocks += 1;
    }
    let key = WakerKey {
        wakee_tgid: t.tgid,
        waker_tgid: (bpf_get_current_pid_tgid() >> 32) as u32,
    };
    count_waker(&key, blocked_ns);
}

#[inline(always)]
fn count_waker(key: &WakerKey, blocked_ns: u64) {
    if WAKERS.get_ptr_mut(key).is_none() {
        // BPF_NOEXIST: another CPU may insert the same pair now; the
        // loser's insert fails and both add to the one value.
        let _ = WAKERS.insert(key, &WakerCounters::default(), BPF_NOEXIST as u64);
    }
    match WAKERS.get_ptr_mut(key) {
        Some(v) => unsafe {
            xadd(&mut (*v).wakeups, 1);
            xadd(&mut (*v).blocked_ns, blocked_ns);
        },
        None => count_drop(drop_reason::WAKER_MAP_FULL),
    }
}

/// Portable variant: `pid`'s offset from the format file. sched_waking
/// shares sched_wakeup's template (sched_wakeup_template), so its `pid`
/// sits where sched_wakeup's does and the always-on layout applies.
#[tracepoint(category = "sched", name = "sched_waking")]
pub fn offcpu_waking(ctx: TracePointContext) -> u32 {
    let pid = unsafe { ctx.read_at::<i32>(setting(&WAKING_PID_OFF) as usize) }.unwrap_or(0);
    on_waking(pid);
    0
}

#[tracepoint(category = "sched", name = "sched_waking")]
pub fn offcpu_waking_fixed(ctx: TracePointContext) -> u32 {
    let base = ctx.as_ptr() as *const u8;
    on_waking(unsafe { *(base.add(fixed_layout::WAKING_PID as usize) as *const i32) });
    0
}

/// Arguments: (struct task_struct *p).
#[btf_tracepoint(function = "sched_waking")]
pub fn offcpu_waking_btf(ctx: BtfTracePointContext) -> u32 {
    let p: *const u8 = ctx.arg(0);
    on_waking(unsafe { task_field::<i32>(p, &TASK_PID_OFF) });
    0
}
