//! Capture tier, off-CPU (issue #24 part 2): the two stacks of every long
//! block of a watched thread. The sched_waking that ends a block, running
//! in the waker's context, takes the waker's stacks and, when the block
//! lasted at least `CaptureControl::offcpu_min_ns`, emits one
//! `OffcpuEvent` through the capture transport. Where the block comes
//! from:
//! - tp_btf with the switch-in program (`blocks_from_accounting`): the
//!   always-on accounting already times every block (`offcpu::on_waking`
//!   hands over the one it ended), so a blocking switch-out costs the
//!   capture nothing and a short block only a few compares;
//! - else the switch-out of a blocked thread (still `current`) puts its
//!   start and own stacks in `OFFCPU_START`, which the waking takes.
//!
//! Only called inside the programs' capture branches (FLAG_SCHED or
//! FLAG_OFFCPU set: an off-CPU capture may run without the sched
//! timeline), so the always-on path pays nothing for it.

use core::ffi::c_void;

use aya_ebpf::{
    bindings::{BPF_F_USER_STACK, BPF_NOEXIST},
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_boot_ns,
        generated::bpf_get_task_stack,
    },
    macros::{fentry, kprobe, map},
    maps::{Array, HashMap, PerCpuArray},
    programs::{tracing::StackIdContext, BtfTracePointContext, FEntryContext, ProbeContext},
    EbpfContext,
};
use vitals_common::{
    capture, offcpu, AwaitUserStack, CaptureControl, EventHeader, KernelIps, OffcpuEvent,
    OffcpuStart, OffcpuUserStack,
};

use crate::capture_tier::{capture_control, emit, emit_ref, header, RING_WAKES};
use crate::{
    capture_maps, offcpu::EndedBlock, task_comm, task_field, xadd, TASK_FLAGS_OFF, TASK_PID_OFF,
};

/// tgid -> 1: the watched processes (`CaptureControl::offcpu_scope` ==
/// OFFCPU_SCOPE_WATCHED), written by user space before it sets the flag.
/// Preallocated (a run-time allocated hash in a tracing program draws the
/// verifier's "unsafe" warning); 64 entries of 8 bytes is a few KiB.
#[map(name = "OFFCPU_WATCH")]
static OFFCPU_WATCH: HashMap<u32, u32> =
    HashMap::with_max_entries(capture::OFFCPU_WATCH_MAX_TGIDS, 0);

/// How many entries `OFFCPU_AWAIT_USER` holds, so that the switch-in
/// program, which runs at every switch while an off-CPU capture runs,
/// skips its lookup while none does (the usual case). An entry the
/// LRU evicts is never subtracted: the count then stays above zero and
/// costs the lookups, not correctness. User space zeroes it at a
/// capture's start, with the map.
#[map(name = "OFFCPU_AWAITING")]
static OFFCPU_AWAITING: Array<u64> = Array::with_max_entries(1, 0);

/// A stack id, or the helper's negative error: a kernel thread has no user
/// stack, which is not a loss, so nothing is counted here.
#[inline(always)]
fn stack<C: StackIdContext>(ctx: &C, flags: u64) -> i64 {
    capture_maps::stack_id(ctx, flags)
}

/// sched_switch, called with FLAG_OFFCPU set: `prev` (still `current`)
/// switches out with the classic tracepoint's `prev_state`. A blocked
/// thread of a watched process leaves its user stack for the waking that
/// ends the block, and its kernel stack too unless that waking takes it
/// (`end_block`). `prev_task` (tp_btf; null from the classic programs)
/// tells a user thread, whose user stack waits for its switch-in instead
/// (`CaptureControl::offcpu_user_at_switch_in`).
#[inline(always)]
pub(crate) fn on_switch_out<C: StackIdContext + EbpfContext>(
    ctx: &C,
    c: &CaptureControl,
    prev: u32,
    prev_state: i64,
    prev_task: *const u8,
) {
    // S and D only, the waits the accounting times (`blocks_from_accounting`
    // records no other): a stopped, parked or idle (I) task is not blocked
    // on anything that will wake it. Never called when the blocks come
    // from the accounting: the tp_btf switch skips it then, and the
    // classic programs never run with it (it needs the tp_btf waking).
    if offcpu::reported_state(prev_state) == offcpu::STATE_NONE || prev == 0 {
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
        // at its last kernel entry (get_perf_callchain), as it will at
        // the thread's switch-in.
        user_stack: if user_stack_at_switch_in(c.offcpu_user_at_switch_in, prev_task) {
            capture::USER_STACK_AT_SWITCH_IN
        } else {
            stack(ctx, BPF_F_USER_STACK as u64)
        },
        // Where the waking has the task (tp_btf), the kernel stack waits
        // for it: most blocks are short and then need none.
        kernel_stack: if c.offcpu_kernel_at_waking != 0 {
            capture::KERNEL_STACK_AT_WAKING
        } else {
            stack(ctx, 0)
        },
        tgid,
        _pad: 0,
    };
    capture_maps::offcpu_start_insert(&prev, &start);
}

/// Whether a block's user stack waits for its switch-in: the switch-in
/// program is attached and the task is a user thread (a kernel thread has
/// no user stack; the classic programs give no task to tell).
#[inline(always)]
fn user_stack_at_switch_in(enabled: u32, prev_task: *const u8) -> bool {
    enabled != 0
        && !prev_task.is_null()
        && unsafe { task_field::<u32>(prev_task, &TASK_FLAGS_OFF) } & capture::PF_KTHREAD == 0
}

/// Scratch for the record `on_waking` builds: with its kernel frames it
/// is larger than the BPF stack allows.
#[map(name = "OFFCPU_EVENT_SCRATCH")]
static OFFCPU_EVENT_SCRATCH: PerCpuArray<OffcpuEvent> = PerCpuArray::with_max_entries(1, 0);

/// sched_waking (the classic capture program), capture branch: `pid`
/// (named `comm`) is being woken by `current`. Ends the block
/// `on_switch_out` recorded, if any; a long one is emitted. Where a tp_btf
/// program ends blocks (`offcpu_kernel_at_waking`), it leaves them to it.
#[inline(always)]
pub(crate) fn on_waking<C: StackIdContext + EbpfContext>(
    ctx: &C,
    c: &CaptureControl,
    pid: i32,
    comm: [u8; 16],
) {
    if c.offcpu_kernel_at_waking == 0 {
        end_block(ctx, c, pid, comm, core::ptr::null());
    }
}

/// tp_btf sched_waking (the always-on `offcpu_waking_btf`): the same for
/// the wakee `task`, whose kernel stack a long block takes here. `ended`
/// is the block the accounting just ended, if any.
#[inline(always)]
pub(crate) fn on_waking_btf(
    ctx: &BtfTracePointContext,
    task: *const u8,
    ended: Option<EndedBlock>,
) {
    let c = capture_control();
    if c.flags & capture::FLAG_OFFCPU == 0 || c.offcpu_kernel_at_waking == 0 {
        return;
    }
    if c.blocks_from_accounting() {
        if let Some(block) = ended {
            accounted_block(ctx, &c, task, &block);
        }
        return;
    }
    let (pid, comm) = unsafe { (task_field::<i32>(task, &TASK_PID_OFF), task_comm(task)) };
    end_block(ctx, &c, pid, comm, task);
}

/// A block the accounting ended (`blocks_from_accounting`): emitted when
/// long, begun since the capture started, and of a watched process; its
/// user stack waits for the switch-in (none for a kernel thread), its
/// kernel stack is taken from `task` here.
#[inline(always)]
fn accounted_block(
    ctx: &BtfTracePointContext,
    c: &CaptureControl,
    task: *const u8,
    block: &EndedBlock,
) {
    if block.blocked_ns < c.offcpu_min_ns || block.start_ns < c.offcpu_since_ns {
        return;
    }
    if c.offcpu_scope == capture::OFFCPU_SCOPE_WATCHED
        && unsafe { OFFCPU_WATCH.get(&block.tgid) }.is_none()
    {
        return;
    }
    let hdr = header(capture::KIND_OFFCPU);
    let kthread = unsafe { task_field::<u32>(task, &TASK_FLAGS_OFF) } & capture::PF_KTHREAD != 0;
    let (pid, comm) = unsafe { (task_field::<i32>(task, &TASK_PID_OFF), task_comm(task)) };
    let block = Block {
        tid: pid as u32,
        tgid: block.tgid,
        // The accounting's clock is CLOCK_MONOTONIC, the record's
        // CLOCK_BOOTTIME: the start is placed the block's length before
        // this waking (the two differ only by a suspend within the block).
        ts: hdr.ts.saturating_sub(block.blocked_ns),
        prev_state: offcpu::classic_prev_state(block.state),
        user_stack: if kthread {
            capture::NO_USER_STACK
        } else {
            capture::USER_STACK_AT_SWITCH_IN
        },
        kernel_stack: capture::KERNEL_STACK_AT_WAKING,
    };
    emit_block(ctx, hdr, &block, comm, task);
}

/// A long block to emit, wherever it was timed.
struct Block {
    tid: u32,
    tgid: u32,
    /// CLOCK_BOOTTIME at its switch-out.
    ts: u64,
    prev_state: i64,
    user_stack: i64,
    kernel_stack: i64,
}

/// Ends `pid`'s block, if one was recorded; a long one is emitted with the
/// waker's stacks, and the blocked kernel stack from `task` (null: it was
/// taken at the switch-out).
#[inline(always)]
fn end_block<C: StackIdContext + EbpfContext>(
    ctx: &C,
    c: &CaptureControl,
    pid: i32,
    comm: [u8; 16],
    task: *const u8,
) {
    if c.flags & capture::FLAG_OFFCPU == 0 || pid <= 0 {
        return;
    }
    let tid = pid as u32;
    let Some(start) = capture_maps::offcpu_start_take(&tid) else {
        return;
    };
    let hdr = header(capture::KIND_OFFCPU);
    if hdr.ts < start.ts || hdr.ts - start.ts < c.offcpu_min_ns {
        return;
    }
    let block = Block {
        tid,
        tgid: start.tgid,
        ts: start.ts,
        prev_state: start.prev_state,
        user_stack: start.user_stack,
        kernel_stack: start.kernel_stack,
    };
    emit_block(ctx, hdr, &block, comm, task);
}

/// Emits `block` with the waker's (`current`'s) stacks; its kernel stack
/// from `task` when the block left it for the waking.
#[inline(always)]
fn emit_block<C: StackIdContext + EbpfContext>(
    ctx: &C,
    hdr: EventHeader,
    block: &Block,
    comm: [u8; 16],
    task: *const u8,
) {
    let Some(e) = OFFCPU_EVENT_SCRATCH.get_ptr_mut(0) else {
        return;
    };
    let e = unsafe { &mut *e };
    let waker = bpf_get_current_pid_tgid();
    e.hdr = hdr;
    e.blocked_ts = block.ts;
    e.tid = block.tid;
    e.tgid = block.tgid;
    e.waker_tid = waker as u32;
    e.waker_tgid = (waker >> 32) as u32;
    e.prev_state = block.prev_state;
    e.blocked_user_stack = block.user_stack;
    e.blocked_kernel_stack = block.kernel_stack;
    e.waker_user_stack = stack(ctx, BPF_F_USER_STACK as u64);
    e.waker_kernel_stack = stack(ctx, 0);
    e.comm = comm;
    e.waker_comm = bpf_get_current_comm().unwrap_or_default();
    e.blocked_kernel_len = 0;
    if !task.is_null() && block.kernel_stack == capture::KERNEL_STACK_AT_WAKING {
        // The wakee is off the CPU, its kernel stack as it blocked
        // (stack_trace_save_tsk); bytes written, or the error.
        let ret = unsafe {
            bpf_get_task_stack(
                task as *mut _,
                e.blocked_kernel_ips.0.as_mut_ptr() as *mut c_void,
                core::mem::size_of::<KernelIps>() as u32,
                0,
            )
        };
        e.blocked_kernel_len = if ret < 0 {
            ret as i32
        } else {
            (ret / 8) as i32
        };
    }
    if block.user_stack == capture::USER_STACK_AT_SWITCH_IN {
        await_user_stack(block.tid, block.ts);
    }
    emit_ref(ctx.as_ptr(), e, capture::lost::OFFCPU, RING_WAKES);
}

/// Leaves `tid`'s long block for its switch-in. An entry already there
/// (a block whose switch-in went unseen) stays: the thread has not been
/// back in user mode since, so one record covers both.
#[inline(always)]
fn await_user_stack(tid: u32, since_ts: u64) {
    let w = AwaitUserStack { since_ts };
    if capture_maps::await_user_insert_new(&tid, &w, BPF_NOEXIST as u64) {
        if let Some(n) = OFFCPU_AWAITING.get_ptr_mut(0) {
            xadd(n, 1);
        }
    }
}

/// finish_task_switch, attached during an off-CPU capture with
/// `offcpu_user_at_switch_in`: `current` has just switched in and is not
/// yet back in user mode, so task_pt_regs(current) still holds the user
/// registers it blocked with. If a long block of it awaits its user
/// stack, the walk is the blocked one's, whether it blocked in a syscall
/// or in a page fault. bcc's offwaketime takes its blocked stacks here.
/// fentry where the kernel finds the function by its BTF name; else a
/// kprobe on the name kallsyms has (`finish_task_switch.isra.0`).
#[fentry(function = "finish_task_switch")]
pub fn offcpu_switch_in_fentry(ctx: FEntryContext) -> u32 {
    on_switch_in(&ctx);
    0
}

/// The same as a kprobe (`offcpu_switch_in_fentry`).
#[kprobe]
pub fn offcpu_switch_in(ctx: ProbeContext) -> u32 {
    on_switch_in(&ctx);
    0
}

#[inline(always)]
fn on_switch_in<C: StackIdContext + EbpfContext>(ctx: &C) {
    // At every switch while attached: the usual exit (no block waits)
    // first, one array read; the capture's control block (a copy of the
    // struct) only when one does. The flag still matters then: between a
    // capture's end (flag cleared) and the detach, nothing is emitted.
    let Some(awaiting) = OFFCPU_AWAITING.get_ptr_mut(0) else {
        return;
    };
    if unsafe { core::ptr::read_volatile(awaiting) } == 0 {
        return;
    }
    let c = capture_control();
    if c.flags & capture::FLAG_OFFCPU == 0 || c.offcpu_user_at_switch_in == 0 {
        return;
    }
    let id = bpf_get_current_pid_tgid();
    let tid = id as u32;
    let Some((w, removed)) = capture_maps::await_user_take(&tid) else {
        return;
    };
    if removed {
        xadd(awaiting, u64::MAX);
    }
    emit(
        ctx.as_ptr(),
        OffcpuUserStack {
            hdr: header(capture::KIND_OFFCPU_USER_STACK),
            since_ts: w.since_ts,
            tid,
            tgid: (id >> 32) as u32,
            user_stack: stack(ctx, BPF_F_USER_STACK as u64),
        },
        capture::lost::OFFCPU,
        RING_WAKES,
    );
}
