//! The system room: /proc/stat, /proc/loadavg and /proc/pressure (read by
//! `procfs`'s parsers in the one scan), their per-window deltas, their
//! counter tracks and the figures they give status. Compared with
//! Android's ProcessCpuTracker: a counter that goes backwards drops that
//! delta and is counted (ProcessCpuTracker keeps the negative value, or
//! clamps it in places), and one definition of total CPU
//! ([`TOTAL_FORMULA`], with steal) is used for every share; the legacy
//! getTotalCpuPercent number is still exported, under its own name.

#[cfg(test)]
mod tests;
pub mod tracks;

use super::{Source, Tick};
use crate::procfs::stat::{CpuTimes, SystemStat, LOCAL_BUSY_FORMULA, TOTAL_FORMULA};

/// What ProcessCpuTracker.getTotalCpuPercent computes (it drops iowait,
/// softirq and steal from the denominator).
pub const ANDROID_LEGACY_TOTAL_FORMULA: &str =
    "(user+nice+system+irq) / (user+nice+system+irq+idle)";

#[derive(Debug, Clone, PartialEq)]
pub struct SystemWindow {
    /// Field-wise deltas of the aggregate `cpu` line.
    pub delta: CpuTimes,
    /// Δ(user+nice+system+idle+iowait+irq+softirq+steal).
    pub total_ticks: u64,
    pub total_formula: &'static str,
    /// Δ(user+nice+system+irq+softirq).
    pub local_busy_ticks: u64,
    pub local_busy_formula: &'static str,
    /// local_busy_ticks / total_ticks × 100.
    pub local_busy_pct: f64,
    /// ProcessCpuTracker.getTotalCpuPercent's value for the same window, for
    /// comparison only (see [`ANDROID_LEGACY_TOTAL_FORMULA`]).
    pub android_legacy_total_cpu_pct: Option<f64>,
    /// Per-CPU deltas for CPUs online at both ends whose counters moved
    /// forward.
    pub per_cpu: Vec<(u32, CpuTimes)>,
    /// Online CPUs at the end of the window.
    pub online_cpus: Vec<u32>,
    /// Hotplug over the window.
    pub cpus_onlined: Vec<u32>,
    pub cpus_offlined: Vec<u32>,
    pub ctxt_delta: Option<u64>,
    pub forks_delta: Option<u64>,
    pub procs_running: u64,
    pub procs_blocked: u64,
}

impl SystemWindow {
    /// `ticks` as a share of this window's total, in %.
    pub fn share_pct(&self, ticks: u64) -> f64 {
        ticks as f64 * 100.0 / self.total_ticks as f64
    }
}

/// Deltas this room dropped in a window, by reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SystemDrops {
    /// A /proc/stat counter went backwards.
    pub negative_deltas: u64,
    /// The /proc/stat tick total did not advance.
    pub clock_not_advancing: u64,
}

/// The source's state: the last /proc/stat read.
#[derive(Debug, Default)]
pub struct System {
    prev: Option<SystemStat>,
}

impl System {
    /// This window's deltas of /proc/stat: None when it was unreadable at
    /// either end, a counter went backwards, or the tick total did not
    /// advance (each counted in `drops`). A failed read keeps the old
    /// baseline out: the next window would otherwise span two windows'
    /// worth of ticks.
    pub fn update(
        &mut self,
        cur: Option<&SystemStat>,
        drops: &mut SystemDrops,
    ) -> Option<SystemWindow> {
        let prev = std::mem::replace(&mut self.prev, cur.cloned());
        window(prev.as_ref()?, cur?, drops)
    }
}

/// The window between two reads of /proc/stat.
fn window(prev: &SystemStat, cur: &SystemStat, drops: &mut SystemDrops) -> Option<SystemWindow> {
    let Some(delta) = cpu_delta(&cur.total, &prev.total) else {
        drops.negative_deltas += 1;
        return None;
    };
    let total_ticks = delta.total_ticks();
    if total_ticks == 0 {
        drops.clock_not_advancing += 1;
        return None;
    }
    let local_busy_ticks = delta.local_busy_ticks();
    let legacy_busy = delta.user_ticks + delta.nice_ticks + delta.system_ticks + delta.irq_ticks;
    let legacy_denom = legacy_busy + delta.idle_ticks;
    let mut per_cpu = Vec::with_capacity(cur.per_cpu.len());
    for (cpu, times) in &cur.per_cpu {
        if let Some((_, before)) = prev.per_cpu.iter().find(|(c, _)| c == cpu) {
            match cpu_delta(times, before) {
                Some(d) => per_cpu.push((*cpu, d)),
                None => drops.negative_deltas += 1,
            }
        }
    }
    let online_cpus: Vec<u32> = cur.online_cpus().collect();
    let was_online: Vec<u32> = prev.online_cpus().collect();
    let ctxt_delta = cur.ctxt.checked_sub(prev.ctxt);
    let forks_delta = cur.processes.checked_sub(prev.processes);
    drops.negative_deltas += u64::from(ctxt_delta.is_none()) + u64::from(forks_delta.is_none());
    Some(SystemWindow {
        delta,
        total_ticks,
        total_formula: TOTAL_FORMULA,
        local_busy_ticks,
        local_busy_formula: LOCAL_BUSY_FORMULA,
        local_busy_pct: local_busy_ticks as f64 * 100.0 / total_ticks as f64,
        android_legacy_total_cpu_pct: (legacy_denom > 0)
            .then(|| legacy_busy as f64 * 100.0 / legacy_denom as f64),
        per_cpu,
        cpus_onlined: online_cpus
            .iter()
            .filter(|c| !was_online.contains(c))
            .copied()
            .collect(),
        cpus_offlined: was_online
            .iter()
            .filter(|c| !online_cpus.contains(c))
            .copied()
            .collect(),
        online_cpus,
        ctxt_delta,
        forks_delta,
        procs_running: cur.procs_running,
        procs_blocked: cur.procs_blocked,
    })
}

/// Field-wise `cur - earlier`, or `None` if any counter went backwards
/// (iowait can: it is sampled from NOHZ idle accounting and is corrected
/// downwards when a CPU goes offline or leaves idle).
pub fn cpu_delta(cur: &CpuTimes, earlier: &CpuTimes) -> Option<CpuTimes> {
    Some(CpuTimes {
        user_ticks: cur.user_ticks.checked_sub(earlier.user_ticks)?,
        nice_ticks: cur.nice_ticks.checked_sub(earlier.nice_ticks)?,
        system_ticks: cur.system_ticks.checked_sub(earlier.system_ticks)?,
        idle_ticks: cur.idle_ticks.checked_sub(earlier.idle_ticks)?,
        iowait_ticks: cur.iowait_ticks.checked_sub(earlier.iowait_ticks)?,
        irq_ticks: cur.irq_ticks.checked_sub(earlier.irq_ticks)?,
        softirq_ticks: cur.softirq_ticks.checked_sub(earlier.softirq_ticks)?,
        steal_ticks: cur.steal_ticks.checked_sub(earlier.steal_ticks)?,
        guest_ticks: cur.guest_ticks.checked_sub(earlier.guest_ticks)?,
        guest_nice_ticks: cur.guest_nice_ticks.checked_sub(earlier.guest_nice_ticks)?,
    })
}

/// The system-wide figures this room offers to history and rules.
pub mod figures {
    use crate::figures::Figure;

    /// (user+nice+system+irq+softirq)/total of /proc/stat, %.
    pub static LOCAL_BUSY_PCT: Figure = Figure {
        name: "system.local_busy_pct",
    };
    /// /proc/loadavg's 1-minute average.
    pub static LOADAVG_1M: Figure = Figure {
        name: "system.loadavg_1m",
    };
    /// The same divided by the online CPUs (absent when none are known).
    pub static LOADAVG_1M_PER_CPU: Figure = Figure {
        name: "system.loadavg_1m_per_cpu",
    };
    /// PSI avg10 %, [cpu, memory, io] x [some, full].
    pub static PSI_AVG10: [[Figure; 2]; 3] = [
        [
            Figure {
                name: "system.psi_cpu_some_avg10",
            },
            Figure {
                name: "system.psi_cpu_full_avg10",
            },
        ],
        [
            Figure {
                name: "system.psi_memory_some_avg10",
            },
            Figure {
                name: "system.psi_memory_full_avg10",
            },
        ],
        [
            Figure {
                name: "system.psi_io_some_avg10",
            },
            Figure {
                name: "system.psi_io_full_avg10",
            },
        ],
    ];
}

impl Source for System {
    fn sample(&mut self, tick: &mut Tick) {
        tick.system = self.update(tick.sample.system.as_ref(), &mut tick.system_drops);
    }

    /// Busy %, loadavg (raw and per online CPU), PSI avg10.
    fn figures(&self, tick: &Tick, out: &mut crate::figures::SampleFigures) {
        // The window the tasks room built around this room's part.
        let Some(win) = &tick.window else { return };
        out.set_some(
            &figures::LOCAL_BUSY_PCT,
            win.system.as_ref().map(|s| s.local_busy_pct),
        );
        let load1 = win.loadavg.as_ref().map(|l| l.load1);
        out.set_some(&figures::LOADAVG_1M, load1.map(f64::from));
        let online_cpus = win
            .system
            .as_ref()
            .map_or(0, |s| s.online_cpus.len() as u32);
        out.set_some(
            &figures::LOADAVG_1M_PER_CPU,
            load1
                .filter(|_| online_cpus > 0)
                .map(|l| l as f64 / online_cpus as f64),
        );
        for (resource, state) in win.pressure.iter().enumerate() {
            if let Some(crate::procfs::PsiState::Available(p)) = state {
                let [some, full] = &figures::PSI_AVG10[resource];
                out.set(some, f64::from(p.some.avg10_pct));
                out.set_some(full, p.full.as_ref().map(|f| f64::from(f.avg10_pct)));
            }
        }
    }
}
