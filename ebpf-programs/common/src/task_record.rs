//! `TaskRecord`: what the kernel keeps per thread (TASKS_BY_TID, the
//! TASKS hash, freed tasks' records), 88 bytes where the user side's
//! `TaskCounters` is 128. TASKS_BY_TID holds one record per possible tid
//! (pid_max), used or not, so every byte here costs pid_max bytes of
//! kernel memory: 32 KiB on a phone's pid_max of 32768.
//!
//! Times stay u64 nanoseconds: one slice, wait or block can last longer
//! than a u32 holds (4.3 s). Counts of events (switches, faults, wakeups,
//! long blocks) are u32 and wrap: user space reads every record once an
//! interval and widens each count by its wrapping difference from the last
//! read (`TaskRecord::widen_after`), which is exact while a thread makes
//! fewer than 2^32 of one event between two reads: at a 1 s interval, over
//! 4 billion a second, far beyond what a CPU can do (a thread switching
//! flat out makes about a million switches a second).

use crate::{offcpu, FaultCounters, OffcpuCounters, TaskCounters};

/// A thread's fault counts (see `FaultCounters` for which move).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TaskFaults {
    pub entries: u32,
    pub minflt: u32,
    pub majflt: u32,
}

/// A thread's blocked time (see `OffcpuCounters`, whose fields these are,
/// with the counts in u32 and the block's state in its start's top bit).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OffcpuRecord {
    pub blocked_s_ns: u64,
    pub blocked_d_ns: u64,
    /// In flight: bpf_ktime_get_ns() at the switch-out that began the
    /// current block, with `BLOCK_IN_D` set for a block in D; 0 when not
    /// blocked in S or D (`OffcpuRecord::begin`).
    pub block_start: u64,
    pub long_blocks: u32,
    pub wakeups: u32,
}

/// `OffcpuRecord::block_start`'s flag of a block in D. bpf_ktime_get_ns()
/// (CLOCK_MONOTONIC) stays below 2^63 for 292 years of uptime, so the
/// top bit is free and the start time keeps every nanosecond.
pub const BLOCK_IN_D: u64 = 1 << 63;

impl OffcpuRecord {
    /// The in-flight block a switch-out at `now_ns` in `state`
    /// (`offcpu::STATE_*`) begins: none for `STATE_NONE`.
    #[inline(always)]
    pub fn begin(&mut self, state: u32, now_ns: u64) {
        self.block_start = match state {
            offcpu::STATE_S => now_ns,
            offcpu::STATE_D => now_ns | BLOCK_IN_D,
            _ => 0,
        };
    }

    /// The in-flight block: (start ns, `offcpu::STATE_*`), or None.
    #[inline(always)]
    pub fn in_flight(&self) -> Option<(u64, u32)> {
        let b = self.block_start;
        if b == 0 {
            return None;
        }
        let state = if b & BLOCK_IN_D != 0 {
            offcpu::STATE_D
        } else {
            offcpu::STATE_S
        };
        Some((b & !BLOCK_IN_D, state))
    }
}

/// Per-thread monotonic counters as the programs keep them: the value of
/// TASKS_BY_TID (indexed by tid) and of the `TASKS` hash (keyed by tid).
/// Only the task's own context writes them (see `TASKS` in the programs;
/// the off-CPU fields also its waker, see `offcpu` there), so no per-CPU
/// slots are needed; user space takes deltas.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TaskRecord {
    /// Time on CPU, attributed at each switch-out.
    pub oncpu_ns: u64,
    /// Runnable but not running: from wakeup or preemption to switch-in.
    pub runq_wait_ns: u64,
    /// bpf_ktime_get_ns() when this value was inserted: which task, of
    /// all that held this tid, the counters belong to (see
    /// `TaskCounters::born_ns`). The mmap reader's copy is good only
    /// when it is the same non-zero value before and after.
    pub born_ns: u64,
    /// The kernel's `sched_info.run_delay` at this task's last switch-out
    /// (tp_btf programs with CONFIG_SCHED_INFO; 0: not read yet).
    pub run_delay_seen_ns: u64,
    /// Off-CPU accounting (zero while it is off).
    pub offcpu: OffcpuRecord,
    /// Switch-outs while blocked (prev_state not runnable).
    pub voluntary_switches: u32,
    /// Switch-outs while still runnable (preempted, or yielded).
    pub involuntary_switches: u32,
    pub faults: TaskFaults,
    /// Thread group id, learnt from the task's own context.
    pub tgid: u32,
}

/// `prev` (already widened) plus how far the u32 count `now` moved since
/// `prev`'s low 32 bits, which were the record's value at that read.
#[inline]
fn widen_count(prev: u64, now: u32) -> u64 {
    prev.wrapping_add(u64::from(now.wrapping_sub(prev as u32)))
}

impl TaskRecord {
    /// The record as `TaskCounters`, for a thread instance not read
    /// before: each count is its own value (it cannot have wrapped in one
    /// interval, see the module).
    pub fn widen(&self) -> TaskCounters {
        self.widen_after(&TaskCounters::default())
    }

    /// The record as `TaskCounters`, counts widened from `prev`, the same
    /// thread instance's `TaskCounters` at the last read (its low 32 bits
    /// are the record's counts then). Times and in-flight fields are the
    /// record's own.
    pub fn widen_after(&self, prev: &TaskCounters) -> TaskCounters {
        let o = &self.offcpu;
        let (block_start_ns, block_state) = o.in_flight().unwrap_or((0, offcpu::STATE_NONE));
        TaskCounters {
            oncpu_ns: self.oncpu_ns,
            runq_wait_ns: self.runq_wait_ns,
            voluntary_switches: widen_count(prev.voluntary_switches, self.voluntary_switches),
            involuntary_switches: widen_count(prev.involuntary_switches, self.involuntary_switches),
            faults: FaultCounters {
                entries: widen_count(prev.faults.entries, self.faults.entries),
                minflt: widen_count(prev.faults.minflt, self.faults.minflt),
                majflt: widen_count(prev.faults.majflt, self.faults.majflt),
            },
            tgid: self.tgid,
            _pad: 0,
            born_ns: self.born_ns,
            run_delay_seen_ns: self.run_delay_seen_ns,
            offcpu: OffcpuCounters {
                blocked_s_ns: o.blocked_s_ns,
                blocked_d_ns: o.blocked_d_ns,
                long_blocks: widen_count(prev.offcpu.long_blocks, o.long_blocks),
                wakeups: widen_count(prev.offcpu.wakeups, o.wakeups),
                block_start_ns,
                block_state,
                _pad: 0,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_record_is_88_bytes() {
        // TASKS_BY_TID costs this times pid_max of kernel memory.
        assert_eq!(core::mem::size_of::<TaskRecord>(), 88);
    }

    #[test]
    fn a_block_keeps_its_start_and_state_in_one_word() {
        let mut o = OffcpuRecord::default();
        assert_eq!(o.in_flight(), None);
        o.begin(offcpu::STATE_D, 123_456_789);
        assert_eq!(o.in_flight(), Some((123_456_789, offcpu::STATE_D)));
        o.begin(offcpu::STATE_S, 987);
        assert_eq!(o.in_flight(), Some((987, offcpu::STATE_S)));
        o.begin(offcpu::STATE_NONE, 5);
        assert_eq!(o.in_flight(), None);
        let wide = TaskRecord {
            offcpu: OffcpuRecord {
                block_start: 42 | BLOCK_IN_D,
                ..Default::default()
            },
            ..Default::default()
        }
        .widen();
        assert_eq!(
            (wide.offcpu.block_start_ns, wide.offcpu.block_state),
            (42, offcpu::STATE_D)
        );
    }

    #[test]
    fn counts_widen_across_a_wrap_and_times_are_taken_as_they_are() {
        let prev = TaskRecord {
            oncpu_ns: 5 << 32,
            voluntary_switches: u32::MAX - 1,
            faults: TaskFaults {
                minflt: 7,
                ..Default::default()
            },
            ..Default::default()
        }
        .widen();
        assert_eq!(prev.voluntary_switches, u64::from(u32::MAX - 1));
        assert_eq!(prev.oncpu_ns, 5 << 32);
        // Three switches later the u32 has wrapped to 1.
        let next = TaskRecord {
            oncpu_ns: 6 << 32,
            voluntary_switches: 1,
            faults: TaskFaults {
                minflt: 9,
                ..Default::default()
            },
            ..Default::default()
        }
        .widen_after(&prev);
        assert_eq!(next.voluntary_switches, u64::from(u32::MAX) + 2);
        assert_eq!(next.faults.minflt, 9);
        assert_eq!(next.oncpu_ns, 6 << 32);
        // A second wrap keeps counting from the widened value.
        let again = TaskRecord {
            voluntary_switches: 0,
            ..Default::default()
        }
        .widen_after(&TaskCounters {
            voluntary_switches: (3 << 32) + u64::from(u32::MAX),
            ..Default::default()
        });
        assert_eq!(again.voluntary_switches, 4 << 32);
    }
}
