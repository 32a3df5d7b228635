//! The maps user space reads every sample through mmap instead of bpf():
//! BPF_F_MMAPABLE arrays (Linux 5.5). Why: every bpf() map syscall that
//! copies a value raises this CPU's `bpf_prog_active`
//! (bpf_disable_instrumentation in kernel/bpf/syscall.c and in the hash
//! batch walk), and since 5.11 that section only disables migration, so the
//! reader can be preempted inside it; until it runs again, trace_call_bpf
//! skips every classic tracepoint program on that CPU (the switches there
//! go unseen: `switch_missed`). A read through mmap is a plain load.
//!
//! - CPU_STATE: one slot per possible CPU, indexed by
//!   bpf_get_smp_processor_id(); only that CPU's sched_switch writes it.
//! - DROPS: `ncpus * drop_reason::COUNT` counters, each CPU its own row.
//! - TASKS_BY_TID: the task counters indexed by tid, for tids below its
//!   size (the loader sizes it from pid_max); a free slot has `born_ns` 0.
//!   Larger tids fall back to the TASKS hash.
//! - FAULTS_BY_TGID: the process fault counters indexed by tgid, all zero
//!   when free; larger tgids fall back to the PROCESS_FAULTS hash.
//!
//! The max_entries here are what bpfloader creates (it cannot resize; 256
//! covers the possible CPUs of any Android device, 32768 is the usual
//! pid_max of a phone); aya's loader resizes them to the machine.

use aya_ebpf::{
    helpers::{bpf_get_smp_processor_id, bpf_ktime_get_ns},
    macros::map,
    maps::{Array, PerCpuArray, RingBuf},
};
use core::ptr::{read_volatile, write_volatile};
use vitals_common::{
    drop_reason, mapped, CpuState, ExitKey, ExitRecord, ExitRecordShort, ExitedTask, FaultCounters,
    TaskRecord,
};

#[map(name = "CPU_STATE")]
static CPU_STATE: Array<CpuState> =
    Array::with_max_entries(mapped::DEFAULT_CPUS, mapped::BPF_F_MMAPABLE);

#[map(name = "DROPS")]
static DROPS: Array<u64> = Array::with_max_entries(
    mapped::DEFAULT_CPUS * drop_reason::COUNT,
    mapped::BPF_F_MMAPABLE,
);

#[map(name = "TASKS_BY_TID")]
static TASKS_BY_TID: Array<TaskRecord> =
    Array::with_max_entries(mapped::DEFAULT_TIDS, mapped::BPF_F_MMAPABLE);

#[map(name = "FAULTS_BY_TGID")]
static FAULTS_BY_TGID: Array<FaultCounters> =
    Array::with_max_entries(mapped::DEFAULT_TIDS, mapped::BPF_F_MMAPABLE);

/// Freed tasks' final counters (`ExitRecord`), where the kernel has ring
/// buffers (EXIT_RING): user space consumes them from the ring's mapping,
/// where draining the EXITED hash took a lookup and a delete per record.
#[map(name = "EXITED_RING")]
static EXITED_RING: RingBuf = RingBuf::with_byte_size(mapped::DEFAULT_EXITED_RING_BYTES, 0);

/// sched_process_free's scratch record, one per CPU: a classic
/// tracepoint program never nests in another on its CPU (trace_call_bpf
/// skips it while bpf_prog_active is raised), so one slot is enough.
#[map(name = "EXIT_SCRATCH")]
static EXIT_SCRATCH: PerCpuArray<ExitedTask> = PerCpuArray::with_max_entries(1, 0);

/// This CPU's scratch `ExitedTask` for sched_process_free.
#[inline(always)]
pub fn exit_scratch() -> Option<&'static mut ExitedTask> {
    EXIT_SCRATCH.get_ptr_mut(0).map(|p| unsafe { &mut *p })
}

/// A freed task's record into EXITED_RING (EXIT_RING 1) or the EXITED
/// hash (0: the kernel has no ring buffers and the loader rewrote
/// EXITED_RING into an array; frozen .rodata, so the verifier never walks
/// the ringbuf branch there). False when full.
#[inline(always)]
pub fn store_exited(key: ExitKey, task: &ExitedTask) -> bool {
    if crate::setting(&crate::EXIT_RING) != 0 {
        if crate::setting(&crate::faults::COUNT_PROCESS_FAULTS) != 0 {
            ring_exited(key, task)
        } else {
            ring_exited_short(key, task)
        }
    } else {
        crate::EXITED
            .insert(&key, task, aya_ebpf::bindings::BPF_NOEXIST as u64)
            .is_ok()
    }
}

/// `task` into EXITED_RING; false when the ring is full. Reserved in the
/// ring and filled in place: a second copy on the stack would not fit
/// sched_process_free's 512 bytes.
#[inline(always)]
fn ring_exited(key: ExitKey, task: &ExitedTask) -> bool {
    let Some(mut slot) = EXITED_RING.reserve::<ExitRecord>(0) else {
        return false;
    };
    let p = slot.as_mut_ptr();
    unsafe {
        (*p).key = key;
        (*p).task = *task;
    }
    // Wakeups are not needed: user space polls at each sample.
    slot.submit(aya_ebpf::bindings::BPF_RB_NO_WAKEUP as u64);
    true
}

/// `task` without its process fault counters (none are kept:
/// COUNT_PROCESS_FAULTS 0) into EXITED_RING; false when the ring is full.
#[inline(always)]
fn ring_exited_short(key: ExitKey, task: &ExitedTask) -> bool {
    let Some(mut slot) = EXITED_RING.reserve::<ExitRecordShort>(0) else {
        return false;
    };
    let p = slot.as_mut_ptr();
    unsafe {
        (*p).key = key;
        (*p).counters = task.counters;
        (*p).comm = task.comm;
    }
    slot.submit(aya_ebpf::bindings::BPF_RB_NO_WAKEUP as u64);
    true
}

/// This CPU's scheduler state.
#[inline(always)]
pub fn cpu_state() -> Option<&'static mut CpuState> {
    let cpu = unsafe { bpf_get_smp_processor_id() };
    CPU_STATE.get_ptr_mut(cpu).map(|p| unsafe { &mut *p })
}

/// This CPU's counter of `reason`. A plain add: only programs on this CPU
/// touch its row, as with the per-CPU array it replaces.
#[inline(always)]
pub fn count_drop(reason: u32) {
    let cpu = unsafe { bpf_get_smp_processor_id() };
    if let Some(p) = DROPS.get_ptr_mut(cpu * drop_reason::COUNT + reason) {
        unsafe { *p += 1 };
    }
}

/// `tid`'s slot in TASKS_BY_TID, stamped on first sight (None: the tid is
/// past the array, use the hash). Called from `tid`'s own context only.
/// The stamp is stored last and cleared first (`forget_task`), volatile so
/// the compiler keeps that order: the reader trusts a copy only when
/// `born_ns` was the same non-zero value before and after it.
#[inline(always)]
pub fn task_slot(tid: u32) -> Option<&'static mut TaskRecord> {
    let p = TASKS_BY_TID.get_ptr_mut(tid)?;
    unsafe {
        if read_volatile(&(*p).born_ns) == 0 {
            write_volatile(p, TaskRecord::default());
            write_volatile(&mut (*p).born_ns, bpf_ktime_get_ns());
        }
        Some(&mut *p)
    }
}

/// `tid`'s slot in TASKS_BY_TID whether or not it is live (None: the tid
/// is past the array), for a program that must not claim one
/// (`crate::live_task_slot`).
#[inline(always)]
pub fn array_task(tid: u32) -> Option<*mut TaskRecord> {
    TASKS_BY_TID.get_ptr_mut(tid)
}

/// A freed task's final counters in the array (None: past the array, or
/// a free slot; the caller then looks in the hash, which has none either).
#[inline(always)]
pub fn final_task(tid: u32) -> Option<*const TaskRecord> {
    // A pointer, not the value: an Option<value> merged with the hash's
    // makes the compiler spill the None's undefined payload, which the
    // verifier refuses (`!read_ok`).
    let p = TASKS_BY_TID.get_ptr(tid)?;
    (unsafe { (*p).born_ns } != 0).then_some(p)
}

/// Frees `tid`'s slot (after its final counters were copied to EXITED):
/// the stamp first, so a concurrent reader drops what it copied.
#[inline(always)]
pub fn forget_task(tid: u32) {
    if let Some(p) = TASKS_BY_TID.get_ptr_mut(tid) {
        unsafe {
            write_volatile(&mut (*p).born_ns, 0);
            write_volatile(p, TaskRecord::default());
        }
    }
}

/// `tgid`'s fault counters in FAULTS_BY_TGID (None: past the array).
#[inline(always)]
pub fn process_slot(tgid: u32) -> Option<*mut FaultCounters> {
    FAULTS_BY_TGID.get_ptr_mut(tgid)
}

/// Like `final_task`: all zero means the process never faulted.
#[inline(always)]
pub fn final_process(tgid: u32) -> Option<*const FaultCounters> {
    let p = FAULTS_BY_TGID.get_ptr(tgid)?;
    (unsafe { *p } != FaultCounters::default()).then_some(p)
}

/// Clears a freed leader's process counters (its threads are all gone).
#[inline(always)]
pub fn forget_process(tgid: u32) {
    if let Some(p) = FAULTS_BY_TGID.get_ptr_mut(tgid) {
        unsafe { write_volatile(p, FaultCounters::default()) };
    }
}
