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
    helpers::{bpf_get_current_pid_tgid, bpf_get_smp_processor_id, bpf_ktime_get_ns},
    macros::{btf_tracepoint, map, tracepoint},
    maps::Array,
    programs::{BtfTracePointContext, TracePointContext},
    EbpfContext,
};
use core::ptr::read_volatile;
use vitals_common::{drop_reason, fixed_layout, mapped, offcpu, OffcpuRecord, WakerKey, WakerSlot};

use crate::{count_drop, live_task_slot, setting, task_field, TASK_PID_OFF, WAKING_PID_OFF};

// ---- load-time settings (.rodata) ----

/// 1: off-CPU accounting on (the loader sets it with the sched_waking
/// program attached); 0: sched_switch skips `on_switch_out`.
#[no_mangle]
static TRACK_OFFCPU: u32 = 0;
/// A block at least this long (µs) counts in `long_blocks`. u32 like
/// every other setting: up to 71 minutes.
#[no_mangle]
static LONG_BLOCK_US: u32 = 16_000;
/// WAKERS' slots per CPU region (`sampling.max_waker_pairs`) and its
/// regions per half (the possible CPUs); 0 until the loader sets them.
#[no_mangle]
static WAKER_SLOTS: u32 = 0;
#[no_mangle]
static WAKER_CPUS: u32 = 0;

/// (wakee tgid, waker tgid) -> wakeups and the blocked time they ended,
/// read by user space through mmap (no bpf() lookup: see `mapped`), so
/// an array, not a hash: two halves of `WAKER_CPUS` regions of
/// `WAKER_SLOTS` `WakerSlot`s, slot
/// `half * (cpus * slots) + cpu * slots + probe`. A pair's slot is
/// found by open addressing from its hash (`WAKER_PROBES` probes); a pair
/// that finds none is counted in `WAKER_MAP_FULL`.
///
/// No atomics (Linux 5.10 has no BPF cmpxchg) and no race: each CPU
/// writes only its own region, and sched_waking's program neither
/// migrates nor nests in itself on a CPU: try_to_wake_up fires it with
/// the wakee's pi_lock held, interrupts off (the `p == current` case,
/// preemption off only, ends no block and writes nothing here), and the
/// kernel skips a nested run anyway (bpf_prog_active for the classic
/// tracepoint, the program's `active` count for tp_btf).
///
/// User space zeroes the half not in `WAKER_HALF`, then makes it the
/// active one; it reads each half once a tick after it stopped being
/// active, when no program writes it any more, and sums the deltas.
#[map(name = "WAKERS")]
static WAKERS: Array<WakerSlot> = Array::with_max_entries(1, mapped::BPF_F_MMAPABLE);

/// WAKERS' active half, entry 0 (user space writes it through mmap).
#[map(name = "WAKER_HALF")]
static WAKER_HALF: Array<u32> = Array::with_max_entries(1, mapped::BPF_F_MMAPABLE);

/// At `prev`'s switch-out, in its own context: begins a block in S or D
/// (`offcpu::STATE_*`), or clears one a missed wakeup left.
#[inline(always)]
pub(crate) fn on_switch_out(t: &mut OffcpuRecord, state: u32, now: u64) {
    if setting(&TRACK_OFFCPU) == 0 {
        return;
    }
    t.begin(state, now);
}

/// A block `on_waking` ended: what the off-CPU capture needs of it
/// (`offcpu_capture::on_waking_btf`), so that on tp_btf the capture keeps
/// no copy of every block's start (README, "Off-CPU captures").
pub(crate) struct EndedBlock {
    /// bpf_ktime_get_ns() (CLOCK_MONOTONIC) at its switch-out.
    pub start_ns: u64,
    pub blocked_ns: u64,
    /// `offcpu::STATE_S` or `STATE_D`.
    pub state: u32,
    pub tgid: u32,
}

/// At sched_waking of `pid`, in the waker's context: ends its block, if
/// one is in flight (a task woken while still running has none), and
/// returns it.
#[inline(always)]
pub(crate) fn on_waking(pid: i32) -> Option<EndedBlock> {
    if pid <= 0 {
        return None;
    }
    let t = live_task_slot(pid as u32)?;
    let (start, state) = t.offcpu.in_flight()?;
    t.offcpu.block_start = 0;
    let now = unsafe { bpf_ktime_get_ns() };
    if now <= start {
        return None;
    }
    let blocked_ns = now - start;
    match state {
        offcpu::STATE_S => t.offcpu.blocked_s_ns += blocked_ns,
        _ => t.offcpu.blocked_d_ns += blocked_ns,
    }
    // u32 counts wrap; user space widens them (`TaskRecord`).
    t.offcpu.wakeups = t.offcpu.wakeups.wrapping_add(1);
    if blocked_ns >= setting(&LONG_BLOCK_US) as u64 * 1000 {
        t.offcpu.long_blocks = t.offcpu.long_blocks.wrapping_add(1);
    }
    let key = WakerKey {
        wakee_tgid: t.tgid,
        waker_tgid: (bpf_get_current_pid_tgid() >> 32) as u32,
    };
    count_waker(&key, blocked_ns);
    Some(EndedBlock {
        start_ns: start,
        blocked_ns,
        state,
        tgid: t.tgid,
    })
}

/// Adds one wakeup ending `blocked_ns` to `key`'s slot in this CPU's
/// region of the active half, claiming a free slot on first sight.
#[inline(always)]
fn count_waker(key: &WakerKey, blocked_ns: u64) {
    let slots = setting(&WAKER_SLOTS);
    if slots == 0 {
        return;
    }
    // Read once, so this wakeup's counts all go to one half even if
    // user space flips it meanwhile.
    let half = match WAKER_HALF.get_ptr(0) {
        Some(p) => (unsafe { read_volatile(p) }) & 1,
        None => return,
    };
    let cpu = unsafe { bpf_get_smp_processor_id() };
    let region = (half * setting(&WAKER_CPUS) + cpu) * slots;
    let hash = offcpu::waker_hash(key);
    for probe in 0..offcpu::WAKER_PROBES {
        let index = region + hash.wrapping_add(probe) % slots;
        let Some(s) = WAKERS.get_ptr_mut(index) else {
            break;
        };
        let s = unsafe { &mut *s };
        if s.key.wakee_tgid == 0 {
            s.key = *key;
        } else if s.key != *key {
            continue;
        }
        s.counters.wakeups += 1;
        s.counters.blocked_ns += blocked_ns;
        return;
    }
    count_drop(drop_reason::WAKER_MAP_FULL);
}

/// Portable variant: `pid`'s offset from the format file. sched_waking
/// shares sched_wakeup's template (sched_wakeup_template), so its `pid`
/// sits where sched_wakeup's does and the always-on layout applies.
#[tracepoint(category = "sched", name = "sched_waking")]
pub fn offcpu_waking(ctx: TracePointContext) -> u32 {
    let pid = unsafe { ctx.read_at::<i32>(setting(&WAKING_PID_OFF) as usize) }.unwrap_or(0);
    let _ = on_waking(pid);
    0
}

#[tracepoint(category = "sched", name = "sched_waking")]
pub fn offcpu_waking_fixed(ctx: TracePointContext) -> u32 {
    let base = ctx.as_ptr() as *const u8;
    let _ = on_waking(unsafe { *(base.add(fixed_layout::WAKING_PID as usize) as *const i32) });
    0
}

/// Arguments: (struct task_struct *p).
#[btf_tracepoint(function = "sched_waking")]
pub fn offcpu_waking_btf(ctx: BtfTracePointContext) -> u32 {
    let p: *const u8 = ctx.arg(0);
    let ended = on_waking(unsafe { task_field::<i32>(p, &TASK_PID_OFF) });
    // An off-CPU capture's blocks end here where this program runs (the
    // wakee's task at hand for its kernel stack); one array load else.
    crate::offcpu_capture::on_waking_btf(&ctx, p, ended);
    0
}
