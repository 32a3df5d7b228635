//! The tasks room: the /proc/<pid> scan's per-process (and per-thread)
//! deltas, ProcessCpuTracker style, and the window they make with the
//! system room's deltas; its counter tracks (ProcessStats and the
//! per-window process counters, `export`) and its columns of `top`.
//!
//! Feed [`Tracker`] raw [`Sample`]s in order; each call after the first
//! returns a [`Window`]. Compared with Android's ProcessCpuTracker:
//! - a counter that goes backwards drops that delta and is counted in
//!   [`DropCounters::negative_deltas`] (ProcessCpuTracker keeps the negative
//!   value, or clamps it in places);
//! - one definition of total CPU ([`crate::procfs::stat::TOTAL_FORMULA`], with
//!   steal) is used for every share, instead of one total for dumpsys and
//!   another (without iowait/softirq) in getTotalCpuPercent; that legacy
//!   number is still exported, under its own name, so users can compare;
//! - a process instance is (pid, starttime), so pid reuse never yields a delta
//!   across two different processes.

pub mod tracks;

use std::sync::Arc;

use super::{
    system::{SystemDrops, SystemWindow},
    Source, Tick,
};
use crate::clock::ClockPair;
use crate::procfs::{Comm, LoadAvg, PidStat, PidStatus, PsiState, Sample};
use crate::{
    control::protocol::TopRow,
    tracker::{Instance, InstanceTable, Prior},
};

/// core-equivalent: may exceed 100% for multi-threaded processes.
pub const CORE_EQUIVALENT_FORMULA: &str = "(Δutime+Δstime)/USER_HZ / ΔCLOCK_MONOTONIC";
/// machine share: 100% means every CPU busy for this task.
pub const MACHINE_SHARE_FORMULA: &str =
    "(Δutime+Δstime) / Δ(user+nice+system+idle+iowait+irq+softirq+steal)";
/// Why deltas were dropped in a window. Every field counts events; none is
/// ever hidden by clamping.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DropCounters {
    /// Files that could not be read or parsed (EACCES, malformed, ...).
    pub read_failures: u64,
    /// Pids listed by readdir and gone when opened (ENOENT/ESRCH).
    pub vanished_pids: u64,
    /// Same, for tids.
    pub vanished_tids: u64,
    /// Cumulative counters that went backwards (system or per task).
    pub negative_deltas: u64,
    /// A clock (BOOTTIME, MONOTONIC, or the /proc/stat tick total) that did
    /// not advance over the window, so no rate could be computed from it.
    pub clock_not_advancing: u64,
    /// Same pid, different starttime: the pid was reused.
    pub starttime_changes: u64,
}

impl DropCounters {
    fn add(&mut self, o: &DropCounters) {
        self.read_failures += o.read_failures;
        self.vanished_pids += o.vanished_pids;
        self.vanished_tids += o.vanished_tids;
        self.negative_deltas += o.negative_deltas;
        self.clock_not_advancing += o.clock_not_advancing;
        self.starttime_changes += o.starttime_changes;
    }
}

/// A window's two lengths. BOOTTIME includes suspend, MONOTONIC does not;
/// None when that clock did not advance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowClocks {
    pub start: ClockPair,
    pub end: ClockPair,
    pub boottime_ns: Option<u64>,
    pub monotonic_ns: Option<u64>,
}

/// Deltas of one task instance over the window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TaskDelta {
    pub utime_ticks: u64,
    pub stime_ticks: u64,
    pub minflt: u64,
    pub majflt: u64,
}

impl TaskDelta {
    pub fn cpu_ticks(&self) -> u64 {
        self.utime_ticks + self.stime_ticks
    }
}

/// One process (or thread) row of a window, flagged as ProcessCpuTracker
/// does: `added` (first seen this window, no delta), `removed` (gone this
/// window, no delta), `working` (used CPU, or added, or removed).
#[derive(Debug, Clone, PartialEq)]
pub struct TaskWindow {
    pub pid: i32,
    /// For threads, the owning process; equal to `pid` for processes.
    pub tgid: i32,
    pub starttime_ticks: u64,
    pub ppid: i32,
    pub comm: Comm,
    pub cmdline: Option<Arc<str>>,
    pub state: u8,
    pub num_threads: u64,
    pub status: Option<PidStatus>,
    /// None when added, removed, or the delta was dropped.
    pub delta: Option<TaskDelta>,
    /// Δcpu/Δwall ([`CORE_EQUIVALENT_FORMULA`]).
    pub core_equivalent_pct: Option<f64>,
    /// Δcpu/Δtotal ([`MACHINE_SHARE_FORMULA`]).
    pub machine_share_pct: Option<f64>,
    pub added: bool,
    pub removed: bool,
    pub working: bool,
}

impl TaskWindow {
    /// The name ProcessCpuTracker shows: argv[0]'s basename, else comm.
    pub fn name(&self) -> String {
        match self.cmdline.as_deref() {
            Some(c) if !c.is_empty() => crate::procfs::cmdline::name_from_cmdline(c).to_owned(),
            _ => self.comm.to_string_lossy(),
        }
    }

    /// `self.name() == name`, without allocating (runs for every process
    /// every sample in the daemon).
    pub fn has_name(&self, name: &str) -> bool {
        match self.cmdline.as_deref() {
            Some(c) if !c.is_empty() => crate::procfs::cmdline::name_from_cmdline(c) == name,
            _ => self.comm.as_bytes() == name.as_bytes(),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Window {
    pub clocks: WindowClocks,
    /// USER_HZ the tick counters were converted with.
    pub hz: u64,
    /// None when /proc/stat was unreadable at either end, a counter went
    /// backwards, or the tick total did not advance.
    pub system: Option<SystemWindow>,
    pub loadavg: Option<LoadAvg>,
    /// cpu, memory, io, as read at the end of the window.
    pub pressure: [Option<PsiState>; 3],
    pub processes: Vec<TaskWindow>,
    /// Empty unless the samples carried threads.
    pub threads: Vec<TaskWindow>,
    /// This window's drops.
    pub drops: DropCounters,
}

impl Window {
    pub fn working_processes(&self) -> impl Iterator<Item = &TaskWindow> {
        self.processes.iter().filter(|p| p.working)
    }
    pub fn added_processes(&self) -> impl Iterator<Item = &TaskWindow> {
        self.processes.iter().filter(|p| p.added)
    }
    pub fn removed_processes(&self) -> impl Iterator<Item = &TaskWindow> {
        self.processes.iter().filter(|p| p.removed)
    }
}

#[derive(Debug, Clone, Copy)]
struct Counters {
    utime_ticks: u64,
    stime_ticks: u64,
    minflt: u64,
    majflt: u64,
}

impl Counters {
    fn of(s: &PidStat) -> Self {
        Counters {
            utime_ticks: s.utime_ticks,
            stime_ticks: s.stime_ticks,
            minflt: s.minflt,
            majflt: s.majflt,
        }
    }
    fn checked_delta(&self, earlier: &Counters) -> Option<TaskDelta> {
        Some(TaskDelta {
            utime_ticks: self.utime_ticks.checked_sub(earlier.utime_ticks)?,
            stime_ticks: self.stime_ticks.checked_sub(earlier.stime_ticks)?,
            minflt: self.minflt.checked_sub(earlier.minflt)?,
            majflt: self.majflt.checked_sub(earlier.majflt)?,
        })
    }
}

/// What the tasks room keeps per instance (its starttime is the table's).
#[derive(Debug, Clone)]
struct Entry {
    tgid: i32,
    ppid: i32,
    comm: Comm,
    cmdline: Option<Arc<str>>,
    counters: Counters,
}

/// Per-window rate denominators.
#[derive(Clone, Copy)]
struct Rates {
    hz: u64,
    monotonic_ns: Option<u64>,
    total_ticks: Option<u64>,
}

impl Rates {
    fn core_equivalent_pct(&self, cpu_ticks: u64) -> Option<f64> {
        let ns = self.monotonic_ns?;
        Some(cpu_ticks as f64 * 1e9 * 100.0 / (self.hz as f64 * ns as f64))
    }
    fn machine_share_pct(&self, cpu_ticks: u64) -> Option<f64> {
        Some(cpu_ticks as f64 * 100.0 / self.total_ticks? as f64)
    }
}

/// One task of a scan, as the table takes it.
struct TaskIn<'a> {
    tgid: i32,
    stat: &'a PidStat,
    status: Option<PidStatus>,
    cmdline: Option<Arc<str>>,
}

/// The tasks room's instance table.
type Instances = InstanceTable<Entry>;

/// A row of `e`, the instance of `pid`, with no figures yet.
fn row(e: &Instance<Entry>, pid: i32) -> TaskWindow {
    TaskWindow {
        pid,
        tgid: e.value.tgid,
        starttime_ticks: e.starttime_ticks,
        ppid: e.value.ppid,
        comm: e.value.comm,
        cmdline: e.value.cmdline.clone(),
        state: b'?',
        num_threads: 0,
        status: None,
        delta: None,
        core_equivalent_pct: None,
        machine_share_pct: None,
        added: false,
        removed: false,
        working: false,
    }
}

/// Updates one instance; pushes its row(s) to `rows`.
fn update(
    table: &mut Instances,
    t: TaskIn<'_>,
    generation: u64,
    first: bool,
    rates: Rates,
    drops: &mut DropCounters,
    rows: &mut Vec<TaskWindow>,
) {
    let s = t.stat;
    let fresh = Entry {
        tgid: t.tgid,
        ppid: s.ppid,
        comm: s.comm,
        cmdline: t.cmdline,
        counters: Counters::of(s),
    };
    let (prior, entry) = table.observe(s.pid, s.starttime_ticks, generation, fresh);
    let mut row = row(entry, s.pid);
    row.state = s.state;
    row.num_threads = s.num_threads;
    row.status = t.status;
    match prior {
        Prior::Same(e) => {
            if e.baseline_valid {
                match entry.value.counters.checked_delta(&e.value.counters) {
                    Some(d) => {
                        row.core_equivalent_pct = rates.core_equivalent_pct(d.cpu_ticks());
                        row.machine_share_pct = rates.machine_share_pct(d.cpu_ticks());
                        row.working = d.cpu_ticks() > 0;
                        row.delta = Some(d);
                    }
                    None => drops.negative_deltas += 1,
                }
            }
            if entry.value.cmdline.is_none() {
                row.cmdline = e.value.cmdline.clone();
                entry.value.cmdline = e.value.cmdline;
            }
        }
        Prior::Reused(e) => {
            // pid reused: the old instance is gone, a new one starts.
            drops.starttime_changes += 1;
            let mut old = self::row(&e, s.pid);
            old.removed = true;
            old.working = true;
            rows.push(old);
            row.added = true;
            row.working = true;
        }
        Prior::New => {
            row.added = !first;
            row.working = !first;
        }
    }
    rows.push(row);
}

/// Everything not seen this generation has exited: a `removed` row each.
fn sweep(table: &mut Instances, generation: u64, rows: &mut Vec<TaskWindow>) {
    table.sweep(generation, |pid, e| {
        let mut r = row(&e, pid);
        r.removed = true;
        r.working = true;
        rows.push(r);
    });
}

pub struct Tracker {
    hz: u64,
    prev_clock: Option<ClockPair>,
    processes: Instances,
    threads: Instances,
    generation: u64,
    totals: DropCounters,
}

impl Tracker {
    /// `hz` is USER_HZ (`crate::system::clock_ticks_per_second()` in the
    /// daemon); a parameter so tests can use other values.
    pub fn new(hz: u64) -> Self {
        assert!(hz > 0, "USER_HZ must be positive");
        Tracker {
            hz,
            prev_clock: None,
            processes: Instances::default(),
            threads: Instances::default(),
            generation: 0,
            totals: DropCounters::default(),
        }
    }

    pub fn hz(&self) -> u64 {
        self.hz
    }

    /// Drops summed over every window so far.
    pub fn drop_totals(&self) -> DropCounters {
        self.totals
    }

    /// Takes the next sample with the system room's window of the same
    /// scan (`system`, and what it dropped). The first one only sets the
    /// baseline and returns None; every later one returns the window since
    /// the previous.
    pub fn update(
        &mut self,
        sample: &Sample,
        system: Option<SystemWindow>,
        system_drops: SystemDrops,
    ) -> Option<Window> {
        self.generation += 1;
        let generation = self.generation;
        let first = self.generation == 1;
        let mut drops = DropCounters {
            read_failures: sample.counts.read_failures,
            vanished_pids: sample.counts.vanished_pids,
            vanished_tids: sample.counts.vanished_tids,
            ..DropCounters::default()
        };

        let end = sample.clock.unwrap_or_else(ClockPair::now);
        let start = self.prev_clock.replace(end);
        let clocks = start.map(|start| {
            let boottime_ns = end
                .boottime_ns
                .checked_sub(start.boottime_ns)
                .filter(|&d| d > 0);
            let monotonic_ns = end
                .monotonic_ns
                .checked_sub(start.monotonic_ns)
                .filter(|&d| d > 0);
            if boottime_ns.is_none() || monotonic_ns.is_none() {
                drops.clock_not_advancing += 1;
            }
            WindowClocks {
                start,
                end,
                boottime_ns,
                monotonic_ns,
            }
        });

        drops.negative_deltas += system_drops.negative_deltas;
        drops.clock_not_advancing += system_drops.clock_not_advancing;

        let rates = Rates {
            hz: self.hz,
            monotonic_ns: clocks.and_then(|c| c.monotonic_ns),
            total_ticks: system.as_ref().map(|s| s.total_ticks),
        };

        let mut processes = Vec::with_capacity(sample.processes.len());
        for p in &sample.processes {
            update(
                &mut self.processes,
                TaskIn {
                    tgid: p.stat.pid,
                    stat: &p.stat,
                    status: p.status,
                    cmdline: p.cmdline.clone(),
                },
                generation,
                first,
                rates,
                &mut drops,
                &mut processes,
            );
        }
        for &pid in &sample.unreadable_pids {
            self.processes.mark_unreadable(pid, generation);
        }
        sweep(&mut self.processes, generation, &mut processes);

        let mut threads = Vec::with_capacity(sample.threads.len());
        for t in &sample.threads {
            update(
                &mut self.threads,
                TaskIn {
                    tgid: t.tgid,
                    stat: &t.stat,
                    status: None,
                    cmdline: None,
                },
                generation,
                first,
                rates,
                &mut drops,
                &mut threads,
            );
        }
        for &tid in &sample.unreadable_tids {
            self.threads.mark_unreadable(tid, generation);
        }
        sweep(&mut self.threads, generation, &mut threads);

        self.totals.add(&drops);
        let clocks = clocks?;
        Some(Window {
            clocks,
            hz: self.hz,
            system,
            loadavg: sample.loadavg,
            pressure: sample.pressure,
            processes,
            threads,
            drops,
        })
    }
}

/// The per-process figures this room offers to history and rules.
pub mod figures {
    use crate::figures::Figure;

    /// (Δutime+Δstime)/USER_HZ / Δwall(MONOTONIC), % (0 when unknown).
    pub static CORE_EQUIVALENT_PCT: Figure = Figure {
        name: "tasks.core_equivalent_pct",
    };
    /// Δmajflt / Δwall(MONOTONIC) (0 when unknown).
    pub static MAJFLT_PER_S: Figure = Figure {
        name: "tasks.majflt_per_s",
    };
    /// VmRSS of /proc/<pid>/status, kB (absent when unread).
    pub static RSS_KB: Figure = Figure {
        name: "tasks.rss_kb",
    };
}

/// Major faults per second over the window (0 without a delta).
pub fn majflt_per_s(win: &Window, p: &TaskWindow) -> f64 {
    let mono_s = win.clocks.monotonic_ns.unwrap_or(0) as f64 / 1e9;
    match (&p.delta, mono_s > 0.0) {
        (Some(d), true) => d.majflt as f64 / mono_s,
        _ => 0.0,
    }
}

impl Source for Tracker {
    /// The window of this scan, with the system room's part of it.
    fn sample(&mut self, tick: &mut Tick) {
        let system = tick.system.take();
        tick.window = self.update(&tick.sample, system, tick.system_drops);
    }

    /// The procfs columns: CPU shares, fault deltas, RSS.
    fn columns(&self, _tick: &Tick, p: &TaskWindow, row: &mut TopRow) {
        row.pid = p.pid;
        row.name = p.name();
        row.core_equivalent_pct = p.core_equivalent_pct.unwrap_or(0.0);
        row.machine_share_pct = p.machine_share_pct.unwrap_or(0.0);
        row.minflt = p.delta.map(|d| d.minflt).unwrap_or(0);
        row.majflt = p.delta.map(|d| d.majflt).unwrap_or(0);
        row.rss_kb = p.status.as_ref().and_then(|s| s.vm_rss_kb);
    }

    /// Core-equivalent %, major faults/s, RSS.
    fn process_figures(
        &self,
        tick: &Tick,
        p: &TaskWindow,
        out: &mut crate::figures::ProcessFigures,
    ) {
        let Some(win) = &tick.window else { return };
        out.set(
            &figures::CORE_EQUIVALENT_PCT,
            p.core_equivalent_pct.unwrap_or(0.0),
        );
        out.set(&figures::MAJFLT_PER_S, majflt_per_s(win, p));
        let rss_kb = p.status.as_ref().and_then(|s| s.vm_rss_kb);
        out.set_some(&figures::RSS_KB, rss_kb.map(|kb| kb as f64));
    }

    /// `procfs_drops`: every window's drops so far, by reason.
    fn status(
        &self,
        out: &mut std::collections::BTreeMap<&'static str, std::collections::BTreeMap<String, u64>>,
    ) {
        let d = self.drop_totals();
        out.insert(
            "procfs_drops",
            [
                ("read_failures", d.read_failures),
                ("vanished_pids", d.vanished_pids),
                ("vanished_tids", d.vanished_tids),
                ("negative_deltas", d.negative_deltas),
                ("clock_not_advancing", d.clock_not_advancing),
                ("starttime_changes", d.starttime_changes),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect(),
        );
    }
}

/// The procfs windows alone, the system and tasks rooms together, for
/// `vitalsd snapshot` and tests (the pipeline runs the two rooms itself).
pub struct Windows {
    pub system: crate::sources::system::System,
    pub tasks: Tracker,
}

impl Windows {
    pub fn new(hz: u64) -> Self {
        Self {
            system: Default::default(),
            tasks: Tracker::new(hz),
        }
    }

    /// [`Tracker::update`] with the system room's window of `sample`.
    pub fn update(&mut self, sample: &Sample) -> Option<Window> {
        let mut drops = SystemDrops::default();
        let system = self.system.update(sample.system.as_ref(), &mut drops);
        self.tasks.update(sample, system, drops)
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod testutil;
#[cfg(test)]
pub(crate) use testutil::quiet_process_window;
