//! Exec by a thread that is not its process's leader, for the classic
//! programs. de_thread() (fs/exec.c, exchange_tids) gives the exec'ing
//! thread the leader's pid while it is on the CPU, so sched_switch sees its
//! switch-in under its old tid and its switch-out under the leader's pid,
//! which on_switch would count as a missed switch. The tp_btf program tells
//! the two apart by the task_struct address (`sched_info::follow_exec`);
//! the classic record has no task pointer, so this program follows the
//! rename at sched_process_exec instead.
//!
//! Counters need no moving: TASKS[old tid] holds the thread's counters
//! from before the exec and is copied to EXITED when the old leader's
//! task_struct, which now carries the old tid, is freed (release_task in
//! de_thread); TASKS[pid] holds the old leader's and goes on with the new
//! image. Both belong to the same process, so its totals are whole.

use aya_ebpf::{macros::tracepoint, programs::TracePointContext, EbpfContext};
use vitals_common::fixed_layout;

use crate::mapped::cpu_state;

/// Fires in exec_binprm, in the exec'ing task's context, after de_thread.
/// The program runs with preemption disabled, on the CPU the task is
/// current on. If the task has not switched since exchange_tids, it has
/// run on this CPU since its switch-in here (a task changes CPU only
/// through a switch), so this CPU's running_tid is still its old tid: make
/// it the new pid. If it has switched since, that switch-out already
/// counted the miss and its switch-in recorded the new pid: nothing to do.
/// Any other running_tid (a switch this CPU missed) is left alone: the old
/// tid now names the dead leader, which cannot be running.
#[tracepoint(category = "sched", name = "sched_process_exec")]
pub fn sched_process_exec(ctx: TracePointContext) -> u32 {
    let base = ctx.as_ptr() as *const u8;
    let (pid, old_pid) = unsafe {
        (
            *(base.add(fixed_layout::EXEC_PID as usize) as *const u32),
            *(base.add(fixed_layout::EXEC_OLD_PID as usize) as *const u32),
        )
    };
    if pid == old_pid {
        return 0;
    }
    if let Some(cpu) = cpu_state() {
        if cpu.valid != 0 && cpu.running_tid == old_pid {
            cpu.running_tid = pid;
        }
    }
    0
}
