//! Types shared by the eBPF programs and the daemon.
//!
//! Every type is `#[repr(C)]` with explicit padding and no `bool`, so the
//! kernel-side and user-side layouts are the same byte for byte and no
//! uninitialised padding reaches a map. The `user` feature adds `aya::Pod`.
#![no_std]

/// Monotonic fault counters. Which fields move depends on the fault source the
/// daemon chose (see `FaultSource` on the user side):
/// - tracepoint `exceptions/page_fault_user` counts fault *entries*
///   (`entries`), including retried and failed faults;
/// - perf software events count what the kernel's `mm_account_fault()`
///   counts, i.e. successful faults: `minflt` / `majflt`, the same numbers as
///   fields 10 and 12 of /proc/<pid>/stat.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultCounters {
    pub entries: u64,
    pub minflt: u64,
    pub majflt: u64,
}

pub mod blind;
pub mod mapped;
pub mod offcpu;
pub use mapped::{ExitRecord, ExitRecordShort};
pub use offcpu::{OffcpuCounters, WakerCounters, WakerKey, WakerSlot};
pub mod task_record;
pub use task_record::{OffcpuRecord, TaskFaults, TaskRecord};

/// Per-thread monotonic counters as user space keeps them: the kernel's
/// `TaskRecord` with every count widened to u64 (`TaskRecord::widen`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TaskCounters {
    /// Time on CPU, attributed at each switch-out.
    pub oncpu_ns: u64,
    /// Runnable but not running: from wakeup or preemption to switch-in.
    pub runq_wait_ns: u64,
    /// Switch-outs while blocked (prev_state not runnable).
    pub voluntary_switches: u64,
    /// Switch-outs while still runnable (preempted, or yielded).
    pub involuntary_switches: u64,
    pub faults: FaultCounters,
    /// Thread group id, learnt from the task's own context.
    pub tgid: u32,
    pub _pad: u32,
    /// bpf_ktime_get_ns() when this value was inserted: which task, of
    /// all that held this tid, the counters belong to. The key is deleted
    /// when the task is freed, even when its exit record is lost (EXITED
    /// full), so a task reusing the tid gets a new stamp and user space
    /// can tell the two apart instead of merging their counters.
    pub born_ns: u64,
    /// The kernel's `sched_info.run_delay` at this task's last switch-out
    /// (tp_btf programs on a kernel with CONFIG_SCHED_INFO; 0: not read
    /// yet): the next switch-out charges the runqueue wait since.
    pub run_delay_seen_ns: u64,
    /// Off-CPU accounting (`offcpu` in the programs; zero while it is off).
    pub offcpu: OffcpuCounters,
}

/// The state each CPU keeps between two sched_switch events.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuState {
    /// bpf_ktime_get_ns() (CLOCK_MONOTONIC) of the last switch on this CPU.
    pub last_switch_ns: u64,
    /// Runqueue wait of the task now running, added to it when it switches out.
    pub pending_wait_ns: u64,
    /// Time this CPU's idle task (pid 0) ran, attributed at its switch-outs.
    /// Kept here, not under tid 0 in `TASKS`: every CPU has an idle task
    /// with pid 0, and a shared hash value would be written by all of them.
    pub idle_ns: u64,
    /// tid now running on this CPU (0 = idle).
    pub running_tid: u32,
    /// 1 once `last_switch_ns`/`running_tid` describe a real switch.
    pub valid: u32,
    /// The running task's `se.sum_exec_runtime` at its switch-in (tp_btf
    /// programs only): at its switch-out the delta is what the kernel
    /// charged it, without the irq and steal time a wall-clock slice has.
    pub running_sum_exec_ns: u64,
    /// 1 when `running_sum_exec_ns` was read at this CPU's last switch.
    pub sum_exec_valid: u32,
    pub _pad: u32,
    /// The running task's `sched_info.run_delay` at its switch-in (tp_btf
    /// programs, CONFIG_SCHED_INFO; valid with `sum_exec_valid`): not yet
    /// including the wait that ended there (sched_info_arrive runs after
    /// the tracepoint).
    pub running_run_delay_ns: u64,
    /// Kernel address of the running task's task_struct (tp_btf programs):
    /// the same task at its switch-out under another pid has exec'd from a
    /// non-leader thread (de_thread's exchange_tids), nothing was missed.
    pub running_task: u64,
}

/// Key of the EXITED map. The free time is part of the key so a tid freed,
/// reused and freed again before user space drains the map keeps both records.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ExitKey {
    /// bpf_ktime_get_ns() at sched_process_free.
    pub freed_ns: u64,
    pub tid: u32,
    pub _pad: u32,
}

/// Final counters of a task the kernel freed, copied by sched_process_free.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExitedTask {
    pub counters: TaskRecord,
    /// Whole-process fault counters, filled when the freed task was the
    /// thread-group leader (the leader is freed after its other threads).
    pub process_faults: FaultCounters,
    /// The freed task's comm as sched_process_free recorded it, NUL-padded
    /// (a task no procfs scan saw alive is named by this alone).
    pub comm: [u8; 16],
}

impl ExitedTask {
    /// `comm` up to its first NUL.
    pub fn comm_bytes(&self) -> &[u8] {
        let end = self.comm.iter().position(|&b| b == 0).unwrap_or(16);
        &self.comm[..end]
    }
}

/// Indexes into the per-CPU `DROPS` array: why an event was not counted.
pub mod drop_reason {
    /// TASKS map full: a new tid could not be inserted.
    pub const TASK_MAP_FULL: u32 = 0;
    /// PROCESS_FAULTS map full.
    pub const PROCESS_MAP_FULL: u32 = 1;
    /// WAKE_TS map full: a wakeup timestamp was lost (runqueue wait undercounted).
    pub const WAKE_MAP_FULL: u32 = 2;
    /// EXITED map full: a freed task's final counters were lost.
    pub const EXITED_MAP_FULL: u32 = 3;
    /// A sched_switch on this CPU was not delivered to us (the previous
    /// one's next_pid is not this one's prev_pid): on-CPU time of the
    /// interval went to the task switching out. See sched_switch.
    pub const SWITCH_MISSED: u32 = 4;
    /// Not a loss: a slice the tp_btf programs charged as wall time because
    /// the task's `se.sum_exec_runtime` at its switch-in was not read (the
    /// first slice of a task already running at attach, or after a missed
    /// switch). The classic programs charge every slice so and do not count.
    pub const ONCPU_WALL_CLOCK: u32 = 5;
    /// WAKERS full: a (wakee, waker) pair found no slot within its
    /// probes in this CPU's region of the active half (or user space's
    /// totals held `max_waker_pairs` pairs already) and was not counted
    /// (the wakee's own blocked time still was).
    pub const WAKER_MAP_FULL: u32 = 6;
    /// Counted by user space, not by a program: runs of the classic
    /// sched_process_free that the kernel skipped because
    /// `bpf_prog_active` was raised on its CPU (the program's
    /// `recursion_misses`, Linux 5.12+). Each leaves a freed task's
    /// counters behind as if it were alive. The tp_btf program is never
    /// skipped so.
    pub const FREE_MISSED: u32 = 7;
    pub const COUNT: u32 = 8;
    pub const NAMES: [&str; COUNT as usize] = [
        "task_map_full",
        "process_map_full",
        "wake_map_full",
        "exited_map_full",
        "switch_missed",
        "oncpu_wall_clock",
        "waker_map_full",
        "free_missed",
    ];
}

/// `prev_state` bits that mean "blocked". The kernel reports a preempted task
/// as TASK_REPORT_MAX (0x100 since 4.14, "R+") and a task that called
/// schedule() while TASK_RUNNING as 0 ("R"); both are still runnable.
/// Any of the low TASK_REPORT bits (S, D, T, t, X, Z, P, I) means it blocked.
pub const PREV_STATE_BLOCKED_MASK: i64 = 0xff;

/// The classic sched_switch tracepoint's `prev_state` (what the capture
/// records and trace_processor decodes) from the raw arguments a BTF
/// tracepoint gets: `__trace_sched_switch_state()` and
/// `__task_state_index()` in include/trace/events/sched.h and
/// include/linux/sched.h. `raw` is `prev->__state`, `exit_state` is
/// `prev->exit_state`.
#[inline(always)]
pub fn reported_prev_state(preempt: bool, raw: u32, exit_state: u32) -> i64 {
    const TASK_REPORT: u32 = 0x7f;
    const TASK_IDLE: u32 = 0x402;
    const TASK_REPORT_IDLE: u32 = 0x80;
    const TASK_RTLOCK_WAIT: u32 = 0x1000;
    const TASK_UNINTERRUPTIBLE: u32 = 0x2;
    if preempt {
        return fixed_layout::TASK_REPORT_MAX;
    }
    let mut state = (raw | exit_state) & TASK_REPORT;
    if raw == TASK_IDLE {
        state = TASK_REPORT_IDLE;
    }
    if raw & TASK_RTLOCK_WAIT != 0 {
        state = TASK_UNINTERRUPTIBLE;
    }
    // 1 << (fls(state) - 1): the highest bit set. Unrolled; BPF has no
    // count-leading-zeros instruction.
    let mut bit = TASK_REPORT_IDLE;
    while bit != 0 {
        if state & bit != 0 {
            return bit as i64;
        }
        bit >>= 1;
    }
    0
}

/// The tracepoint field layout of mainline kernels since 5.x (and Android
/// GKI). When the running kernel's `format` files agree, the daemon attaches
/// the `*_fixed` programs, which read these offsets straight from the
/// context (a direct load); otherwise the portable programs, which take the
/// offsets as globals and must use bpf_probe_read_kernel (the verifier
/// rejects context loads at offsets it cannot see as instruction constants).
pub mod fixed_layout {
    pub const SWITCH_PREV_PID: u32 = 24;
    pub const SWITCH_PREV_STATE: u32 = 32;
    pub const SWITCH_NEXT_PID: u32 = 56;
    pub const WAKEUP_PID: u32 = 24;
    // Capture-mode fields (sched_switch, sched_waking).
    pub const SWITCH_PREV_PRIO: u32 = 28;
    pub const SWITCH_NEXT_COMM: u32 = 40;
    pub const SWITCH_NEXT_PRIO: u32 = 60;
    pub const WAKING_COMM: u32 = 8;
    pub const WAKING_PID: u32 = 24;
    pub const WAKING_PRIO: u32 = 28;
    pub const WAKING_TARGET_CPU: u32 = 32;
    /// `prev_state` of a preempted task ("R+").
    pub const TASK_REPORT_MAX: i64 = 0x100;
    /// sched_process_free: `comm` at 8, then `pid` at 24 after a
    /// `char comm[16]`, or at 12 after a `__data_loc char[] comm` (6.18
    /// here); see `free_pid_offset`.
    pub const FREE_COMM: u32 = 8;
    pub const FREE_PID_AFTER_CHAR_COMM: u32 = 24;
    pub const FREE_PID_AFTER_DATA_LOC_COMM: u32 = 12;
    /// sched_process_exec: `pid` (the pid after exec) and `old_pid` (the
    /// exec'ing thread's tid before it), after `__data_loc filename` at 8;
    /// so since Linux 3.4.
    pub const EXEC_PID: u32 = 12;
    pub const EXEC_OLD_PID: u32 = 16;
}

/// sched_process_free's `pid` offset, told from the record itself by the
/// u32 at `fixed_layout::FREE_COMM`, for loaders that cannot pass the
/// offset from tracefs (Android's bpfloader has no .rodata). A `__data_loc`
/// is `length << 16 | offset` of the string in the record: a length of at
/// least 1 (the NUL) and an offset past the fixed fields. The first four
/// bytes of a `char comm[16]` can't look like that: the low half would need
/// comm[1] == 0, and the kernel NUL-pads comm (strscpy_pad), so comm[2] and
/// comm[3], the high half, would be 0 too.
#[inline(always)]
pub fn free_pid_offset(comm_word: u32) -> u32 {
    let (len, off) = (comm_word >> 16, comm_word & 0xffff);
    if (1..=0xff).contains(&len) && (16..=0xff).contains(&off) {
        fixed_layout::FREE_PID_AFTER_DATA_LOC_COMM
    } else {
        fixed_layout::FREE_PID_AFTER_CHAR_COMM
    }
}

/// Where sched_process_free's `comm` lies in its record: `len` bytes (at
/// most 16, counting the NUL) at `off`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommField {
    pub off: u32,
    pub len: u32,
}

/// sched_process_free's `comm`, from the u32 at `fixed_layout::FREE_COMM`
/// (told apart as `free_pid_offset` does): a `char comm[16]` is those 16
/// bytes; a `__data_loc char[] comm` is `len << 16 | off`, the string (NUL
/// included) at `off` from the record's start, at the end of the record.
#[inline(always)]
pub fn free_comm_field(comm_word: u32) -> CommField {
    if free_pid_offset(comm_word) == fixed_layout::FREE_PID_AFTER_DATA_LOC_COMM {
        let len = comm_word >> 16;
        CommField {
            off: comm_word & 0xffff,
            len: if len < 16 { len } else { 16 },
        }
    } else {
        CommField {
            off: fixed_layout::FREE_COMM,
            len: 16,
        }
    }
}

/// 16 bytes read at a `CommField`'s offset, with what lies past its length
/// zeroed: a `__data_loc` string is shorter than 16 bytes and the read ran
/// past the record into whatever follows it.
#[inline(always)]
pub fn comm_prefix(raw: [u8; 16], len: u32) -> [u8; 16] {
    let mut out = raw;
    let mut i = 0;
    while i < 16 {
        if i as u32 >= len {
            out[i] = 0;
        }
        i += 1;
    }
    out
}

pub mod capture;

/// Value of the 1-entry `CAPTURE` array.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CaptureControl {
    /// `capture::FLAG_*` bits; 0 = no capture (the always-on state).
    pub flags: u32,
    /// Emit one fault sample every this many faults of a process (>= 1).
    pub fault_period: u32,
    /// FLAG_OFFCPU: a block at least this long (switch-out to the
    /// sched_waking that ends it) is recorded.
    pub offcpu_min_ns: u64,
    /// FLAG_OFFCPU: `capture::OFFCPU_SCOPE_*`, which threads' blocks:
    /// every thread's, or only those of the processes in `OFFCPU_WATCH`.
    pub offcpu_scope: u32,
    /// Tells one capture from the next (`blind::BlindState`).
    pub capture_id: u32,
    /// FLAG_OFFCPU: 1 when a tp_btf sched_waking (which has the wakee's
    /// task) ends the blocks, so the switch-out takes only the user stack
    /// and the kernel stack of a long block is taken at its waking
    /// (bpf_get_task_stack): a kernel walk for long blocks only instead of
    /// every blocking switch.
    pub offcpu_kernel_at_waking: u32,
    /// FLAG_OFFCPU: 1 when a switch-in program (`offcpu_switch_in_fentry`
    /// or the kprobe `offcpu_switch_in`) is attached to finish_task_switch.
    /// The user stack of a task that is not `current`
    /// cannot be walked (get_perf_callchain refuses a cross-task user
    /// stack), so a blocked user thread leaves its user stack for its
    /// switch-in: there it is `current` again, not yet back in user mode,
    /// its user registers those it blocked with (a syscall's or a page
    /// fault's alike). A walk for long blocks only, instead of one at every
    /// blocking switch (574 of the 671 ns the capture added to a switch,
    /// measured).
    pub offcpu_user_at_switch_in: u32,
    /// FLAG_OFFCPU, with `offcpu_kernel_at_waking` and
    /// `offcpu_user_at_switch_in` both set: the capture's blocks are the
    /// always-on accounting's (`OffcpuRecord::block_start`), so it keeps no
    /// start of its own at every blocking switch-out. CLOCK_MONOTONIC, as
    /// those starts are, when the capture began: a block that started
    /// before is left out, as the other path (which only sees blocks whose
    /// switch-out it ran at) leaves it out.
    pub offcpu_since_ns: u64,
}

impl CaptureControl {
    /// Whether the capture takes its blocks from the always-on accounting
    /// (see `offcpu_since_ns`).
    #[inline(always)]
    pub fn blocks_from_accounting(&self) -> bool {
        self.offcpu_kernel_at_waking != 0 && self.offcpu_user_at_switch_in != 0
    }
}

mod capture_records;
pub use capture_records::*;

/// Names of maps and programs, shared so the two sides cannot drift.
pub mod names {
    pub const TASKS: &str = "TASKS";
    pub const PROCESS_FAULTS: &str = "PROCESS_FAULTS";
    pub const WAKE_TS: &str = "WAKE_TS";
    pub const WAKE_TS_ARRAY: &str = "WAKE_TS_ARRAY";
    pub const EXITED: &str = "EXITED";
    pub const CPU_STATE: &str = "CPU_STATE";
    pub const DROPS: &str = "DROPS";
    pub const CAPTURE: &str = "CAPTURE";
    pub const CAPTURE_EVENTS: &str = "CAPTURE_EVENTS";
    pub const CAPTURE_PERF: &str = "CAPTURE_PERF";
    pub const CAPTURE_LOST: &str = "CAPTURE_LOST";
    pub const CAPTURE_STACKS: &str = "CAPTURE_STACKS";
    pub const CAPTURE_FAULT_CTR: &str = "CAPTURE_FAULT_CTR";
    pub const OFFCPU_START: &str = "OFFCPU_START";
    pub const OFFCPU_AWAIT_USER: &str = "OFFCPU_AWAIT_USER";
    pub const OFFCPU_AWAITING: &str = "OFFCPU_AWAITING";
    /// One-slot BPF_MAP_TYPE_ARRAY_OF_MAPS outers for the daemon's own
    /// load (`G_PER_CAPTURE_MAPS`): slot 0 holds the capture's own
    /// CAPTURE_EVENTS, CAPTURE_STACKS, CAPTURE_FAULT_CTR, OFFCPU_START and
    /// OFFCPU_AWAIT_USER while it runs, nothing between captures.
    pub const SLOT_EVENTS: &str = "SLOT_EVENTS";
    pub const SLOT_STACKS: &str = "SLOT_STACKS";
    pub const SLOT_FAULT_CTR: &str = "SLOT_FAULT_CTR";
    pub const SLOT_OFFCPU_START: &str = "SLOT_OFFCPU_ST";
    pub const SLOT_AWAIT_USER: &str = "SLOT_AWAIT_USER";
    /// tgid -> 1: the processes an off-CPU capture watches.
    pub const OFFCPU_WATCH: &str = "OFFCPU_WATCH";
    pub const WAKERS: &str = "WAKERS";
    /// WAKERS' active half (0 or 1), written by user space through mmap.
    pub const WAKER_HALF: &str = "WAKER_HALF";
    pub const PROG_OFFCPU_WAKING: &str = "offcpu_waking";
    pub const PROG_OFFCPU_WAKING_FIXED: &str = "offcpu_waking_fixed";
    pub const PROG_OFFCPU_WAKING_BTF: &str = "offcpu_waking_btf";
    pub const PROG_OFFCPU_SWITCH_IN: &str = "offcpu_switch_in";
    pub const PROG_OFFCPU_SWITCH_IN_FENTRY: &str = "offcpu_switch_in_fentry";
    pub const PROG_SCHED_WAKING: &str = "sched_waking";
    pub const PROG_SCHED_WAKING_FIXED: &str = "sched_waking_fixed";

    pub const PROG_SCHED_SWITCH: &str = "sched_switch";
    pub const PROG_SCHED_WAKEUP: &str = "sched_wakeup";
    pub const PROG_SCHED_WAKEUP_NEW: &str = "sched_wakeup_new";
    pub const PROG_SCHED_SWITCH_FIXED: &str = "sched_switch_fixed";
    pub const PROG_SCHED_WAKEUP_FIXED: &str = "sched_wakeup_fixed";
    pub const PROG_SCHED_WAKEUP_NEW_FIXED: &str = "sched_wakeup_new_fixed";
    pub const PROG_SCHED_SWITCH_BTF: &str = "sched_switch_btf";
    /// Before Linux 5.18 (no `prev_state` argument; the task's own state).
    pub const PROG_SWITCH_PRE5_18: &str = "switch_pre5_18";
    pub const PROG_SCHED_WAKEUP_BTF: &str = "sched_wakeup_btf";
    pub const PROG_SCHED_WAKEUP_NEW_BTF: &str = "sched_wakeup_new_btf";
    pub const PROG_SCHED_PROCESS_FREE: &str = "sched_process_free";
    pub const PROG_SCHED_PROCESS_FREE_BTF: &str = "sched_process_free_btf";
    pub const PROG_PAGE_FAULT_USER: &str = "page_fault_user";
    pub const PROG_PERF_MINFLT: &str = "perf_minflt";
    pub const PROG_PERF_MAJFLT: &str = "perf_majflt";
    pub const PROG_SCHED_PROCESS_EXEC: &str = "sched_process_exec";

    /// Globals (`.rodata`) the loader sets: tracepoint field offsets read
    /// from tracefs `format` files, because they differ between kernels
    /// (sched_process_free has `__data_loc comm` since 6.x, moving `pid`).
    pub const G_SWITCH_PREV_PID: &str = "SWITCH_PREV_PID_OFF";
    pub const G_SWITCH_PREV_STATE: &str = "SWITCH_PREV_STATE_OFF";
    pub const G_SWITCH_NEXT_PID: &str = "SWITCH_NEXT_PID_OFF";
    pub const G_WAKEUP_PID: &str = "WAKEUP_PID_OFF";
    pub const G_FREE_PID: &str = "FREE_PID_OFF";
    pub const G_WAKE_ARRAY: &str = "WAKE_ARRAY";
    pub const G_TRACK_WAIT: &str = "TRACK_WAIT";
    pub const G_SWITCH_PREV_PRIO: &str = "SWITCH_PREV_PRIO_OFF";
    pub const G_SWITCH_NEXT_COMM: &str = "SWITCH_NEXT_COMM_OFF";
    pub const G_SWITCH_NEXT_PRIO: &str = "SWITCH_NEXT_PRIO_OFF";
    pub const G_WAKING_COMM: &str = "WAKING_COMM_OFF";
    pub const G_WAKING_PID: &str = "WAKING_PID_OFF";
    pub const G_WAKING_PRIO: &str = "WAKING_PRIO_OFF";
    pub const G_WAKING_TARGET_CPU: &str = "WAKING_TARGET_CPU_OFF";
    pub const G_CAPTURE_TRANSPORT: &str = "CAPTURE_TRANSPORT";
    pub const G_TASK_PID: &str = "TASK_PID_OFF";
    pub const G_TASK_TGID: &str = "TASK_TGID_OFF";
    pub const G_TASK_PRIO: &str = "TASK_PRIO_OFF";
    pub const G_TASK_COMM: &str = "TASK_COMM_OFF";
    pub const G_TASK_FLAGS: &str = "TASK_FLAGS_OFF";
    pub const G_TASK_EXIT_STATE: &str = "TASK_EXIT_STATE_OFF";
    pub const G_TASK_SUM_EXEC: &str = "TASK_SUM_EXEC_OFF";
    pub const G_TASK_RUN_DELAY: &str = "TASK_RUN_DELAY_OFF";
    pub const G_TASK_STATE: &str = "TASK_STATE_OFF";
    pub const G_TRACK_OFFCPU: &str = "TRACK_OFFCPU";
    pub const G_LONG_BLOCK_US: &str = "LONG_BLOCK_US";
    /// WAKERS' slots per CPU and half, and its CPU regions per half.
    pub const G_WAKER_SLOTS: &str = "WAKER_SLOTS";
    pub const G_WAKER_CPUS: &str = "WAKER_CPUS";
    /// The mmap-read arrays (`mapped`).
    pub const TASKS_BY_TID: &str = "TASKS_BY_TID";
    pub const FAULTS_BY_TGID: &str = "FAULTS_BY_TGID";
    /// Freed tasks' records through a ring buffer (`ExitRecord`).
    pub const EXITED_RING: &str = "EXITED_RING";
    /// 1: sched_process_free writes EXITED_RING; 0: the EXITED hash.
    pub const G_EXIT_RING: &str = "EXIT_RING";
    pub const G_PER_CAPTURE_MAPS: &str = "PER_CAPTURE_MAPS";
    /// 1: the fault programs also count per process (FAULTS_BY_TGID);
    /// 0: only per thread, where TASKS_BY_TID covers every tid.
    pub const G_COUNT_PROCESS_FAULTS: &str = "COUNT_PROCESS_FAULTS";
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all are repr(C), made of integers, with explicit padding.
    unsafe impl aya::Pod for super::FaultCounters {}
    unsafe impl aya::Pod for super::TaskCounters {}
    unsafe impl aya::Pod for super::TaskRecord {}
    unsafe impl aya::Pod for super::CpuState {}
    unsafe impl aya::Pod for super::ExitedTask {}
    unsafe impl aya::Pod for super::ExitKey {}
    unsafe impl aya::Pod for super::ExitRecord {}
    unsafe impl aya::Pod for super::ExitRecordShort {}
    unsafe impl aya::Pod for super::CaptureControl {}
    unsafe impl aya::Pod for super::OffcpuStart {}
    unsafe impl aya::Pod for super::AwaitUserStack {}
    unsafe impl aya::Pod for super::OffcpuCounters {}
    unsafe impl aya::Pod for super::WakerKey {}
    unsafe impl aya::Pod for super::WakerCounters {}
    unsafe impl aya::Pod for super::WakerSlot {}
}

impl FaultCounters {
    pub fn add(&mut self, o: &FaultCounters) {
        self.entries = self.entries.wrapping_add(o.entries);
        self.minflt = self.minflt.wrapping_add(o.minflt);
        self.majflt = self.majflt.wrapping_add(o.majflt);
    }
}

impl TaskCounters {
    /// Adds another CPU's slot (or another task's totals) into this one.
    /// `tgid` is taken from whichever slot has it.
    pub fn add(&mut self, o: &TaskCounters) {
        self.oncpu_ns = self.oncpu_ns.wrapping_add(o.oncpu_ns);
        self.runq_wait_ns = self.runq_wait_ns.wrapping_add(o.runq_wait_ns);
        self.voluntary_switches = self.voluntary_switches.wrapping_add(o.voluntary_switches);
        self.involuntary_switches = self
            .involuntary_switches
            .wrapping_add(o.involuntary_switches);
        self.faults.add(&o.faults);
        self.offcpu.add(&o.offcpu);
        if self.tgid == 0 {
            self.tgid = o.tgid;
        }
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::vec;

    #[test]
    fn reported_prev_state_matches_the_kernels_encoding() {
        // Preempted: "R+" whatever the state word says.
        assert_eq!(reported_prev_state(true, 0x1, 0), 0x100);
        // schedule() while TASK_RUNNING: "R".
        assert_eq!(reported_prev_state(false, 0, 0), 0);
        // S, D, T, t, P.
        assert_eq!(reported_prev_state(false, 0x1, 0), 0x1);
        assert_eq!(reported_prev_state(false, 0x2, 0), 0x2);
        assert_eq!(reported_prev_state(false, 0x4, 0), 0x4);
        assert_eq!(reported_prev_state(false, 0x8, 0), 0x8);
        assert_eq!(reported_prev_state(false, 0x40, 0), 0x40);
        // TASK_KILLABLE (WAKEKILL|UNINTERRUPTIBLE) reports D; a freezable
        // sleep (FREEZABLE|INTERRUPTIBLE) reports S.
        assert_eq!(reported_prev_state(false, 0x102, 0), 0x2);
        assert_eq!(reported_prev_state(false, 0x2001, 0), 0x1);
        // TASK_IDLE reports I; TASK_RTLOCK_WAIT reports D.
        assert_eq!(reported_prev_state(false, 0x402, 0), 0x80);
        assert_eq!(reported_prev_state(false, 0x1000, 0), 0x2);
        // A dying task (TASK_DEAD) reports its exit_state: Z or X.
        assert_eq!(reported_prev_state(false, 0x80, 0x20), 0x20);
        assert_eq!(reported_prev_state(false, 0x80, 0x10), 0x10);
    }

    /// A sched_process_free record as the kernel lays it out, followed by
    /// bytes of whatever comes next in the buffer, and the comm decoded
    /// from it the way the program does (16 bytes at the field, masked).
    fn decode_comm(record: &[u8]) -> [u8; 16] {
        let word = u32::from_le_bytes(record[8..12].try_into().unwrap());
        let f = free_comm_field(word);
        let mut raw = [0u8; 16];
        raw.copy_from_slice(&record[f.off as usize..f.off as usize + 16]);
        comm_prefix(raw, f.len)
    }

    fn comm16(s: &[u8]) -> [u8; 16] {
        let mut c = [0u8; 16];
        c[..s.len()].copy_from_slice(s);
        c
    }

    #[test]
    fn free_comm_decodes_a_char_array_record() {
        // <= 6.x: common fields (8), char comm[16] @8, pid @24, prio @28.
        for name in [&b"dd"[..], b"kworker/0:1H-kb", b"a"] {
            let mut rec = vec![0xeeu8; 8];
            rec.extend_from_slice(&comm16(name));
            rec.extend_from_slice(&207i32.to_le_bytes());
            rec.extend_from_slice(&120i32.to_le_bytes());
            rec.extend_from_slice(&[0xab; 16]); // past the record
            let f = free_comm_field(u32::from_le_bytes(rec[8..12].try_into().unwrap()));
            assert_eq!(f, CommField { off: 8, len: 16 });
            assert_eq!(decode_comm(&rec), comm16(name), "{name:?}");
        }
    }

    #[test]
    fn free_comm_decodes_a_data_loc_record() {
        // 6.18: common fields (8), __data_loc comm @8, pid @12, prio @16,
        // then the string "dd\0" at 20; the read runs past the record.
        for name in [&b"dd"[..], b"kworker/0:1H-kb", b"a"] {
            let len = name.len() as u32 + 1;
            let mut rec = vec![0xeeu8; 8];
            rec.extend_from_slice(&(len << 16 | 20).to_le_bytes());
            rec.extend_from_slice(&207i32.to_le_bytes());
            rec.extend_from_slice(&120i32.to_le_bytes());
            rec.extend_from_slice(name);
            rec.push(0);
            rec.extend_from_slice(&[0xab; 32]);
            let word = u32::from_le_bytes(rec[8..12].try_into().unwrap());
            assert_eq!(free_pid_offset(word), 12);
            assert_eq!(free_comm_field(word), CommField { off: 20, len });
            assert_eq!(decode_comm(&rec), comm16(name), "{name:?}");
        }
        // A length past 16 (not a comm) is still cut at 16 bytes.
        assert_eq!(free_comm_field(40 << 16 | 20).len, 16);
    }

    #[test]
    fn exited_comm_bytes_stop_at_the_nul() {
        let t = ExitedTask {
            comm: comm16(b"dd"),
            ..Default::default()
        };
        assert_eq!(t.comm_bytes(), b"dd");
        let full = ExitedTask {
            comm: *b"0123456789abcdef",
            ..Default::default()
        };
        assert_eq!(full.comm_bytes(), b"0123456789abcdef");
    }

    #[test]
    fn free_pid_offset_tells_data_loc_from_char_comm() {
        let char_comm = |s: &[u8]| {
            let mut c = [0u8; 4];
            c[..s.len().min(4)].copy_from_slice(&s[..s.len().min(4)]);
            u32::from_le_bytes(c)
        };
        // `__data_loc char[] comm` as 6.18 writes it: "bash\0" at 20.
        assert_eq!(free_pid_offset(5 << 16 | 20), 12);
        assert_eq!(free_pid_offset(16 << 16 | 24), 12);
        // `char comm[16]`: long names, short names, digits, one letter.
        for comm in [&b"kworker/0:1"[..], b"sh", b"a", b"ab1", b"\x01", b"", b"0"] {
            assert_eq!(free_pid_offset(char_comm(comm)), 24, "{comm:?}");
        }
    }
}
