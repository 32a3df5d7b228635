//! Blind windows (issue #22): stretches of a CPU's timeline where the
//! classic sched_switch programs saw no switch although the kernel made
//! some. trace_call_bpf skips every classic tracepoint program while
//! `bpf_prog_active` is raised on the CPU, which any process's bpf() map
//! syscall does; from Linux 5.11 that section can be preempted, and until
//! the task inside it runs again every switch on that CPU goes unseen.
//!
//! The witness is a CPU-wide PERF_COUNT_SW_CONTEXT_SWITCHES counter per
//! CPU (in `SWITCH_COUNTERS`): __schedule counts it in
//! prepare_task_switch -> perf_event_task_sched_out, after
//! trace_sched_switch and with no regard to bpf_prog_active. Read at each
//! seen switch, it has counted every switch before this one, so between
//! two seen switches on a CPU it advances by exactly 1 (the earlier one);
//! by 1 + k, k switches were unseen. tp_btf programs do not take
//! bpf_prog_active (a per-program recursion guard instead), so they need
//! none of this.

/// `EventHeader::kind` of a `BlindWindowEvent`.
pub const KIND_BLIND_WINDOW: u32 = 5;

/// `BlindWindowEvent::seen_by` bits.
/// The switch counter advanced by more than one between two seen switches.
pub const SEEN_BY_COUNTER: u32 = 1;
/// The task switching out is not the one the last seen switch put on the
/// CPU (`CpuState::running_tid`, the `switch_missed` drop).
pub const SEEN_BY_RUNNING_TID: u32 = 2;

/// Map names.
pub const SWITCH_COUNTERS: &str = "SWITCH_COUNTERS";
pub const BLIND_STATE: &str = "BLIND_STATE";

/// One blind window on `hdr.cpu`: (start_ts, hdr.ts], from the last seen
/// switch to the one that revealed it, both CLOCK_BOOTTIME.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlindWindowEvent {
    pub hdr: crate::EventHeader,
    pub start_ts: u64,
    /// Switches the kernel made in the window that no program saw; at
    /// least 1 when only `SEEN_BY_RUNNING_TID` found it (a lower bound).
    pub unseen_switches: u32,
    /// `SEEN_BY_*` bits.
    pub seen_by: u32,
}

/// `BLIND_STATE`'s per-CPU value: the last seen switch of a capture.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlindState {
    /// SWITCH_COUNTERS' count read at that switch; valid with `counted` 1.
    pub switch_count: u64,
    /// CLOCK_MONOTONIC of that switch (`CpuState::last_switch_ns`).
    pub ts: u64,
    /// `CaptureControl::capture_id` of the capture that wrote it: a state
    /// left by an earlier capture (pinned maps outlive a recording, and
    /// its counters started from zero) is not compared with.
    pub capture_id: u32,
    pub counted: u32,
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: repr(C), integers only, no implicit padding.
    unsafe impl aya::Pod for super::BlindWindowEvent {}
    unsafe impl aya::Pod for super::BlindState {}
}
