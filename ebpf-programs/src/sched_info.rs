//! The kernel's own per-task accounting, read by the tp_btf sched_switch
//! program at each switch: `se.sum_exec_runtime` (on-CPU time as the
//! scheduler charged it) and, with CONFIG_SCHED_INFO, `sched_info.run_delay`
//! (the runqueue wait /proc/<pid>/schedstat reports). With run_delay the
//! tp_btf path needs no wakeup programs; the classic programs (no task
//! pointer) keep wall time and the wakeup programs' timestamps.

use vitals_common::{drop_reason, CpuState, TaskRecord};

use crate::{
    count_drop, setting, task_field, TASKS, TASK_RUN_DELAY_OFF, TASK_SUM_EXEC_OFF, TRACK_WAIT,
};

/// The two tasks of a switch as the kernel has just charged them (tp_btf
/// programs only).
pub struct KernelFigures {
    /// `se.sum_exec_runtime`: __schedule ran update_curr() for `prev`
    /// before the tracepoint (at its dequeue when it blocked, in
    /// pick_next_task otherwise), and `next` is not charged again until it
    /// runs, so its figure now is its slice's start.
    prev_sum_exec_ns: u64,
    next_sum_exec_ns: u64,
    /// `sched_info.run_delay` (0 without CONFIG_SCHED_INFO): it grows in
    /// sched_info_arrive (context_switch -> prepare_task_switch, after the
    /// tracepoint) and sched_info_dequeue (a queued task moved to another
    /// runqueue), so at `prev`'s switch-out it holds every wait up to the
    /// one before this slice, and at `next`'s switch-in not yet the wait
    /// ending now.
    prev_run_delay_ns: u64,
    next_run_delay_ns: u64,
    /// task_struct addresses, for telling an exec'd thread from a missed
    /// switch (`follow_exec`).
    prev_task: u64,
    next_task: u64,
}

/// Reads the figures of `prev_task` and `next_task` (BTF task pointers).
#[inline(always)]
pub fn read(prev_task: *const u8, next_task: *const u8) -> KernelFigures {
    let run_delay = |task| {
        if has_run_delay() {
            unsafe { task_field::<u64>(task, &TASK_RUN_DELAY_OFF) }
        } else {
            0
        }
    };
    KernelFigures {
        prev_sum_exec_ns: unsafe { task_field::<u64>(prev_task, &TASK_SUM_EXEC_OFF) },
        next_sum_exec_ns: unsafe { task_field::<u64>(next_task, &TASK_SUM_EXEC_OFF) },
        prev_run_delay_ns: run_delay(prev_task),
        next_run_delay_ns: run_delay(next_task),
        prev_task: prev_task as u64,
        next_task: next_task as u64,
    }
}

/// The loader found `task_struct.sched_info.run_delay` in the kernel's BTF
/// (0: no CONFIG_SCHED_INFO, or not the tp_btf programs).
#[inline(always)]
fn has_run_delay() -> bool {
    setting(&TASK_RUN_DELAY_OFF) != 0
}

/// Runqueue wait comes from the kernel's run_delay on this path.
#[inline(always)]
fn wait_from_kernel(kernel: &Option<KernelFigures>) -> bool {
    kernel.is_some() && has_run_delay()
}

/// Whether the switch stamps runqueue-wait start and end times itself (the
/// wakeup programs' scheme): with runq wait on, unless the kernel's
/// run_delay is read instead.
#[inline(always)]
pub fn stamps_wait(kernel: &Option<KernelFigures>) -> bool {
    setting(&TRACK_WAIT) != 0 && !wait_from_kernel(kernel)
}

/// Exec by a non-leader thread: de_thread() (fs/exec.c, exchange_tids)
/// gives the exec'ing thread its leader's pid while it is on the CPU, so
/// its switch-out names another tid than its switch-in. The task_struct is
/// the same (a task on this CPU since the last switch seen here cannot have
/// been freed and its memory reused), so nothing was missed: follow the
/// rename. Its counters under the new tid are the old leader's (same
/// process, so per-process totals are right); their run_delay baseline
/// belongs to the leader's task_struct, so it restarts from this slice's.
#[inline(always)]
pub fn follow_exec(cpu: &mut CpuState, prev: u32, kernel: &Option<KernelFigures>) {
    let Some(k) = kernel else {
        return;
    };
    if cpu.valid == 0 || cpu.running_tid == prev || cpu.running_task != k.prev_task || prev == 0 {
        return;
    }
    cpu.running_tid = prev;
    if let Some(t) = TASKS.get_ptr_mut(prev) {
        unsafe { (*t).run_delay_seen_ns = 0 };
    }
}

/// On-CPU time of `prev`'s slice ending now: the kernel's sum_exec_runtime
/// delta since its switch-in where both ends were read, which leaves out
/// irq time (CONFIG_IRQ_TIME_ACCOUNTING) and steal time
/// (CONFIG_PARAVIRT_TIME_ACCOUNTING) as /proc/<pid>/schedstat does; else
/// the wall time between the switches (`wall_ns`).
#[inline(always)]
pub fn slice_ns(cpu: &CpuState, prev: u32, wall_ns: u64, kernel: &Option<KernelFigures>) -> u64 {
    let Some(k) = kernel else {
        return wall_ns;
    };
    if prev != 0 && cpu.sum_exec_valid != 0 && cpu.running_tid == prev {
        return k.prev_sum_exec_ns.saturating_sub(cpu.running_sum_exec_ns);
    }
    if prev != 0 && wall_ns != 0 {
        count_drop(drop_reason::ONCPU_WALL_CLOCK);
    }
    wall_ns
}

/// Charges `prev`'s runqueue wait from the kernel's run_delay: everything
/// it grew by since `prev`'s last switch-out, or for the first switch-out
/// seen, since its switch-in here (the wait before a task's first slice
/// after attach, from before the attach, is not ours to count). Returns
/// false where the wakeup programs' wait applies instead.
#[inline(always)]
pub fn charge_wait(
    cpu: &CpuState,
    prev: u32,
    t: &mut TaskRecord,
    kernel: &Option<KernelFigures>,
) -> bool {
    let Some(k) = kernel else {
        return false;
    };
    if !has_run_delay() {
        return false;
    }
    if setting(&TRACK_WAIT) == 0 {
        return true;
    }
    let now = k.prev_run_delay_ns;
    let since = if t.run_delay_seen_ns != 0 {
        t.run_delay_seen_ns
    } else if cpu.sum_exec_valid != 0 && cpu.running_tid == prev {
        cpu.running_run_delay_ns
    } else {
        now
    };
    t.runq_wait_ns += now.saturating_sub(since);
    t.run_delay_seen_ns = now;
    true
}

/// Notes `next`'s figures at its switch-in, for its switch-out.
#[inline(always)]
pub fn switch_in(cpu: &mut CpuState, kernel: &Option<KernelFigures>) {
    match kernel {
        Some(k) => {
            cpu.running_sum_exec_ns = k.next_sum_exec_ns;
            cpu.running_run_delay_ns = k.next_run_delay_ns;
            cpu.running_task = k.next_task;
            cpu.sum_exec_valid = 1;
        }
        None => cpu.sum_exec_valid = 0,
    }
}
