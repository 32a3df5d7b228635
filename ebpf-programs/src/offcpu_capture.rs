//! Capture tier, off-CPU (issue #24 part 2): the two stacks of every long
//! block of a watched thread. At its switch-out while blocked the thread's
//! own stacks (it is still `current`) go into `OFFCPU_START`; the
//! sched_waking that ends the block, running in the waker's context, takes
//! the waker's stacks and, when the block lasted at least
//! `CaptureControl::offcpu_min_ns`, emits one `OffcpuEvent` through the
//! capture transport. Only called inside the programs' capture branches
//! (FLAG_SCHED or FLAG_OFFCPU set: an off-CPU capture may run without the
//! sched timeline), so the always-on path pays nothing for it.

use aya_ebpf::{
    bindings::BPF_F_USER_STACK,
    helpers::bpf_ktime_get_boot_ns,
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid},
    macros::map,
    maps::{HashMap, LruHashMap},
    programs::tracing::StackIdContext,
    EbpfContext,
};
use vitals_common::{capture, OffcpuEvent, OffcpuStart, PREV_STATE_BLOCKED_MASK};

use crate::capture_tier::{capture_control, emit, header, CAPTURE_STACKS};

/// tid -> its switch-out while blocked. LRU: a thread that exits blocked
/// (or whose waking is never seen) ages out instead of filling the map.
/// Sized by the loader like the capture's other maps (1 entry without one).
#[map(name = "OFFCPU_START")]
static OFFCPU_START: LruHashMap<u32, OffcpuStart> = LruHashMap::with_max_entries(1, 0);

/// tgid -> 1: the watched processes (`CaptureControl::offcpu_scope` ==
/// OFFCPU_SCOPE_WATCHED), written by user space before it sets the flag.
/// Preallocated (a run-time allocated hash in a tracing program draws the
/// verifier's "unsafe" warning); 64 entries of 8 bytes is a few KiB.
#[map(name = "OFFCPU_WATCH")]
static OFFCPU_WATCH: HashMap<u32, u32> =
    HashMap::with_max_entries(capture::OFFCPU_WATCH_MAX_TGIDS, 0);

/// A stack id, or the helper's negative error: a kernel thread has no user
/// stack, which is not a loss, so nothing is counted here.
#[inline(always)]
fn stack<C: StackIdContext>(ctx: &C, flags: u64) -> i64 {
    match ctx.get_stackid(&CAPTURE_STACKS, flags) {
        Ok(id) => id,
        Err(e) => e as i64,
    }
}

/// sched_switch, capture branch: `prev` (still `current`) switches out with
/// the classic tracepoint's `prev_state`. A blocked thread of the watched
/// process leaves its user and kernel stacks for `on_waking`.
#[inline(always)]
pub(crate) fn on_switch_out<C: StackIdContext>(ctx: &C, prev: u32, prev_state: i64) {
    let c = capture_control();
    if c.flags & capture::FLAG_OFFCPU == 0 || prev_state & PREV_STATE_BLOCKED_MASK == 0 || prev == 0
    {
        return;
    }
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    // Read only with the flag on: the always-on path never gets here.
    if c.offcpu_scope == capture::OFFCPU_SCOPE_WATCHED
        && unsafe { OFFCPU_WATCH.get(&tgid) }.is_none()
    {
        return;
    }
    let start = OffcpuStart {
        ts: unsafe { bpf_ktime_get_boot_ns() },
        prev_state,
        // At sched_switch the regs are the kernel's; with BPF_F_USER_STACK
        // the kernel walks from task_pt_regs(current), the user regs saved
        // at its last kernel entry (get_perf_callchain).
        user_stack: stack(ctx, BPF_F_USER_STACK as u64),
        kernel_stack: stack(ctx, 0),
        tgid,
        _pad: 0,
    };
    let _ = OFFCPU_START.insert(&prev, &start, 0);
}

/// sched_waking, capture branch: `pid` (named `comm`) is being woken by
/// `current`. Ends the block `on_switch_out` recorded, if any; a long one
/// is emitted.
#[inline(always)]
pub(crate) fn on_waking<C: StackIdContext + EbpfContext>(ctx: &C, pid: i32, comm: [u8; 16]) {
    let c = capture_control();
    if c.flags & capture::FLAG_OFFCPU == 0 || pid <= 0 {
        return;
    }
    let tid = pid as u32;
    let start = match OFFCPU_START.get_ptr(&tid) {
        Some(p) => unsafe { *p },
        None => return,
    };
    let _ = OFFCPU_START.remove(&tid);
    let hdr = header(capture::KIND_OFFCPU);
    if hdr.ts < start.ts || hdr.ts - start.ts < c.offcpu_min_ns {
        return;
    }
    let waker = bpf_get_current_pid_tgid();
    emit(
        ctx.as_ptr(),
        OffcpuEvent {
            hdr,
            blocked_ts: start.ts,
            tid,
            tgid: start.tgid,
            waker_tid: waker as u32,
            waker_tgid: (waker >> 32) as u32,
            prev_state: start.prev_state,
            blocked_user_stack: start.user_stack,
            blocked_kernel_stack: start.kernel_stack,
            waker_user_stack: stack(ctx, BPF_F_USER_STACK as u64),
            waker_kernel_stack: stack(ctx, 0),
            comm,
            waker_comm: bpf_get_current_comm().unwrap_or_default(),
        },
        capture::lost::OFFCPU,
    );
}
