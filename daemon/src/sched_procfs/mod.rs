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
//! count first. Counters are cumulative, so a deferred read loses nothing:
//! a quiet process's sub-tick work shows up to that many scans late.
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

use std::{
    collections::HashMap,
    ffi::OsStr,
    io::Write,
    os::unix::ffi::OsStrExt,
    path::{Path, PathBuf},
};

use vitals_common::FaultCounters;

use crate::{
    accounting::{CounterOrigin, ProcessCounters, Tier},
    procfs::{
        is_vanished, parse_ctxt_switches, read_into,
        sampler::{list_numeric, Sample},
        schedstat::{self, parse_schedstat, SchedstatMissing},
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

/// Where faults come from without eBPF, as status says after "faults from".
pub const PROC_FAULT_SOURCE: &str = "/proc/<pid>/stat minflt + majflt (successful faults, no eBPF)";

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

/// The tier a daemon or recording runs in, from where its counters come.
pub fn tier_of(origin: Option<CounterOrigin>) -> Tier {
    match origin {
        Some(CounterOrigin::Ebpf { .. }) => Tier::Ebpf,
        Some(CounterOrigin::Schedstat) => Tier::Cts,
        None => Tier::Ticks,
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
        }
    }
}

/// The source: its reader state and what it has folded so far.
pub struct SchedProcfs {
    root: PathBuf,
    hz: u64,
    buf: Vec<u8>,
    path: Vec<u8>,
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
            root: proc_root.to_owned(),
            hz: hz.max(1),
            buf: Vec::with_capacity(1024),
            path: Vec::with_capacity(128),
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
                let failures = self.stats.read_failures;
                let before = st.thread_totals();
                let threads_before = st.threads.len();
                self.read_threads(pid, &mut st);
                let moved = st.thread_totals() != before || st.threads.len() != threads_before;
                st.backoff = if moved {
                    1
                } else {
                    (st.backoff * 2).min(MAX_BACKOFF_SCANS)
                };
                st.fingerprint = fingerprint;
                st.threads_read = generation;
                // Only threads read afresh (after the stat) bound what
                // the dead ones did; a stale one would be counted twice.
                if self.stats.read_failures == failures {
                    self.reconcile(&mut st, cpu_ticks);
                }
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
        self.path.clear();
        self.path
            .extend_from_slice(self.root.as_os_str().as_bytes());
        // Writing into a Vec<u8> cannot fail.
        let _ = self.path.write_fmt(parts);
        Path::new(OsStr::from_bytes(&self.path))
    }

    /// Reads `self.path` into `self.buf`: Ok(false) when the task is gone.
    fn read_current(&mut self) -> Result<bool, ()> {
        match read_into(Path::new(OsStr::from_bytes(&self.path)), &mut self.buf) {
            Ok(()) => Ok(true),
            Err(e) if is_vanished(&e) => Ok(false),
            Err(e) => {
                log::debug!(
                    "reading {}: {e}",
                    Path::new(OsStr::from_bytes(&self.path)).display()
                );
                self.stats.read_failures += 1;
                Err(())
            }
        }
    }

    /// Reads every thread of `pid`; threads no longer listed are folded
    /// into the process's exited counters.
    fn read_threads(&mut self, pid: u32, st: &mut ProcessState) {
        let generation = self.generation;
        let mut tids = std::mem::take(&mut self.tids);
        let task_dir = self.set_path(format_args!("/{pid}/task")).to_owned();
        match list_numeric(&task_dir, &mut self.dirent_buf, &mut tids) {
            Ok(()) => {}
            Err(e) => {
                if !is_vanished(&e) {
                    log::debug!("listing {}: {e}", task_dir.display());
                }
                // Unreadable, or gone (then no reconciling either: the
                // process's stat was read before it went).
                self.stats.read_failures += u64::from(!is_vanished(&e));
                self.tids = tids;
                return;
            }
        }
        for &tid in &tids {
            self.read_thread(pid, tid, st);
        }
        self.tids = tids;
        let before = st.threads.len();
        let exited = &mut st.exited;
        st.threads.retain(|_, th| {
            let keep = th.seen == generation;
            if !keep {
                exited.add(&th.last);
            }
            keep
        });
        let left = (before - st.threads.len()) as u32;
        st.exited_threads += left;
        self.stats.exited_threads += u64::from(left);
    }

    fn read_thread(&mut self, pid: u32, tid: u32, st: &mut ProcessState) {
        let generation = self.generation;
        self.set_path(format_args!("/{pid}/task/{tid}/schedstat"));
        self.stats.schedstat_reads += 1;
        let s = match self.read_current() {
            Ok(true) => match parse_schedstat(&self.buf) {
                Ok(s) => s,
                Err(e) => {
                    log::debug!("parsing /{pid}/task/{tid}/schedstat: {e}");
                    self.stats.read_failures += 1;
                    return self.keep_unread(st, tid);
                }
            },
            // Exited after the listing: folded as gone below.
            Ok(false) => return,
            Err(()) => return self.keep_unread(st, tid),
        };
        let prev = st.threads.get(&tid).map(|th| (th.last, th.quiescent));
        let prev = match prev {
            Some((last, _))
                if s.sum_exec_runtime_ns < last.oncpu_ns || s.timeslices < last.timeslices =>
            {
                // The same (pid, tid) with smaller counters: a new thread.
                st.exited.add(&last);
                st.exited_threads += 1;
                self.stats.tid_reuse += 1;
                st.threads.remove(&tid);
                None
            }
            other => other,
        };
        let mut next = ThreadCounters {
            oncpu_ns: s.sum_exec_runtime_ns,
            runq_wait_ns: s.run_delay_ns,
            timeslices: s.timeslices,
            ..prev.map(|(last, _)| last).unwrap_or_default()
        };
        let mut quiescent = prev.is_some_and(|(_, q)| q);
        let switched = prev.is_none_or(|(last, q)| !q || last.timeslices != s.timeslices);
        if switched {
            self.set_path(format_args!("/{pid}/task/{tid}/status"));
            self.stats.status_reads += 1;
            match self.read_current() {
                Ok(true) => match parse_ctxt_switches(&self.buf) {
                    Ok(c) => {
                        next.voluntary_switches = c.voluntary.max(next.voluntary_switches);
                        next.involuntary_switches = c.involuntary.max(next.involuntary_switches);
                        quiescent = next.quiescent();
                    }
                    Err(e) => {
                        log::debug!("parsing /{pid}/task/{tid}/status: {e}");
                        self.stats.read_failures += 1;
                        quiescent = false;
                    }
                },
                // Exited between the two reads: its schedstat stands.
                Ok(false) | Err(()) => quiescent = false,
            }
        }
        st.threads.insert(
            tid,
            ThreadState {
                last: next,
                quiescent,
                seen: generation,
            },
        );
    }

    /// A thread that exists but could not be read this time: keep its
    /// last counters (it is alive, not gone).
    fn keep_unread(&mut self, st: &mut ProcessState, tid: u32) {
        if let Some(th) = st.threads.get_mut(&tid) {
            th.seen = self.generation;
            th.quiescent = false;
        }
    }
}
