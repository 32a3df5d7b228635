//! vitalsd's always-on accounting programs.
//!
//! Every map holds monotonic counters; user space takes deltas and never
//! clears a live map. The per-event path is kept to the minimum number of
//! map operations because every one of them shows up in `perf bench sched
//! pipe` (see `cargo xtask bench overhead`): sched_switch does one per-CPU
//! array access, one hash lookup for the task switching out and one for the
//! task switching in (plus one update when the task switching out was
//! preempted).
//!
//! Only helpers and instructions of Linux 5.10 (the floor, Android GKI
//! 5.10) are needed on the always-on path; see `daemon/src/bpf/features.rs`
//! for what each part needs and what the daemon does below it.
//!
//! This file holds the load-time settings, the accounting maps and the
//! always-on programs; `capture_tier` the capture maps, record output and
//! the capture-only programs; `faults` the fault-counting programs.
#![no_std]
#![no_main]
// For the one inline `lock ... +=` (BPF_XADD) in `xadd`: the bpf target
// has no compare-and-swap, so core's atomics offer no fetch_add there.
// aya-ebpf turns on the same feature on bpf targets.
#![cfg_attr(target_arch = "bpf", feature(asm_experimental_arch))]

mod blind_window;
mod capture_maps;
mod capture_tier;
mod exec;
mod faults;
mod free;
mod mapped;
#[cfg(feature = "miss-log")]
mod miss_log;
mod offcpu;
mod offcpu_capture;
mod sched_info;
mod switch_btf;

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::{btf_tracepoint, map, tracepoint},
    maps::{Array, HashMap},
    programs::{BtfTracePointContext, TracePointContext},
    EbpfContext,
};
use capture_tier::{capture_control, ctx_comm, emit_switch};
use vitals_common::{
    capture, drop_reason, fixed_layout, ExitKey, ExitedTask, FaultCounters, TaskRecord,
    PREV_STATE_BLOCKED_MASK,
};

// ---- load-time settings (.rodata, set by the loader; the verifier treats
// frozen .rodata as constants, so reading them costs nothing) ----

#[no_mangle]
static SWITCH_PREV_PID_OFF: u32 = 24;
#[no_mangle]
static SWITCH_PREV_STATE_OFF: u32 = 32;
#[no_mangle]
static SWITCH_NEXT_PID_OFF: u32 = 56;
#[no_mangle]
static WAKEUP_PID_OFF: u32 = 24;
/// 0 (bpfloader): sched_process_free tells it (`free_pid_offset`).
#[no_mangle]
static FREE_PID_OFF: u32 = 0;
/// 0: runqueue-wait accounting off (no wakeup programs attached either).
#[no_mangle]
static TRACK_WAIT: u32 = 1;
/// 1: WAKE_TS_ARRAY (indexed by tid, sized pid_max) holds wakeup times;
/// 0: the WAKE_TS hash does. The verifier prunes the branch not taken.
#[no_mangle]
static WAKE_ARRAY: u32 = 0;
// Capture-mode field offsets for the portable programs.
#[no_mangle]
static SWITCH_PREV_PRIO_OFF: u32 = 28;
#[no_mangle]
static SWITCH_NEXT_COMM_OFF: u32 = 40;
#[no_mangle]
static SWITCH_NEXT_PRIO_OFF: u32 = 60;
#[no_mangle]
static WAKING_COMM_OFF: u32 = 8;
#[no_mangle]
static WAKING_PID_OFF: u32 = 24;
#[no_mangle]
static WAKING_PRIO_OFF: u32 = 28;
#[no_mangle]
static WAKING_TARGET_CPU_OFF: u32 = 32;
/// Capture transport, `capture::TRANSPORT_*`: 0 = CAPTURE_EVENTS ring
/// buffer, 1 = CAPTURE_PERF perf event array. Frozen .rodata, so the
/// verifier only walks the branch taken: a kernel without ringbuf never
/// verifies a bpf_ringbuf_* call (see `emit`).
#[no_mangle]
static CAPTURE_TRANSPORT: u32 = 0;
/// 1: the capture's large maps are the ones user space puts in the
/// `SLOT_*` outers for each capture; 0 (bpfloader's): the plain maps
/// (`capture_maps`).
#[no_mangle]
static PER_CAPTURE_MAPS: u32 = 0;
/// 1: freed tasks' records go to EXITED_RING; 0: the EXITED hash, without
/// ring buffers (`mapped::store_exited`). Default 1 for bpfloader.
#[no_mangle]
static EXIT_RING: u32 = 1;
/// task_struct field offsets from the running kernel's BTF, for the
/// `*_btf` programs (the loader sets them when it attaches those).
#[no_mangle]
static TASK_PID_OFF: u32 = 0;
#[no_mangle]
static TASK_TGID_OFF: u32 = 0;
#[no_mangle]
static TASK_PRIO_OFF: u32 = 0;
#[no_mangle]
static TASK_COMM_OFF: u32 = 0;
#[no_mangle]
static TASK_EXIT_STATE_OFF: u32 = 0;
/// `flags` (PF_*): an off-CPU capture tells kernel threads by it.
#[no_mangle]
static TASK_FLAGS_OFF: u32 = 0;
/// `se.sum_exec_runtime` (struct sched_entity inside task_struct).
#[no_mangle]
static TASK_SUM_EXEC_OFF: u32 = 0;
/// `sched_info.run_delay`; 0: the kernel has no CONFIG_SCHED_INFO (or the
/// classic programs run), runqueue wait comes from the wakeup programs.
#[no_mangle]
static TASK_RUN_DELAY_OFF: u32 = 0;

#[inline(always)]
fn setting(v: &'static u32) -> u32 {
    // read_volatile keeps the compiler from folding the default value in.
    unsafe { core::ptr::read_volatile(v) }
}

// ---- maps; the max_entries here are placeholders the loader overrides ----

/// tid -> counters, a plain hash (not per-CPU): one task's value is only
/// ever written from that task's own context, so its updates are
/// serialized by construction and per-CPU slots would buy nothing.
/// - sched_switch writes `prev`, which is `current` (the tracepoint fires
///   in __schedule before context_switch), with the rq lock held and IRQs
///   off; the fault programs write `current` too: the page_fault_user
///   tracepoint and the perf software events fire in the faulting task's
///   context. All of them run with preemption disabled (tracepoints call
///   their programs under preempt_disable_notrace, perf_sw_event disables
///   preemption), and a task runs on one CPU at a time: before it can run
///   (or fault) on another CPU, its switch-out here has finished
///   (finish_task's smp_store_release of on_cpu, paired with the
///   smp_cond_load_acquire in try_to_wake_up / the migration checks).
/// - Even if a fault program were preempted by its own task's switch, the
///   two write different fields (faults vs. time and switches; both write
///   the same tgid).
/// - The idle tasks, one per CPU and all pid 0, would break this: their
///   time goes to `CpuState::idle_ns` instead, never under key 0.
/// - sched_process_free reads and deletes the value after the task can no
///   longer run. (A tid is free for reuse once release_task has freed the
///   pid, an RCU grace period *before* sched_process_free fires; a new task
///   given that tid within the grace period would share the old one's value
///   until the free deletes it. alloc_pid hands out pids cyclically, so that
///   takes a pid_max wrap-around within a grace period.)
/// One value: sched_process_free needs one lookup (no 5.19
/// bpf_map_lookup_percpu_elem), and 1/ncpus of a per-CPU hash's memory.
#[map(name = "TASKS")]
static TASKS: HashMap<u32, TaskRecord> = HashMap::with_max_entries(16384, 0);
/// One all-zero TaskRecord, never written; `task_slot` inserts it.
#[map(name = "ZERO_TASK")]
static ZERO_TASK: Array<TaskRecord> = Array::with_max_entries(1, 0);

/// tgid -> fault counters of the whole process (survives thread exits).
/// Threads of a process fault concurrently on several CPUs, so every
/// update is an atomic add (`xadd`).
#[map(name = "PROCESS_FAULTS")]
static PROCESS_FAULTS: HashMap<u32, FaultCounters> = HashMap::with_max_entries(8192, 0);

/// tid -> CLOCK_MONOTONIC ns at which it became runnable (0 = not waiting).
/// Shared across CPUs because the waker and the wakee's CPU differ. Keys are
/// zeroed, not deleted, at switch-in so the steady state needs no insert.
#[map(name = "WAKE_TS")]
static WAKE_TS: HashMap<u32, u64> = HashMap::with_max_entries(16384, 0);

/// Same as WAKE_TS, as an array indexed by tid, used when pid_max is small
/// enough (the loader decides): array lookups are inlined by the verifier,
/// hash lookups are helper calls with hashing, and this one runs on every
/// wakeup and every switch-in.
#[map(name = "WAKE_TS_ARRAY")]
static WAKE_TS_ARRAY: Array<u64> = Array::with_max_entries(1, 0);

/// (free time, tid) -> final counters and comm of a freed task, drained
/// (read then deleted) by user space each sample.
#[map(name = "EXITED")]
static EXITED: HashMap<ExitKey, ExitedTask> = HashMap::with_max_entries(4096, 0);

// CPU_STATE (per-CPU scheduler state) and DROPS (per-CPU drop counters,
// by `drop_reason`) are arrays user space reads through mmap: `mapped`.
use mapped::count_drop;

/// `tid`'s counters, inserting zeroed ones on first sight. Called from
/// `tid`'s own context only (see TASKS), never for tid 0.
#[inline(always)]
fn task_slot(tid: u32) -> Option<&'static mut TaskRecord> {
    // Below pid_max (as the loader sized it): the mmap-read array.
    if let Some(t) = mapped::task_slot(tid) {
        return Some(t);
    }
    if let Some(p) = TASKS.get_ptr_mut(tid) {
        return Some(unsafe { &mut *p });
    }
    // -E2BIG when full. BPF_NOEXIST: only this task inserts its tid (see
    // TASKS). From ZERO_TASK: a zeroed value on the stack is a memset call
    // whose loop 5.10's verifier gives up on in bpfloader's object.
    let zero = ZERO_TASK.get_ptr(0)?;
    let _ = TASKS.insert(tid, unsafe { &*zero }, BPF_NOEXIST as u64);
    match TASKS.get_ptr_mut(tid) {
        Some(p) => {
            let t = unsafe { &mut *p };
            if t.born_ns == 0 {
                t.born_ns = unsafe { bpf_ktime_get_ns() };
            }
            Some(t)
        }
        None => {
            count_drop(drop_reason::TASK_MAP_FULL);
            None
        }
    }
}

/// `tid`'s counters if it has a live slot, never claiming one: for the
/// waker's program (`offcpu::on_waking`), which runs in another task's
/// context.
#[inline(always)]
pub(crate) fn live_task_slot(tid: u32) -> Option<&'static mut TaskRecord> {
    if let Some(p) = mapped::array_task(tid) {
        return (unsafe { core::ptr::read_volatile(&(*p).born_ns) } != 0)
            .then(|| unsafe { &mut *p });
    }
    TASKS.get_ptr_mut(tid).map(|p| unsafe { &mut *p })
}

#[inline(always)]
fn process_slot(tgid: u32) -> Option<*mut FaultCounters> {
    if let Some(p) = mapped::process_slot(tgid) {
        return Some(p);
    }
    if let Some(p) = PROCESS_FAULTS.get_ptr_mut(tgid) {
        return Some(p);
    }
    // BPF_NOEXIST: another thread of the process may insert on another CPU
    // at the same time; the loser's insert fails (-EEXIST) instead of
    // overwriting the winner's count, and both add to the one value.
    let _ = PROCESS_FAULTS.insert(tgid, FaultCounters::default(), BPF_NOEXIST as u64);
    match PROCESS_FAULTS.get_ptr_mut(tgid) {
        Some(p) => Some(p),
        None => {
            count_drop(drop_reason::PROCESS_MAP_FULL);
            None
        }
    }
}

/// `*p += v` as one BPF_XADD (`BPF_STX | BPF_XADD | BPF_DW`, opcode 0xdb),
/// which every kernel with eBPF verifies. Written out because an atomicrmw
/// whose result were used would become BPF_ATOMIC_FETCH (Linux 5.12+).
#[inline(always)]
fn xadd(p: *mut u64, v: u64) {
    #[cfg(target_arch = "bpf")]
    unsafe {
        core::arch::asm!("lock *(u64 *)({0} + 0) += {1}", in(reg) p, in(reg) v)
    };
    #[cfg(not(target_arch = "bpf"))]
    unsafe {
        *p += v
    };
}

/// Where `tid`'s runnable-since time lives, if it has a slot yet.
#[inline(always)]
fn wake_slot(tid: u32) -> Option<*mut u64> {
    if setting(&WAKE_ARRAY) != 0 {
        WAKE_TS_ARRAY.get_ptr_mut(tid)
    } else {
        WAKE_TS.get_ptr_mut(tid)
    }
}

#[inline(always)]
fn mark_runnable(tid: u32, now: u64) {
    if let Some(ts) = wake_slot(tid) {
        unsafe { *ts = now };
    } else if setting(&WAKE_ARRAY) != 0 || WAKE_TS.insert(tid, now, 0).is_err() {
        // Array: tid >= pid_max cannot happen unless pid_max grew after load.
        count_drop(drop_reason::WAKE_MAP_FULL);
    }
}

/// Portable variant: field offsets from the kernel's format file.
#[tracepoint(category = "sched", name = "sched_switch")]
pub fn sched_switch(ctx: TracePointContext) -> u32 {
    let fields = unsafe {
        (
            ctx.read_at::<i32>(setting(&SWITCH_PREV_PID_OFF) as usize),
            ctx.read_at::<i64>(setting(&SWITCH_PREV_STATE_OFF) as usize),
            ctx.read_at::<i32>(setting(&SWITCH_NEXT_PID_OFF) as usize),
        )
    };
    if let (Ok(prev), Ok(state), Ok(next)) = fields {
        let missed = on_switch(
            prev as u32,
            reported_blocked(state),
            next as u32,
            current_tgid,
            None,
            vitals_common::offcpu::reported_state(state),
        );
        let c = capture_control();
        let flags = c.flags;
        if flags & capture::FLAG_SCHED != 0 {
            let extra = unsafe {
                (
                    ctx.read_at::<i32>(setting(&SWITCH_PREV_PRIO_OFF) as usize),
                    ctx.read_at::<i32>(setting(&SWITCH_NEXT_PRIO_OFF) as usize),
                    ctx.read_at::<[u8; 16]>(setting(&SWITCH_NEXT_COMM_OFF) as usize),
                )
            };
            emit_switch(
                ctx.as_ptr(),
                prev as u32,
                state,
                next as u32,
                extra.0.unwrap_or(0),
                extra.1.unwrap_or(0),
                extra.2.unwrap_or([0; 16]),
                // The classic record has no tgid of `next`: user space
                // learns it from the thread's switch-outs or /proc.
                0,
            );
            blind_window::on_switch(ctx.as_ptr(), missed);
        }
        // With or without the timeline (`record --offcpu` alone).
        if flags & capture::FLAG_OFFCPU != 0 {
            offcpu_capture::on_switch_out(&ctx, &c, prev as u32, state, core::ptr::null());
        }
    }
    0
}

/// Fast variant for the standard layout (`fixed_layout`): direct context
/// loads instead of three bpf_probe_read_kernel calls per switch.
#[tracepoint(category = "sched", name = "sched_switch")]
pub fn sched_switch_fixed(ctx: TracePointContext) -> u32 {
    let base = ctx.as_ptr() as *const u8;
    let (prev, state, next) = unsafe {
        (
            *(base.add(fixed_layout::SWITCH_PREV_PID as usize) as *const u32),
            *(base.add(fixed_layout::SWITCH_PREV_STATE as usize) as *const i64),
            *(base.add(fixed_layout::SWITCH_NEXT_PID as usize) as *const u32),
        )
    };
    let offcpu_state = vitals_common::offcpu::reported_state(state);
    let missed = on_switch(
        prev,
        reported_blocked(state),
        next,
        current_tgid,
        None,
        offcpu_state,
    );
    let c = capture_control();
    let flags = c.flags;
    if flags & capture::FLAG_SCHED != 0 {
        let (prev_prio, next_prio, comm) = unsafe {
            (
                *(base.add(fixed_layout::SWITCH_PREV_PRIO as usize) as *const i32),
                *(base.add(fixed_layout::SWITCH_NEXT_PRIO as usize) as *const i32),
                ctx_comm(base, fixed_layout::SWITCH_NEXT_COMM as usize),
            )
        };
        emit_switch(
            ctx.as_ptr(),
            prev,
            state,
            next,
            prev_prio,
            next_prio,
            unsafe { core::mem::transmute::<[u64; 2], [u8; 16]>(comm) },
            // See sched_switch: unknown here.
            0,
        );
        blind_window::on_switch(ctx.as_ptr(), missed);
    }
    if flags & capture::FLAG_OFFCPU != 0 {
        offcpu_capture::on_switch_out(&ctx, &c, prev, state, core::ptr::null());
    }
    0
}

/// The classic tracepoint's `prev_state` is the reported state
/// (`__trace_sched_switch_state`): TASK_REPORT_MAX ("R+") when preempted,
/// 0 ("R") when it called schedule() while runnable, a TASK_REPORT bit when
/// it blocked.
#[inline(always)]
fn reported_blocked(prev_state: i64) -> bool {
    prev_state & PREV_STATE_BLOCKED_MASK != 0
}

#[inline(always)]
fn current_tgid() -> u32 {
    // At sched_switch `current` is still `prev`.
    (bpf_get_current_pid_tgid() >> 32) as u32
}

/// A field of a `struct task_struct *` argument of a BTF tracepoint. The
/// verifier checks the access against the kernel's BTF (the offset is a
/// frozen .rodata constant, so it knows it) and turns it into a plain load.
#[inline(always)]
unsafe fn task_field<T: Copy>(task: *const u8, off: &'static u32) -> T {
    unsafe { *(task.add(setting(off) as usize) as *const T) }
}

/// `task->comm`, in two words: a [u8; 16] load is not one the verifier's
/// BTF access check takes. The kernel's comm is NUL-terminated within its
/// 16 bytes.
#[inline(always)]
unsafe fn task_comm(task: *const u8) -> [u8; 16] {
    let words = unsafe {
        [
            task_field::<u64>(task, &TASK_COMM_OFF),
            *(task.add(setting(&TASK_COMM_OFF) as usize + 8) as *const u64),
        ]
    };
    unsafe { core::mem::transmute::<[u64; 2], [u8; 16]>(words) }
}

#[inline(always)]
fn on_switch(
    prev: u32,
    blocked: bool,
    next: u32,
    prev_tgid: impl FnOnce() -> u32,
    kernel: Option<sched_info::KernelFigures>,
    offcpu_state: u32,
) -> bool {
    let now = unsafe { bpf_ktime_get_ns() };
    let Some(cpu) = mapped::cpu_state() else {
        return false;
    };
    sched_info::follow_exec(cpu, prev, &kernel);

    // On-CPU time of `prev` since its switch-in.
    let (mut ran_ns, mut missed) = (0, false);
    if cpu.valid != 0 && now > cpu.last_switch_ns {
        ran_ns = now - cpu.last_switch_ns;
        if cpu.running_tid != prev {
            // A switch here went unseen (a blind window, `blind_window`).
            // `prev` has run since some time after last_switch_ns; giving
            // it the whole interval conserves CPU time (only the split
            // with the task before it is approximate) where dropping it
            // could lose a spinner's entire run. Counted, and marked in
            // captures. Exec by a non-leader thread, which takes the
            // leader's pid on the CPU (de_thread -> exchange_tids), is no
            // miss: see `sched_info::follow_exec` and `exec`.
            count_drop(drop_reason::SWITCH_MISSED);
            missed = true;
            #[cfg(feature = "miss-log")]
            miss_log::record(
                now,
                cpu.last_switch_ns,
                prev,
                cpu.running_tid,
                next,
                blocked,
            );
        }
    }
    if prev == 0 {
        // This CPU's idle task: per-CPU idle time, in this CPU's own
        // CPU_STATE slot (see TASKS for why not under tid 0). It has no
        // switches or runqueue wait worth counting.
        cpu.idle_ns += ran_ns;
    } else if let Some(t) = task_slot(prev) {
        t.oncpu_ns += sched_info::slice_ns(cpu, prev, ran_ns, &kernel);
        if !sched_info::charge_wait(cpu, prev, t, &kernel) && ran_ns != 0 && cpu.running_tid == prev
        {
            t.runq_wait_ns += cpu.pending_wait_ns;
        }
        // A tid never changes thread group (exec by a non-leader takes
        // over the leader's pid), so learn it once.
        if t.tgid == 0 {
            t.tgid = prev_tgid();
        }
        if !blocked {
            t.involuntary_switches += 1;
            // Still runnable: its runqueue wait starts now.
            if sched_info::stamps_wait(&kernel) {
                mark_runnable(prev, now);
            }
        } else {
            t.voluntary_switches += 1;
        }
        offcpu::on_switch_out(&mut t.offcpu, offcpu_state, now);
    }

    // Switch-in of `next`: its wait ends now; credited when it switches out.
    cpu.pending_wait_ns = 0;
    if next != 0 && sched_info::stamps_wait(&kernel) {
        if let Some(ts) = wake_slot(next) {
            let since = unsafe { *ts };
            if since != 0 && now > since {
                cpu.pending_wait_ns = now - since;
            }
            unsafe { *ts = 0 };
        }
    }
    cpu.running_tid = next;
    cpu.last_switch_ns = now;
    cpu.valid = 1;
    sched_info::switch_in(cpu, &kernel);
    missed
}

#[inline(always)]
fn on_wakeup(pid: i32) -> u32 {
    if pid > 0 {
        mark_runnable(pid as u32, unsafe { bpf_ktime_get_ns() });
    }
    0
}

#[inline(always)]
fn wakeup_pid_portable(ctx: &TracePointContext) -> i32 {
    unsafe { ctx.read_at::<i32>(setting(&WAKEUP_PID_OFF) as usize) }.unwrap_or(0)
}

#[inline(always)]
fn wakeup_pid_fixed(ctx: &TracePointContext) -> i32 {
    unsafe { *((ctx.as_ptr() as *const u8).add(fixed_layout::WAKEUP_PID as usize) as *const i32) }
}

/// sched_wakeup fires when the woken task is enqueued: runqueue wait starts.
#[tracepoint(category = "sched", name = "sched_wakeup")]
pub fn sched_wakeup(ctx: TracePointContext) -> u32 {
    on_wakeup(wakeup_pid_portable(&ctx))
}

#[tracepoint(category = "sched", name = "sched_wakeup_new")]
pub fn sched_wakeup_new(ctx: TracePointContext) -> u32 {
    on_wakeup(wakeup_pid_portable(&ctx))
}

#[tracepoint(category = "sched", name = "sched_wakeup")]
pub fn sched_wakeup_fixed(ctx: TracePointContext) -> u32 {
    on_wakeup(wakeup_pid_fixed(&ctx))
}

#[tracepoint(category = "sched", name = "sched_wakeup_new")]
pub fn sched_wakeup_new_fixed(ctx: TracePointContext) -> u32 {
    on_wakeup(wakeup_pid_fixed(&ctx))
}

/// Arguments: (struct task_struct *p).
#[btf_tracepoint(function = "sched_wakeup")]
pub fn sched_wakeup_btf(ctx: BtfTracePointContext) -> u32 {
    let p: *const u8 = ctx.arg(0);
    on_wakeup(unsafe { task_field::<i32>(p, &TASK_PID_OFF) })
}

#[btf_tracepoint(function = "sched_wakeup_new")]
pub fn sched_wakeup_new_btf(ctx: BtfTracePointContext) -> u32 {
    let p: *const u8 = ctx.arg(0);
    on_wakeup(unsafe { task_field::<i32>(p, &TASK_PID_OFF) })
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[link_section = "license"]
#[no_mangle]
static LICENSE: [u8; 4] = *b"GPL\0";
