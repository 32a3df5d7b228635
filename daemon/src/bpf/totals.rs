//! Per-thread and per-process cumulative counters from successive
//! `BpfSnapshot`s, with freed threads folded into their process so nothing
//! they did is lost.
//!
//! On-CPU time is reported as a monotone lower bound: attributed time plus
//! the in-flight part of a task that is running right now (a spinner that
//! never switches out would otherwise show nothing). Both parts are lower
//! bounds of the kernel's truth, so taking the maximum with the previous
//! value keeps the series monotone without ever overstating it.

use std::collections::HashMap;

use vitals_common::{FaultCounters, TaskCounters};

use super::{BpfSnapshot, FaultSource};

/// Cumulative counters of one process since accounting started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcessCounters {
    pub tgid: u32,
    pub oncpu_ns: u64,
    pub runq_wait_ns: u64,
    pub voluntary_switches: u64,
    pub involuntary_switches: u64,
    pub faults: FaultCounters,
    pub live_threads: u32,
    pub exited_threads: u32,
    /// The thread-group leader was freed: this is the process's final row.
    pub ended: bool,
    /// Ended rows: the leader's comm as sched_process_free recorded it
    /// (None when the record had none), which names a process no procfs
    /// scan saw alive.
    pub exit_comm: Option<[u8; 16]>,
}

#[derive(Debug, Default)]
struct ProcessAccum {
    /// Sum of final counters of this process's freed threads.
    exited: TaskCounters,
    exited_threads: u32,
    /// Final whole-process fault counters from the leader's free record.
    final_faults: Option<FaultCounters>,
    /// The leader's comm from its free record.
    comm: Option<[u8; 16]>,
}

/// Folds snapshots into per-thread and per-process totals.
#[derive(Debug, Default)]
pub struct Totals {
    /// tid -> last reported (monotone) counters.
    threads: HashMap<u32, TaskCounters>,
    processes: HashMap<u32, ProcessAccum>,
    /// Idle (tid 0) on-CPU time summed over CPUs.
    pub idle_ns: u64,
    pub drops: [u64; vitals_common::drop_reason::COUNT as usize],
}

fn max_fields(prev: &TaskCounters, new: &TaskCounters) -> TaskCounters {
    TaskCounters {
        oncpu_ns: prev.oncpu_ns.max(new.oncpu_ns),
        runq_wait_ns: prev.runq_wait_ns.max(new.runq_wait_ns),
        voluntary_switches: prev.voluntary_switches.max(new.voluntary_switches),
        involuntary_switches: prev.involuntary_switches.max(new.involuntary_switches),
        faults: FaultCounters {
            entries: prev.faults.entries.max(new.faults.entries),
            minflt: prev.faults.minflt.max(new.faults.minflt),
            majflt: prev.faults.majflt.max(new.faults.majflt),
        },
        tgid: if new.tgid != 0 { new.tgid } else { prev.tgid },
        _pad: 0,
    }
}

impl Totals {
    pub fn new() -> Self {
        Self::default()
    }

    /// Folds one snapshot in and returns every process's cumulative counters,
    /// including processes whose leader was freed in this snapshot (marked
    /// `ended`, and forgotten afterwards so a reused tgid starts fresh).
    pub fn update(&mut self, snap: &BpfSnapshot) -> Vec<ProcessCounters> {
        self.drops = snap.drops;
        let mut ended_now = Vec::new();

        // Freed threads, in kernel free order.
        let mut exited = snap.exited.clone();
        exited.sort_by_key(|(k, _)| k.freed_ns);
        for (key, rec) in &exited {
            let prev = self.threads.remove(&key.tid).unwrap_or_default();
            let last = max_fields(&prev, &rec.counters);
            let tgid = if last.tgid != 0 { last.tgid } else { key.tid };
            let acc = self.processes.entry(tgid).or_default();
            acc.exited.add(&last);
            acc.exited_threads += 1;
            if key.tid == tgid {
                acc.final_faults = Some(rec.process_faults);
                acc.comm = (!rec.comm_bytes().is_empty()).then_some(rec.comm);
                ended_now.push(tgid);
            }
        }

        for (&tid, counters) in &snap.tasks {
            if tid == 0 {
                continue;
            }
            let mut c = *counters;
            c.oncpu_ns += snap.inflight_ns.get(&tid).copied().unwrap_or(0);
            let merged = match self.threads.get(&tid) {
                Some(prev) => max_fields(prev, &c),
                None => c,
            };
            self.threads.insert(tid, merged);
        }
        // A task that has run but never switched out has no TASKS entry yet.
        for (&tid, &ns) in &snap.inflight_ns {
            if tid != 0 && !snap.tasks.contains_key(&tid) {
                if let Some(t) = self.threads.get_mut(&tid) {
                    t.oncpu_ns = t.oncpu_ns.max(ns);
                }
            }
        }
        let idle_inflight = snap.inflight_ns.get(&0).copied().unwrap_or(0);
        self.idle_ns = self.idle_ns.max(snap.idle_ns + idle_inflight);

        let mut rows: HashMap<u32, ProcessCounters> = HashMap::new();
        for (&tid, t) in &self.threads {
            let tgid = if t.tgid != 0 { t.tgid } else { tid };
            let row = rows.entry(tgid).or_insert_with(|| ProcessCounters {
                tgid,
                ..Default::default()
            });
            add_task(row, t);
            row.live_threads += 1;
        }
        for (&tgid, acc) in &self.processes {
            let row = rows.entry(tgid).or_insert_with(|| ProcessCounters {
                tgid,
                ..Default::default()
            });
            add_task(row, &acc.exited);
            row.exited_threads = acc.exited_threads;
        }
        // The per-tgid fault map also holds faults of threads that found
        // TASKS full, so it wins where it is larger.
        for row in rows.values_mut() {
            let whole = self
                .processes
                .get(&row.tgid)
                .and_then(|a| a.final_faults)
                .or_else(|| snap.process_faults.get(&row.tgid).copied());
            if let Some(f) = whole {
                row.faults.entries = row.faults.entries.max(f.entries);
                row.faults.minflt = row.faults.minflt.max(f.minflt);
                row.faults.majflt = row.faults.majflt.max(f.majflt);
            }
        }
        for tgid in ended_now {
            if let Some(row) = rows.get_mut(&tgid) {
                row.ended = true;
                row.exit_comm = self.processes.get(&tgid).and_then(|a| a.comm);
            }
            self.processes.remove(&tgid);
            self.threads.retain(|_, t| t.tgid != tgid);
        }
        let mut out: Vec<ProcessCounters> = rows.into_values().collect();
        out.sort_by_key(|r| r.tgid);
        out
    }

    /// Current cumulative counters of one live thread.
    pub fn thread(&self, tid: u32) -> Option<&TaskCounters> {
        self.threads.get(&tid)
    }
}

fn add_task(row: &mut ProcessCounters, t: &TaskCounters) {
    row.oncpu_ns += t.oncpu_ns;
    row.runq_wait_ns += t.runq_wait_ns;
    row.voluntary_switches += t.voluntary_switches;
    row.involuntary_switches += t.involuntary_switches;
    row.faults.add(&t.faults);
}

impl ProcessCounters {
    pub fn faults(&self, source: FaultSource) -> u64 {
        source.faults(&self.faults)
    }

    /// `exit_comm` as text, up to its first NUL.
    pub fn exit_comm_str(&self) -> Option<String> {
        let c = self.exit_comm.as_ref()?;
        let end = c.iter().position(|&b| b == 0).unwrap_or(c.len());
        Some(String::from_utf8_lossy(&c[..end]).into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vitals_common::{ExitKey, ExitedTask};

    fn task(tgid: u32, oncpu: u64, vol: u64) -> TaskCounters {
        TaskCounters {
            oncpu_ns: oncpu,
            voluntary_switches: vol,
            tgid,
            ..Default::default()
        }
    }

    #[test]
    fn threads_sum_into_process_and_exits_are_kept() {
        let mut t = Totals::new();
        let mut s = BpfSnapshot::default();
        s.tasks.insert(100, task(100, 1_000, 1));
        s.tasks.insert(101, task(100, 2_000, 2));
        let rows = t.update(&s);
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].oncpu_ns, 3_000);
        assert_eq!(rows[0].live_threads, 2);

        // Thread 101 is freed with more time than last seen.
        let mut s = BpfSnapshot::default();
        s.tasks.insert(100, task(100, 1_500, 1));
        s.exited.push((
            ExitKey {
                freed_ns: 5,
                tid: 101,
                _pad: 0,
            },
            ExitedTask {
                counters: task(100, 2_500, 3),
                ..Default::default()
            },
        ));
        let rows = t.update(&s);
        assert_eq!(rows[0].oncpu_ns, 4_000);
        assert_eq!(rows[0].voluntary_switches, 4);
        assert_eq!(rows[0].exited_threads, 1);
        assert!(!rows[0].ended);

        // Leader freed: final row, then forgotten.
        let mut s = BpfSnapshot::default();
        s.exited.push((
            ExitKey {
                freed_ns: 9,
                tid: 100,
                _pad: 0,
            },
            ExitedTask {
                counters: task(100, 1_600, 1),
                comm: *b"dd\0\0\0\0\0\0\0\0\0\0\0\0\0\0",
                ..Default::default()
            },
        ));
        let rows = t.update(&s);
        assert_eq!(rows.len(), 1);
        assert!(rows[0].ended);
        assert_eq!(rows[0].exit_comm_str().as_deref(), Some("dd"));
        assert_eq!(rows[0].oncpu_ns, 4_100);
        assert!(
            t.update(&BpfSnapshot::default()).is_empty(),
            "reused tgid starts fresh"
        );
    }

    #[test]
    fn inflight_is_monotone_lower_bound() {
        let mut t = Totals::new();
        let mut s = BpfSnapshot::default();
        s.tasks.insert(7, task(7, 1_000, 0));
        s.inflight_ns.insert(7, 500);
        assert_eq!(t.update(&s)[0].oncpu_ns, 1_500);
        // It switched out and back in since; attributed grew less than the
        // in-flight part we had added: keep the larger, earlier value.
        let mut s = BpfSnapshot::default();
        s.tasks.insert(7, task(7, 1_200, 0));
        assert_eq!(t.update(&s)[0].oncpu_ns, 1_500);
        let mut s = BpfSnapshot::default();
        s.tasks.insert(7, task(7, 2_000, 0));
        assert_eq!(t.update(&s)[0].oncpu_ns, 2_000);
    }

    #[test]
    fn idle_is_not_a_process() {
        let mut t = Totals::new();
        let mut s = BpfSnapshot {
            idle_ns: 9_000,
            ..Default::default()
        };
        s.inflight_ns.insert(0, 1_000);
        assert!(t.update(&s).is_empty());
        assert_eq!(t.idle_ns, 10_000);
    }
}
