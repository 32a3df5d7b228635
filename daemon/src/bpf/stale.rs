//! Task slots no sched_process_free ever freed. The classic program is
//! skipped while `bpf_prog_active` is raised on its CPU (`free_missed`,
//! `programs::free_misses`); the freed task's slot then stays, stamped, as
//! if the task were alive: its process would never end, and a task given
//! its tid later would go on from its counters (`mapped::task_slot` keeps
//! a stamped slot).
//!
//! So when `free_missed` grows (every minute where the kernel does not
//! count, before 5.12), the slots read are held against /proc, the
//! kernel's own list of tasks. A slot is stale when
//! - /proc/<tid> is gone and stays gone for `CONFIRM_NS` (release_task
//!   unhashes the pid an RCU grace period before the free, so a slot of
//!   a task exiting right now is gone from /proc for a while too), or
//! - the task holding its tid now started after the slot was stamped
//!   (`starttime` against `born_ns`): the tid was reused.
//!
//! `counters::free_stale` frees the stale slots.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
};

use vitals_common::TaskRecord;

use crate::procfs::pid_stat::parse_pid_stat;

/// How long a slot's tid must stay gone from /proc before the slot is
/// taken as never freed: far above an RCU grace period.
pub(crate) const CONFIRM_NS: u64 = 2_000_000_000;

/// The least time between two sweeps of every slot (a read of /proc/<tid>/stat
/// each), however often frees are skipped: misses counted meanwhile wait
/// for the next.
pub(crate) const MIN_SWEEP_NS: u64 = 10_000_000_000;

/// Where the kernel cannot count skipped frees, how often every slot is
/// held against /proc.
pub(crate) const BLIND_SWEEP_NS: u64 = 60_000_000_000;

/// Who holds a slot's tid now, by /proc.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Holder {
    /// The task that stamped the slot (or one /proc cannot tell).
    Owner,
    /// No task: /proc/<tid> is gone.
    Gone,
    /// A task that started after the stamp.
    Reused,
}

#[derive(Debug, Clone, Copy)]
struct Suspect {
    born_ns: u64,
    gone_since_ns: u64,
}

/// The sweep's state from one read to the next.
#[derive(Debug)]
pub(crate) struct StaleSweep {
    proc_root: PathBuf,
    /// USER_HZ: /proc's `starttime` unit.
    hz: u64,
    /// `free_missed` as of the last sweep of every slot.
    missed_seen: u64,
    last_sweep_ns: Option<u64>,
    /// Slots whose tid was gone from /proc, by tid.
    suspects: HashMap<u32, Suspect>,
    /// Slots freed so far.
    pub(crate) freed: u64,
}

impl StaleSweep {
    /// Against this host's /proc, in its USER_HZ.
    pub(crate) fn for_this_host() -> Self {
        let hz = crate::system::clock_ticks_per_second().unwrap_or_else(|e| {
            log::warn!("{e}; taking USER_HZ as 100");
            100
        });
        Self::new("/proc", hz)
    }

    pub(crate) fn new(proc_root: impl Into<PathBuf>, hz: u64) -> Self {
        Self {
            proc_root: proc_root.into(),
            hz: hz.max(1),
            missed_seen: 0,
            last_sweep_ns: None,
            suspects: HashMap::new(),
            freed: 0,
        }
    }

    /// The tids of `tasks` whose slot is stale now. `free_missed`: the
    /// kernel's count of skipped frees, None where it keeps none.
    /// `now_ns` is CLOCK_MONOTONIC (the stamps' clock), `boot_offset_ns`
    /// CLOCK_BOOTTIME minus it now (the time spent suspended so far).
    pub(crate) fn stale(
        &mut self,
        tasks: &HashMap<u32, TaskRecord>,
        free_missed: Option<u64>,
        now_ns: u64,
        boot_offset_ns: u64,
    ) -> Vec<u32> {
        // A suspect whose slot was freed (or stamped anew) since is done.
        self.suspects
            .retain(|tid, s| tasks.get(tid).is_some_and(|t| t.born_ns == s.born_ns));
        // Where the kernel does not count, the first sweep comes a
        // minute after the first read, not at start-up with the rest.
        if free_missed.is_none() && self.last_sweep_ns.is_none() {
            self.last_sweep_ns = Some(now_ns);
        }
        let since_last = |every: u64| {
            self.last_sweep_ns
                .is_none_or(|last| now_ns.saturating_sub(last) >= every)
        };
        let sweep_all = match free_missed {
            Some(missed) => missed > self.missed_seen && since_last(MIN_SWEEP_NS),
            None => since_last(BLIND_SWEEP_NS),
        };
        let tids: Vec<u32> = if sweep_all {
            self.missed_seen = free_missed.unwrap_or(0).max(self.missed_seen);
            self.last_sweep_ns = Some(now_ns);
            tasks.keys().copied().collect()
        } else {
            self.suspects.keys().copied().collect()
        };
        let mut stale = Vec::new();
        for tid in tids {
            let born_ns = tasks[&tid].born_ns;
            match self.holder(tid, born_ns, boot_offset_ns) {
                Holder::Owner => {
                    self.suspects.remove(&tid);
                }
                Holder::Reused => {
                    self.suspects.remove(&tid);
                    stale.push(tid);
                }
                Holder::Gone => {
                    let since = self
                        .suspects
                        .entry(tid)
                        .or_insert(Suspect {
                            born_ns,
                            gone_since_ns: now_ns,
                        })
                        .gone_since_ns;
                    if now_ns.saturating_sub(since) >= CONFIRM_NS {
                        self.suspects.remove(&tid);
                        stale.push(tid);
                    }
                }
            }
        }
        stale.sort_unstable();
        stale
    }

    /// Who holds `tid`, whose slot was stamped at `born_ns` (monotonic).
    fn holder(&self, tid: u32, born_ns: u64, boot_offset_ns: u64) -> Holder {
        let path = stat_path(&self.proc_root, tid);
        let text = match std::fs::read(&path) {
            Ok(text) => text,
            // ESRCH: the task died between the open and the read.
            Err(e)
                if e.kind() == std::io::ErrorKind::NotFound
                    || e.raw_os_error() == Some(libc::ESRCH) =>
            {
                return Holder::Gone
            }
            Err(e) => {
                log::debug!("{}: {e}", path.display());
                return Holder::Owner;
            }
        };
        let Ok(stat) = parse_pid_stat(&text) else {
            return Holder::Owner;
        };
        // starttime is the task's start_boottime in ticks, rounded down;
        // the owner's is at most its stamp plus the time suspended since.
        let started_boot_ns = stat.starttime_ticks.saturating_mul(1_000_000_000) / self.hz;
        if started_boot_ns > born_ns.saturating_add(boot_offset_ns) {
            Holder::Reused
        } else {
            Holder::Owner
        }
    }
}

/// /proc/<tid>/stat: any thread's, not only a leader's (the kernel
/// resolves every tid under /proc, though it lists leaders only).
fn stat_path(proc_root: &Path, tid: u32) -> PathBuf {
    proc_root.join(tid.to_string()).join("stat")
}

#[cfg(test)]
mod tests;
