//! The procfs scheduler source: the kernel's own per-thread scheduler
//! accounting, read where no eBPF is granted (the CTS tier: an unmodified
//! AOSP policy gives a platform daemon `r_dir_file(vitalsd, domain)`, every
//! `/proc/<pid>/…`, but no bpf map reads).
//!
//! Per thread, `task/<tid>/schedstat` gives on-CPU ns (`sum_exec_runtime`,
//! exactly what the kernel charges), runqueue wait ns (`run_delay`) and
//! switch-ins (`pcount`); `task/<tid>/status` gives the switch-outs split
//! voluntary / involuntary. They fold into the same cumulative
//! [`ProcessCounters`] the eBPF tier produces, so every sink (trace tracks,
//! top, rules, the Perfetto data source) takes either tier.
//!
//! Cost: a thread's status is read only when it may have switched since
//! the last read: its `pcount` moved, or it was on a CPU then (switch-ins
//! == switch-outs once it is off a CPU, one more while it runs). A process
//! is read every scan while anything of it moves; one whose threads showed
//! no movement at all is re-read after 2, 4, then at most
//! [`MAX_BACKOFF_SCANS`] scans, unless its stat shows a new tick or thread
//! count first. Within a process that is read, a thread that did not move
//! at its last read backs off the same way, unless the process's stat
//! shows more CPU (beyond two ticks of rounding) than the threads read
//! explain, which reads them all; every thread is read at least every
//! [`MAX_BACKOFF_SCANS`] scans, and only such a full read reconciles with
//! the process's stat. Counters are cumulative, so a deferred read loses
//! nothing: a quiet thread's sub-tick work shows up to that many scans late.
//! (Skipping on stat's ticks alone was tried and dropped: a thread that
//! sleeps 300 times in 600 ms uses under one tick, and its switches went
//! unseen until the next refresh.)
//!
//! Threads that die between two scans: the kernel folds a dead thread's
//! runtime into the thread group (`signal->sum_sched_runtime`), which the
//! process's `stat` utime+stime report in ticks. The last counters read of
//! a thread that left are kept; what the process's stat shows beyond every
//! thread's counters (the end of a thread's life after its last read, or a
//! thread that lived and died between scans) is added at tick precision
//! and counted (`tick_precision_ns`). Both parts are lower bounds of the
//! kernel's figure, so the total never overstates it. Runqueue wait and
//! switches have no thread-group total in procfs: the part of a dead
//! thread after its last read is lost, and `exited_threads` says how many
//! threads that concerns.

#[cfg(test)]
mod tests;
mod threads;

use std::{collections::HashMap, path::Path};

use vitals_common::FaultCounters;

use super::{tasks::TaskWindow, Source, Tick};
use crate::{
    accounting::ProcessCounters,
    control::protocol::TopRow,
    procfs::{
        is_vanished, parse_ctxt_switches, read_task_file,
        sampler::{list_numeric, Sample},
        schedstat::{self, parse_schedstat, SchedstatMissing},
        ProcPath, ReadOutcome,
    },
};

/// The longest a process whose threads did not move goes unread (scans).
pub const MAX_BACKOFF_SCANS: u64 = 8;

/// What the source did and could not see, cumulative since it started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SchedProcfsStats {
    /// `task/<tid>/schedstat` files read.
    pub schedstat_reads: u64,
    /// `task/<tid>/status` files read for switch counts.
    pub status_reads: u64,
    /// Scans of a quiet process whose threads were not read (backoff).
    pub deferred_processes: u64,
    /// Quiet threads of a process that was read, left unread (backoff).
    pub deferred_threads: u64,
    /// Reads of every thread because the process's stat showed more CPU
    /// than the threads read explained.
    pub escalated_reads: u64,
    /// On-CPU ns known only from a process's stat (clock ticks): threads
    /// that ended between scans.
    pub tick_precision_ns: u64,
    /// Threads gone between two scans (their last counters are kept; the
    /// runqueue wait and switches after that read are not seen).
    pub exited_threads: u64,
    /// A thread's counters went backwards: its tid was reused in the same
    /// process between two scans; the old thread's last counters are kept.
    pub tid_reuse: u64,
    /// Reads that failed for another reason than the task exiting.
    pub read_failures: u64,
}

impl SchedProcfsStats {
    /// By name, for status and the trace.
    pub fn counters(&self) -> std::collections::BTreeMap<String, u64> {
        [
            ("schedstat_reads", self.schedstat_reads),
            ("status_reads", self.status_reads),
            ("deferred_processes", self.deferred_processes),
            ("deferred_threads", self.deferred_threads),
            ("escalated_reads", self.escalated_reads),
            ("tick_precision_ns", self.tick_precision_ns),
            ("exited_threads", self.exited_threads),
            ("tid_reuse", self.tid_reuse),
            ("read_failures", self.read_failures),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }
}

/// The source, or None with one log line naming what the kernel lacks.
pub fn open_or_log(proc_root: &Path, hz: u64) -> Option<SchedProcfs> {
    match SchedProcfs::open(proc_root, hz) {
        Ok(s) => {
            log::info!(
                "no eBPF: per-task accounting from the kernel's schedstat and status (tier cts)"
            );
            Some(s)
        }
        Err(e) => {
            log::warn!("no eBPF and no schedstat: {e}; per-process CPU in clock ticks only");
            None
        }
    }
}

/// One thread's cumulative counters as last read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct ThreadCounters {
    oncpu_ns: u64,
    runq_wait_ns: u64,
    /// Switch-ins (`pcount`).
    timeslices: u64,
    voluntary_switches: u64,
    involuntary_switches: u64,
}

impl ThreadCounters {
    fn add(&mut self, o: &ThreadCounters) {
        self.oncpu_ns += o.oncpu_ns;
        self.runq_wait_ns += o.runq_wait_ns;
        self.timeslices += o.timeslices;
        self.voluntary_switches += o.voluntary_switches;
        self.involuntary_switches += o.involuntary_switches;
    }

    /// Off a CPU when its status was read: as many switch-outs as
    /// switch-ins, so no switch happened since unless `pcount` moves.
    fn quiescent(&self) -> bool {
        self.timeslices == self.voluntary_switches + self.involuntary_switches
    }
}

#[derive(Debug)]
struct ThreadState {
    last: ThreadCounters,
    /// `last`'s switch counts are current as of `last.timeslices`.
    quiescent: bool,
    seen: u64,
    /// The scan that last read it, and the scans until the next read
    /// while it does not move (1..=MAX_BACKOFF_SCANS).
    read_at: u64,
    backoff: u64,
}

/// What one pass over a process's threads read.
#[derive(Clone, Copy)]
struct ThreadsRead {
    /// Every listed thread was read.
    all: bool,
    /// On-CPU ns the threads read gained since their last read.
    fresh_oncpu_ns: u64,
    /// A thread read moved, appeared or left: the process is not quiet.
    moved: bool,
}

#[derive(Debug)]
struct ProcessState {
    starttime_ticks: u64,
    /// utime+stime ticks and thread count at the last thread read.
    fingerprint: (u64, u64),
    /// The scan of the last thread read (0: never).
    threads_read: u64,
    /// Scans until the next thread read while nothing moves (1..=MAX).
    backoff: u64,
    /// The scan that last read every thread (0: never).
    full_read: u64,
    seen: u64,
    threads: HashMap<u32, ThreadState>,
    /// Final counters (as last read) of threads that are gone.
    exited: ThreadCounters,
    exited_threads: u32,
    /// On-CPU ns only the process's stat shows (tick precision).
    tick_extra_ns: u64,
    faults: FaultCounters,
}

impl ProcessState {
    fn new(starttime_ticks: u64) -> Self {
        Self {
            starttime_ticks,
            fingerprint: (0, 0),
            threads_read: 0,
            backoff: 1,
            full_read: 0,
            seen: 0,
            threads: HashMap::new(),
            exited: ThreadCounters::default(),
            exited_threads: 0,
            tick_extra_ns: 0,
            faults: FaultCounters::default(),
        }
    }

    fn thread_totals(&self) -> ThreadCounters {
        let mut t = self.exited;
        for th in self.threads.values() {
            t.add(&th.last);
        }
        t
    }

    fn row(&self, tgid: u32, ended: bool) -> ProcessCounters {
        let t = self.thread_totals();
        ProcessCounters {
            tgid,
            oncpu_ns: t.oncpu_ns + self.tick_extra_ns,
            runq_wait_ns: t.runq_wait_ns,
            voluntary_switches: t.voluntary_switches,
            involuntary_switches: t.involuntary_switches,
            faults: self.faults,
            live_threads: if ended { 0 } else { self.threads.len() as u32 },
            exited_threads: self.exited_threads,
            ended,
            exit_comm: None,
            // The CTS tier has no sched_waking: no off-CPU accounting.
            offcpu: Default::default(),
            main_thread_long_blocks: 0,
        }
    }
}

/// The source: its reader state and what it has folded so far.
pub struct SchedProcfs {
    hz: u64,
    buf: Vec<u8>,
    path: ProcPath,
    dirent_buf: Vec<u8>,
    tids: Vec<u32>,
    processes: HashMap<u32, ProcessState>,
    generation: u64,
    pub stats: SchedProcfsStats,
}

impl SchedProcfs {
    /// Checks that this kernel has live schedstat files (see
    /// [`schedstat::probe`]) and starts the source over `proc_root`.
    pub fn open(proc_root: &Path, hz: u64) -> Result<Self, SchedstatMissing> {
        schedstat::probe(proc_root)?;
        Ok(Self::new(proc_root, hz))
    }

    /// The source without the probe (fake procfs trees in tests).
    pub fn new(proc_root: &Path, hz: u64) -> Self {
        Self {
            hz: hz.max(1),
            buf: Vec::with_capacity(1024),
            path: ProcPath::new(proc_root),
            dirent_buf: vec![0; 16 * 1024],
            tids: Vec::new(),
            processes: HashMap::new(),
            generation: 0,
            stats: SchedProcfsStats::default(),
        }
    }

    /// Folds this scan's processes (their stat already read by the
    /// sampler) and their threads into cumulative per-process counters:
    /// one row per live process, then a final row (`ended`) for each
    /// process instance that is gone (or whose pid now has a new
    /// starttime, before the new instance's row).
    pub fn update(&mut self, sample: &Sample) -> Vec<ProcessCounters> {
        self.generation += 1;
        let generation = self.generation;
        let mut rows = Vec::with_capacity(sample.processes.len() + 8);
        for p in &sample.processes {
            let pid = p.stat.pid as u32;
            let mut st = match self.processes.remove(&pid) {
                Some(st) if st.starttime_ticks == p.stat.starttime_ticks => st,
                Some(old) => {
                    // A reused pid: the old instance's final row first.
                    rows.push(old.row(pid, true));
                    ProcessState::new(p.stat.starttime_ticks)
                }
                None => ProcessState::new(p.stat.starttime_ticks),
            };
            st.seen = generation;
            let cpu_ticks = p.stat.utime_ticks.saturating_add(p.stat.stime_ticks);
            let fingerprint = (cpu_ticks, p.stat.num_threads);
            st.faults = FaultCounters {
                entries: 0,
                minflt: p.stat.minflt,
                majflt: p.stat.majflt,
            };
            let due = st.threads_read == 0
                || fingerprint != st.fingerprint
                || generation - st.threads_read >= st.backoff;
            if due {
                self.read_process(pid, &mut st, fingerprint);
            } else {
                self.stats.deferred_processes += 1;
            }
            rows.push(st.row(pid, false));
            self.processes.insert(pid, st);
        }
        // Gone since the last scan (a pid whose stat could not be read is
        // still alive: kept, without a row this time).
        let unreadable = &sample.unreadable_pids;
        let gone: Vec<u32> = self
            .processes
            .iter()
            .filter(|(pid, st)| st.seen != generation && !unreadable.contains(&(**pid as i32)))
            .map(|(pid, _)| *pid)
            .collect();
        for pid in gone {
            if let Some(st) = self.processes.remove(&pid) {
                rows.push(st.row(pid, true));
            }
        }
        rows
    }

    /// Reads the threads of a process that is due: those whose own backoff
    /// is up, or all of them when its last full read is [`MAX_BACKOFF_SCANS`]
    /// old, its thread set changed, or its stat shows more CPU than the
    /// threads just read explain (a deferred thread is running).
    fn read_process(&mut self, pid: u32, st: &mut ProcessState, fingerprint: (u64, u64)) {
        let generation = self.generation;
        let failures = self.stats.read_failures;
        // One thread: whatever moved the process's stat was it.
        let full = st.full_read == 0
            || generation - st.full_read >= MAX_BACKOFF_SCANS
            || st.threads.len() <= 1;
        let first = self.read_threads(pid, st, full);
        let mut read = first;
        if !read.all {
            // stat's utime and stime are each truncated to ticks, so a
            // delta within two ticks of the threads read may be rounding.
            let tick_ns = 1_000_000_000 / self.hz;
            let stat_ns = fingerprint.0.saturating_sub(st.fingerprint.0) * tick_ns;
            if stat_ns > read.fresh_oncpu_ns + 2 * tick_ns {
                self.stats.escalated_reads += 1;
                read = self.read_threads(pid, st, true);
                read.moved |= first.moved;
            }
        }
        st.backoff = if read.moved {
            1
        } else {
            (st.backoff * 2).min(MAX_BACKOFF_SCANS)
        };
        st.fingerprint = fingerprint;
        st.threads_read = generation;
        // Only when every thread was read afresh (after the stat) do the
        // threads bound what the dead ones did; a stale one would be
        // counted twice.
        if read.all && self.stats.read_failures == failures {
            st.full_read = generation;
            self.reconcile(st, fingerprint.0);
        }
    }

    /// Adds what the process's stat shows beyond its threads' counters
    /// (threads that ended unseen), at tick precision.
    fn reconcile(&mut self, st: &mut ProcessState, cpu_ticks: u64) {
        // utime+stime are rtime (sum_exec_runtime of the group, dead
        // threads included) split and each truncated to USER_HZ ticks by
        // cputime_adjust / nsec_to_clock_t: a lower bound of it.
        let stat_ns = cpu_ticks.saturating_mul(1_000_000_000 / self.hz);
        let known = st.thread_totals().oncpu_ns + st.tick_extra_ns;
        if stat_ns > known {
            st.tick_extra_ns += stat_ns - known;
            self.stats.tick_precision_ns += stat_ns - known;
        }
    }

    fn set_path(&mut self, parts: std::fmt::Arguments<'_>) -> &Path {
        self.path.set(parts)
    }

    /// Reads `self.path` into `self.buf`: Ok(false) when the task is gone.
    fn read_current(&mut self) -> Result<bool, ()> {
        match read_task_file(self.path.get(), &mut self.buf) {
            ReadOutcome::Ok => Ok(true),
            ReadOutcome::Vanished => Ok(false),
            ReadOutcome::Failed => {
                self.stats.read_failures += 1;
                Err(())
            }
        }
    }
}

/// The room: the source and its per-window deltas.
pub struct Schedstat {
    pub reader: SchedProcfs,
    deltas: crate::sources::ebpf::CounterDeltas,
}

impl Schedstat {
    pub fn new(reader: SchedProcfs) -> Self {
        Self {
            reader,
            deltas: Default::default(),
        }
    }
}

impl Source for Schedstat {
    /// The CTS tier: per-task counters from this scan's schedstat, at the
    /// scan's time.
    fn sample(&mut self, tick: &mut Tick) {
        tick.rows = self.reader.update(&tick.sample);
        tick.rows_boottime_ns = tick
            .sample
            .clock
            .map_or(tick.rows_boottime_ns, |c| c.boottime_ns);
        self.deltas.update(tick, tick.rows_boottime_ns);
    }

    fn columns(&self, tick: &Tick, task: &TaskWindow, row: &mut TopRow) {
        crate::sources::ebpf::top_columns(tick, task, row);
    }

    /// What the source did and could not see, for `vitalsd record`'s summary.
    fn summary(&self) -> Option<String> {
        let c: Vec<String> = self
            .reader
            .stats
            .counters()
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        Some(format!("schedstat source: {}", c.join(" ")))
    }

    /// `sched_procfs`: what the source did and could not see.
    fn status(
        &self,
        out: &mut std::collections::BTreeMap<&'static str, std::collections::BTreeMap<String, u64>>,
    ) {
        out.insert("sched_procfs", self.reader.stats.counters());
    }
}
