//! The end of a task: sched_process_free, when the task is gone for good
//! (delayed_put_task_struct, an RCU callback a grace period after
//! release_task). It will never run or fault again, so its counters are
//! final: copy them, with its comm, out to user space and free its slot,
//! so a reused tid starts from zero and nothing is lost; for a
//! thread-group leader, freed after all its other threads, also the
//! process's fault counters.
//!
//! Two programs, one body (`on_free`):
//! - `sched_process_free_btf` (tp_btf) where the kernel's BTF allows. A
//!   raw tracepoint program is not subject to `bpf_prog_active`;
//! - `sched_process_free`, the classic tracepoint (bpfloader's object, and
//!   kernels without BTF). `trace_call_bpf()` skips it while
//!   `bpf_prog_active` is raised on its CPU, and RCU callbacks run in
//!   softirq at any interrupt's exit, also inside another process's map
//!   syscall: 28 of 300 frees were skipped so here, with a BPF hash reader
//!   on the reaper's CPU. A skipped free leaves the task's slot behind; the
//!   kernel counts the skip in the program's `recursion_misses` (5.12+),
//!   which user space reports as `free_missed`.
//!
//! Helpers: map lookup/update/delete, bpf_probe_read (ctx reads) and
//! bpf_ktime_get_ns, all long before 5.10.

use aya_ebpf::{
    helpers::bpf_ktime_get_ns,
    macros::{btf_tracepoint, tracepoint},
    programs::{BtfTracePointContext, TracePointContext},
};
use vitals_common::{
    comm_prefix, drop_reason, fixed_layout, free_comm_field, free_pid_offset, ExitKey,
    FaultCounters, TaskRecord,
};

use crate::{
    mapped::{self, count_drop},
    setting, task_comm, task_field, FREE_PID_OFF, PROCESS_FAULTS, TASKS, TASK_PID_OFF, WAKE_ARRAY,
    WAKE_TS, WAKE_TS_ARRAY,
};

/// The classic tracepoint: pid and comm from the record, in either layout
/// (`free_pid_offset`, `free_comm_field`).
#[tracepoint(category = "sched", name = "sched_process_free")]
pub fn sched_process_free(ctx: TracePointContext) -> u32 {
    let comm_word = match unsafe { ctx.read_at::<u32>(fixed_layout::FREE_COMM as usize) } {
        Ok(word) => word,
        Err(_) => return 0,
    };
    let mut pid_off = setting(&FREE_PID_OFF);
    if pid_off == 0 {
        pid_off = free_pid_offset(comm_word);
    }
    let pid: i32 = match unsafe { ctx.read_at(pid_off as usize) } {
        Ok(p) => p,
        Err(_) => return 0,
    };
    if pid <= 0 {
        return 0;
    }
    on_free(pid as u32, || free_comm(&ctx, comm_word))
}

/// Arguments: (struct task_struct *p), the task being freed; pid and comm
/// read from it at our BTF reader's offsets.
#[btf_tracepoint(function = "sched_process_free")]
pub fn sched_process_free_btf(ctx: BtfTracePointContext) -> u32 {
    let p: *const u8 = ctx.arg(0);
    let pid = unsafe { task_field::<i32>(p, &TASK_PID_OFF) };
    if pid <= 0 {
        return 0;
    }
    on_free(pid as u32, || unsafe { task_comm(p) })
}

#[inline(always)]
fn on_free(tid: u32, comm: impl FnOnce() -> [u8; 16]) -> u32 {
    forget_wakeup(tid);
    // Pointers: an Option<value>'s undefined None payload fails `!read_ok`.
    let task = mapped::final_task(tid).or_else(|| TASKS.get_ptr(tid));
    // A process's fault counters are keyed by its tgid, the leader's tid,
    // which stays allocated until the leader is released after its other
    // threads: so an entry under this tid means this is that leader (also
    // when the leader itself found TASKS full).
    let process_faults = mapped::final_process(tid).or_else(|| PROCESS_FAULTS.get_ptr(tid));
    if task.is_none() && process_faults.is_none() {
        // Never switched out nor faulted while we were attached.
        return 0;
    }
    // Built in a per-CPU scratch slot: with the off-CPU and run_delay
    // fields an ExitedTask on the stack, plus the copies the compiler
    // makes, exceeds the BPF stack's 512 bytes.
    let Some(exited) = mapped::exit_scratch() else {
        return 0;
    };
    exited.counters = match task {
        Some(p) => unsafe { *p },
        None => TaskRecord::default(),
    };
    exited.comm = comm();
    exited.process_faults = FaultCounters::default();
    if let Some(f) = process_faults {
        exited.process_faults = unsafe { *f };
        exited.counters.tgid = tid;
        mapped::forget_process(tid);
        let _ = PROCESS_FAULTS.remove(tid);
    }
    let key = ExitKey {
        freed_ns: unsafe { bpf_ktime_get_ns() },
        tid,
        _pad: 0,
    };
    if !mapped::store_exited(key, exited) {
        count_drop(drop_reason::EXITED_MAP_FULL);
    }
    mapped::forget_task(tid);
    let _ = TASKS.remove(tid);
    0
}

/// sched_process_free's comm, in either layout (`free_comm_field`): 16
/// bytes read at the field (bpf_probe_read: the offset of a `__data_loc`
/// string is only known at run time), what lies past the string zeroed.
#[inline(always)]
fn free_comm(ctx: &TracePointContext, comm_word: u32) -> [u8; 16] {
    let field = free_comm_field(comm_word);
    match unsafe { ctx.read_at::<[u8; 16]>(field.off as usize) } {
        Ok(raw) => comm_prefix(raw, field.len),
        Err(_) => [0; 16],
    }
}

#[inline(always)]
fn forget_wakeup(tid: u32) {
    if setting(&WAKE_ARRAY) != 0 {
        if let Some(ts) = WAKE_TS_ARRAY.get_ptr_mut(tid) {
            unsafe { *ts = 0 };
        }
    } else {
        let _ = WAKE_TS.remove(tid);
    }
}
