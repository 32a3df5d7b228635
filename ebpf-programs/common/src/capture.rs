//! Capture mode: events written to the `CAPTURE_EVENTS` ring buffer while
//! user space has set a flag in the 1-entry `CAPTURE` array. The always-on
//! path pays one inlined array lookup and a branch for it.

/// `CaptureControl::flags` bits.
pub const FLAG_SCHED: u32 = 1;
pub const FLAG_FAULTS: u32 = 2;
/// With FLAG_SCHED: every long block of a watched thread as one
/// `OffcpuEvent` (its stack at switch-out, its waker's at sched_waking).
pub const FLAG_OFFCPU: u32 = 4;

/// `CAPTURE_TRANSPORT` values: where the records go.
pub const TRANSPORT_RINGBUF: u32 = 0;
pub const TRANSPORT_PERF_ARRAY: u32 = 1;

/// `EventHeader::kind`: which record follows the header.
pub const KIND_SWITCH: u32 = 1;
pub const KIND_WAKING: u32 = 2;
pub const KIND_FAULT: u32 = 3;
pub const KIND_OFFCPU: u32 = 4;
/// (5 is `blind::KIND_BLIND_WINDOW`.)
pub const KIND_OFFCPU_USER_STACK: u32 = 6;

/// `CaptureControl::offcpu_scope`: every thread is watched.
pub const OFFCPU_SCOPE_ALL: u32 = 0;
/// `CaptureControl::offcpu_scope`: only threads whose tgid is a key of
/// `OFFCPU_WATCH` (an empty map watches none).
pub const OFFCPU_SCOPE_WATCHED: u32 = 1;
/// `OFFCPU_WATCH`'s max_entries: the processes one capture can watch.
/// A fixed bound (the programs are loaded once, the list comes from a
/// config that reloads); user space counts the tgids it could not add.
pub const OFFCPU_WATCH_MAX_TGIDS: u32 = 64;
/// `OffcpuStart::kernel_stack` / `OffcpuEvent::blocked_kernel_stack` when
/// the blocked thread's kernel stack is taken at its waking, into
/// `OffcpuEvent::blocked_kernel_ips` (`CaptureControl::offcpu_kernel_at_waking`).
pub const KERNEL_STACK_AT_WAKING: i64 = i64::MIN;
/// `OffcpuStart::user_stack` / `OffcpuEvent::blocked_user_stack` when the
/// blocked thread's user stack is taken as it switches in again, in an
/// `OffcpuUserStack` record (`CaptureControl::offcpu_user_at_switch_in`).
pub const USER_STACK_AT_SWITCH_IN: i64 = i64::MIN + 1;
/// `OffcpuEvent::blocked_user_stack` of a kernel thread's block taken
/// from the accounting: -EFAULT, what bpf_get_stackid returns for a user
/// stack of a task without one, so both paths read alike.
pub const NO_USER_STACK: i64 = -14;
/// `task_struct.flags` bit of a kernel thread (include/linux/sched.h,
/// the same value since 2.6): it has no user stack, so none is deferred.
pub const PF_KTHREAD: u32 = 0x0020_0000;
/// Frames of a kernel stack taken at the waking (bpf_get_task_stack);
/// deeper ones are cut at the outer end (`OffcpuEvent::blocked_kernel_len`).
pub const OFFCPU_KERNEL_IPS: usize = 48;

/// Indexes into the per-CPU `CAPTURE_LOST` array.
pub mod lost {
    /// Ring buffer (or perf buffer) full: a sched_switch/sched_waking
    /// record was dropped. With the perf array, user space adds the
    /// perf buffer's own PERF_RECORD_LOST counts to its view of this.
    pub const SCHED: u32 = 0;
    /// Ring buffer full: a fault sample was dropped.
    pub const FAULT: u32 = 1;
    /// bpf_get_stackid failed (stack map full/collision, no user stack):
    /// the sample is still sent, with a negative stack id.
    pub const STACK: u32 = 2;
    /// Ring buffer full: a long block's record was dropped.
    pub const OFFCPU: u32 = 3;
    pub const COUNT: u32 = 4;
}
