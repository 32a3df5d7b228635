//! The capture records, as the programs write them to the capture
//! transport and user space decodes them: each begins with an
//! `EventHeader` whose `kind` (`capture::KIND_*`) names it.

use crate::capture;

/// Common prefix of every capture record.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EventHeader {
    /// `capture::KIND_*`.
    pub kind: u32,
    /// CPU the event happened on.
    pub cpu: u32,
    /// bpf_ktime_get_boot_ns(): CLOCK_BOOTTIME, Perfetto's trace clock.
    pub ts: u64,
}

/// sched_switch, with `prev_state` exactly as the tracepoint gives it
/// (`__trace_sched_switch_state`: TASK_REPORT bits, 0x100 = preempted).
/// The previous task's comm is not carried: it was the `next_comm` of the
/// switch before on this CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SwitchEvent {
    pub hdr: EventHeader,
    pub prev_state: i64,
    pub prev_pid: i32,
    pub prev_prio: i32,
    pub next_pid: i32,
    pub next_prio: i32,
    pub next_comm: [u8; 16],
    /// Thread group of the task switching out (it is `current`), so user
    /// space can name threads under their process even after they exit.
    pub prev_tgid: u32,
    /// Thread group of the task switching in, 0 when the program cannot
    /// tell (tp_btf reads it from `next`; the classic tracepoints only
    /// know it once `next` has switched out or faulted before, from
    /// TASKS). Without it a thread whose switch-outs are lost, or that
    /// exits before user space reads /proc/<tid>/status, has no process.
    pub next_tgid: u32,
}

/// sched_waking: emitted on the waker's CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WakingEvent {
    pub hdr: EventHeader,
    pub pid: i32,
    pub prio: i32,
    pub target_cpu: i32,
    pub _pad: u32,
    pub comm: [u8; 16],
}

/// One sampled user page fault; the user stack is in the `CAPTURE_STACKS`
/// stack-trace map under `stack_id` (negative: none, see `lost::STACK`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultEvent {
    pub hdr: EventHeader,
    pub tgid: u32,
    pub tid: u32,
    pub stack_id: i64,
}

/// One long block of a watched thread (`capture::KIND_OFFCPU`), emitted by
/// the sched_waking that ends it, on the waker's CPU: `hdr.ts` is the
/// waking. Stack ids are in `CAPTURE_STACKS` (negative: not taken, see
/// `lost::STACK`); user and kernel stacks apart, as bpf_get_stackid takes
/// them.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OffcpuEvent {
    pub hdr: EventHeader,
    /// bpf_ktime_get_boot_ns() at the blocked thread's switch-out.
    pub blocked_ts: u64,
    pub tid: u32,
    pub tgid: u32,
    /// `current` at sched_waking (0 in an interrupt over the idle task).
    pub waker_tid: u32,
    pub waker_tgid: u32,
    /// The switch-out's `prev_state`, as the classic tracepoint reports it.
    pub prev_state: i64,
    pub blocked_user_stack: i64,
    pub blocked_kernel_stack: i64,
    pub waker_user_stack: i64,
    pub waker_kernel_stack: i64,
    /// The blocked thread's comm (sched_waking's), and the waker's
    /// (`current`'s): a capture without the timeline has no sched record
    /// to name them, and short-lived threads are gone from /proc by the
    /// time user space reads the record.
    pub comm: [u8; 16],
    pub waker_comm: [u8; 16],
    /// With `blocked_kernel_stack == capture::KERNEL_STACK_AT_WAKING`:
    /// the frames bpf_get_task_stack gave (innermost first), or its
    /// negative error.
    pub blocked_kernel_len: i32,
    pub _pad: u32,
    pub blocked_kernel_ips: KernelIps,
}

/// The user stack of a thread's long blocks that left it for their
/// switch-in (`capture::KIND_OFFCPU_USER_STACK`), emitted at
/// finish_task_switch in the thread's own context: it belongs to the
/// thread's `OffcpuEvent`s with `blocked_user_stack ==
/// capture::USER_STACK_AT_SWITCH_IN` and `blocked_ts` in
/// `since_ts..hdr.ts` (one, unless a switch-in went unseen: then the
/// earlier blocks of the same thread, which have not been back in user
/// mode since, share it).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OffcpuUserStack {
    pub hdr: EventHeader,
    /// The `blocked_ts` of the first of these blocks.
    pub since_ts: u64,
    pub tid: u32,
    pub tgid: u32,
    /// In `CAPTURE_STACKS`, or the helper's negative error.
    pub user_stack: i64,
}

/// Kernel frames carried in a record (`capture::OFFCPU_KERNEL_IPS`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelIps(pub [u64; capture::OFFCPU_KERNEL_IPS]);

impl Default for KernelIps {
    fn default() -> Self {
        Self([0; capture::OFFCPU_KERNEL_IPS])
    }
}

/// Value of `OFFCPU_START`, keyed by tid: a watched thread's switch-out
/// while blocked, waiting for the sched_waking that ends it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OffcpuStart {
    pub ts: u64,
    pub prev_state: i64,
    pub user_stack: i64,
    pub kernel_stack: i64,
    pub tgid: u32,
    pub _pad: u32,
}

/// Value of `OFFCPU_AWAIT_USER`, keyed by tid: the long blocks whose user
/// stack waits for the thread's switch-in.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AwaitUserStack {
    /// The `blocked_ts` of the first of these blocks.
    pub since_ts: u64,
}
