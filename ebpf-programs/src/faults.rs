//! The fault-counting programs: one per fault source the daemon can choose
//! (`FaultSource` on the user side), each adding to the faulting thread's
//! TASKS value and its process's PROCESS_FAULTS value.

use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid,
    macros::{perf_event, tracepoint},
    programs::{PerfEventContext, TracePointContext},
};

use crate::{capture_tier::maybe_sample_fault, process_slot, setting, task_slot, xadd};

/// 1: also count each fault in its process's FAULTS_BY_TGID /
/// PROCESS_FAULTS value (bpfloader's default). 0: the loader sized
/// TASKS_BY_TID to every tid below pid_max, so no thread ever misses a
/// slot and a process's faults are exactly its threads' (live ones plus
/// the freed ones' final records): the per-process map would only repeat
/// them, at 24 bytes a possible tgid and one atomic add a fault.
#[no_mangle]
pub(crate) static COUNT_PROCESS_FAULTS: u32 = 1;

#[derive(Clone, Copy)]
enum FaultKind {
    Entry,
    Minor,
    Major,
}

#[inline(always)]
fn count_fault(kind: FaultKind) {
    let pid_tgid = bpf_get_current_pid_tgid();
    let (tid, tgid) = (pid_tgid as u32, (pid_tgid >> 32) as u32);
    // tid 0 (an idle task) takes no user faults; its key would be shared by
    // every CPU's idle task (see TASKS).
    if tid == 0 {
        return;
    }
    if let Some(t) = task_slot(tid) {
        t.tgid = tgid;
        // The task's own context: a plain add (see TASKS). u32 counts
        // wrap; user space widens them (`TaskRecord`).
        let f = &mut t.faults;
        let count = match kind {
            FaultKind::Entry => &mut f.entries,
            FaultKind::Minor => &mut f.minflt,
            FaultKind::Major => &mut f.majflt,
        };
        *count = count.wrapping_add(1);
    }
    if setting(&COUNT_PROCESS_FAULTS) == 0 {
        return;
    }
    if let Some(p) = process_slot(tgid) {
        // Shared by the process's threads on every CPU: atomic adds.
        let f = unsafe { &mut *p };
        let counter = match kind {
            FaultKind::Entry => &mut f.entries,
            FaultKind::Minor => &mut f.minflt,
            FaultKind::Major => &mut f.majflt,
        };
        xadd(counter, 1);
    }
}

/// x86 only: one event per user-mode fault entry (also retries and faults
/// that end in SIGSEGV), in the faulting task's context.
#[tracepoint(category = "exceptions", name = "page_fault_user")]
pub fn page_fault_user(ctx: TracePointContext) -> u32 {
    count_fault(FaultKind::Entry);
    maybe_sample_fault(&ctx);
    0
}

/// Attached to PERF_COUNT_SW_PAGE_FAULTS_MIN with sample_period 1 on every
/// CPU: runs where mm_account_fault() counts a successful minor fault.
#[perf_event]
pub fn perf_minflt(ctx: PerfEventContext) -> u32 {
    count_fault(FaultKind::Minor);
    maybe_sample_fault(&ctx);
    0
}

#[perf_event]
pub fn perf_majflt(ctx: PerfEventContext) -> u32 {
    count_fault(FaultKind::Major);
    maybe_sample_fault(&ctx);
    0
}
