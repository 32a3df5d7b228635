//! Off-CPU accounting's shared types: the per-task counters (in
//! `TaskCounters::offcpu`), the switch-out states blocked time is split
//! by, and the WAKERS map's key and value. The programs' side is
//! `ebpf-programs/src/offcpu.rs`.

/// Not a block it counts: runnable (preempted, yielded), or a state
/// other than S and D. TASK_IDLE ("I": TASK_UNINTERRUPTIBLE |
/// TASK_NOLOAD) is left out on purpose: it is how idle kernel threads
/// (kworkers, rcu) wait for work, which the kernel itself keeps out of
/// the load average; counted as D it would drown real I/O waits.
pub const STATE_NONE: u32 = 0;
/// TASK_INTERRUPTIBLE, reported "S".
pub const STATE_S: u32 = 1;
/// TASK_UNINTERRUPTIBLE (also TASK_KILLABLE), reported "D".
pub const STATE_D: u32 = 2;

/// The state of a classic sched_switch's `prev_state`, the reported
/// state (`__trace_sched_switch_state`: one TASK_REPORT bit, "I" is
/// 0x80, 0x100 preempted).
#[inline(always)]
pub fn reported_state(prev_state: i64) -> u32 {
    match prev_state & 0x1ff {
        0x1 => STATE_S,
        0x2 => STATE_D,
        _ => STATE_NONE,
    }
}

/// The classic sched_switch `prev_state` of a block in `state` (S or D):
/// `reported_state`'s inverse, so a block the accounting timed reads in
/// a capture like one the switch-out path recorded.
#[inline(always)]
pub fn classic_prev_state(state: u32) -> i64 {
    match state {
        STATE_S => 0x1,
        STATE_D => 0x2,
        _ => 0,
    }
}

/// The state of a tp_btf sched_switch's raw `prev->__state`, as
/// `__task_state_index` would report it: TASK_RTLOCK_WAIT (0x1000) is
/// "D", TASK_NOLOAD (0x400, with UNINTERRUPTIBLE TASK_IDLE) "I", else
/// the highest of UNINTERRUPTIBLE (2) and INTERRUPTIBLE (1).
#[inline(always)]
pub fn raw_state(preempt: bool, raw: u32) -> u32 {
    if preempt {
        STATE_NONE
    } else if raw & 0x1000 != 0 {
        STATE_D
    } else if raw & 0x400 != 0 {
        STATE_NONE
    } else if raw & 0x7c != 0 {
        // Stopped, traced, dead, parked: not a wait for an event.
        STATE_NONE
    } else if raw & 0x2 != 0 {
        STATE_D
    } else if raw & 0x1 != 0 {
        STATE_S
    } else {
        STATE_NONE
    }
}

/// Blocked time of one task, ended by the sched_waking that woke it; see
/// `offcpu.rs` in the programs for who writes what and when.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OffcpuCounters {
    /// Blocks that began in TASK_INTERRUPTIBLE (reported "S").
    pub blocked_s_ns: u64,
    /// Blocks that began in TASK_UNINTERRUPTIBLE (reported "D"), TASK_IDLE
    /// ("I", idle kernel threads) excluded: see `STATE_NONE`.
    pub blocked_d_ns: u64,
    /// Blocks (S or D) of at least the load-time threshold (LONG_BLOCK_US).
    pub long_blocks: u64,
    /// Blocks (S or D) a sched_waking ended.
    pub wakeups: u64,
    /// In flight: bpf_ktime_get_ns() at the switch-out that began the
    /// current block, 0 when not blocked in S or D.
    pub block_start_ns: u64,
    /// In flight: `STATE_*` of that switch-out.
    pub block_state: u32,
    pub _pad: u32,
}

impl OffcpuCounters {
    /// Adds another task's totals (the in-flight fields are not summed).
    pub fn add(&mut self, o: &OffcpuCounters) {
        self.blocked_s_ns = self.blocked_s_ns.wrapping_add(o.blocked_s_ns);
        self.blocked_d_ns = self.blocked_d_ns.wrapping_add(o.blocked_d_ns);
        self.long_blocks = self.long_blocks.wrapping_add(o.long_blocks);
        self.wakeups = self.wakeups.wrapping_add(o.wakeups);
    }
}

/// Key of the WAKERS map: who woke whom, by process.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WakerKey {
    /// Thread group of the task whose block ended.
    pub wakee_tgid: u32,
    /// Thread group of `current` at sched_waking; 0 for the idle task,
    /// i.e. an interrupt that came while the CPU idled (see README).
    pub waker_tgid: u32,
}

/// A (wakee, waker) pair's wakeups and the blocked time they ended:
/// in WAKERS, since the slot's half was last zeroed; in user space's
/// totals, cumulative.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WakerCounters {
    pub wakeups: u64,
    /// Total blocked time those wakeups ended.
    pub blocked_ns: u64,
}

/// One slot of the WAKERS array (open addressing in a CPU's region of a
/// half, see the programs' `offcpu` module): free while `key.wakee_tgid`
/// is 0 (a wakee is never the idle task).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WakerSlot {
    pub key: WakerKey,
    pub counters: WakerCounters,
}

/// Probes of a pair's slot from its hash before it counts as not found
/// (`drop_reason::WAKER_MAP_FULL`).
pub const WAKER_PROBES: u32 = 4;

/// `key`'s hash: its first probe is `hash % slots` in a region of
/// `slots` slots.
#[inline(always)]
pub fn waker_hash(key: &WakerKey) -> u32 {
    let h = key.wakee_tgid.wrapping_mul(0x9E37_79B1) ^ key.waker_tgid.wrapping_mul(0x85EB_CA6B);
    h ^ (h >> 16)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reported_prev_state;

    #[test]
    fn offcpu_states_split_s_and_d_and_leave_out_idle_kthreads() {
        // Classic: the reported state.
        assert_eq!(reported_state(0x1), STATE_S);
        assert_eq!(reported_state(0x2), STATE_D);
        assert_eq!(reported_state(0x80), STATE_NONE, "I (TASK_IDLE)");
        assert_eq!(reported_state(0x100), STATE_NONE, "preempted");
        assert_eq!(reported_state(0), STATE_NONE);
        assert_eq!(reported_state(0x4), STATE_NONE, "stopped");
        // tp_btf: the raw state, reported the kernel's way.
        assert_eq!(raw_state(false, 0x1), STATE_S);
        assert_eq!(raw_state(false, 0x2001), STATE_S, "freezable S");
        assert_eq!(raw_state(false, 0x2), STATE_D);
        assert_eq!(raw_state(false, 0x102), STATE_D, "TASK_KILLABLE");
        assert_eq!(
            raw_state(false, 0x2102),
            STATE_D,
            "killable, freezable (vfork)"
        );
        assert_eq!(raw_state(false, 0x1000), STATE_D, "TASK_RTLOCK_WAIT");
        assert_eq!(raw_state(false, 0x402), STATE_NONE, "TASK_IDLE");
        assert_eq!(raw_state(true, 0x1), STATE_NONE, "preempted");
        assert_eq!(raw_state(false, 0), STATE_NONE);
        assert_eq!(raw_state(false, 0x80), STATE_NONE, "TASK_DEAD");
        assert_eq!(raw_state(false, 0x4), STATE_NONE, "stopped");
        assert_eq!(raw_state(false, 0x40), STATE_NONE, "parked");
        // A block the accounting timed reads back as the state it was.
        for state in [STATE_S, STATE_D] {
            assert_eq!(reported_state(classic_prev_state(state)), state);
        }
        assert_eq!(classic_prev_state(STATE_NONE), 0);
        // Both agree with the capture's encoding on every state.
        for raw in [0x1, 0x2, 0x102, 0x402, 0x1000, 0x4, 0x8, 0x40, 0x2001] {
            assert_eq!(
                raw_state(false, raw),
                reported_state(reported_prev_state(false, raw, 0)),
                "{raw:#x}"
            );
        }
    }
}
