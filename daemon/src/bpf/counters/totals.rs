//! Per-thread and per-process cumulative counters from successive
//! `BpfSnapshot`s, with freed threads folded into their process so nothing
//! they did is lost.
//!
//! On-CPU time is reported as a monotone lower bound: attributed time plus
//! the in-flight part of a task that is running right now (a spinner that
//! never switches out would otherwise show nothing). Both parts are lower
//! bounds of the kernel's truth, so taking the maximum with the previous
//! value keeps the series monotone without ever overstating it.
//!
//! A thread is (tid, `born_ns`): the kernel stamps each TASKS value when it
//! inserts it and deletes the key when the task is freed, so a reused tid
//! comes back with a new stamp. The free record (EXITED) can be lost when
//! that map is full (counted as `exited_map_full`); a thread then simply
//! leaves TASKS. It is given one more read for its record (it may have been
//! freed between the EXITED drain and the TASKS walk), then folded into its
//! process from its last counters and counted in `lost_exits`. Counters are
//! never carried from one instance of a tid or tgid to the next.

use std::collections::{HashMap, HashSet};

use vitals_common::{FaultCounters, OffcpuCounters, TaskCounters, TaskRecord};

use super::{super::FaultSource, BpfSnapshot};

pub use crate::accounting::ProcessCounters;

#[derive(Debug, Default)]
struct ProcessAccum {
    /// Sum of final counters of this process's freed threads.
    exited: TaskCounters,
    exited_threads: u32,
}

/// A thread that left TASKS without its free record (yet).
#[derive(Debug, Clone, Copy)]
struct Pending {
    tid: u32,
    last: TaskCounters,
    /// The update that saw it gone; its record may come one update later.
    since: u64,
    /// Its process's fault counters as last read, kept for a leader: the
    /// kernel deletes PROCESS_FAULTS[tgid] when the leader is freed, even
    /// when its record is lost.
    process_faults: Option<FaultCounters>,
}

/// A process whose leader was freed: (tgid, its final fault counters,
/// the leader's comm), each when known.
type Ending = (u32, Option<FaultCounters>, Option<[u8; 16]>);

/// Folds snapshots into per-thread and per-process totals.
#[derive(Debug, Default)]
pub struct Totals {
    /// tid -> last reported (monotone) counters of the live instance.
    threads: HashMap<u32, TaskCounters>,
    pending: Vec<Pending>,
    processes: HashMap<u32, ProcessAccum>,
    /// tgid -> PROCESS_FAULTS as last read.
    process_faults: HashMap<u32, FaultCounters>,
    updates: u64,
    /// Idle (tid 0) on-CPU time summed over CPUs.
    pub idle_ns: u64,
    pub drops: [u64; vitals_common::drop_reason::COUNT as usize],
    /// Threads seen alive whose free record never came (EXITED was full):
    /// folded into their process from their last counters.
    pub lost_exits: u64,
}

/// The kernel's `record` of a thread instance last reported as `prev`
/// (default: not reported yet): its u32 counts widened from `prev`'s
/// (`TaskRecord::widen_after`: exact while a count moves less than 2^32
/// between two reads), its times no lower than `prev`'s (the in-flight
/// part added to `prev` may exceed what was attributed since).
fn max_fields(prev: &TaskCounters, record: &TaskRecord) -> TaskCounters {
    let new = record.widen_after(prev);
    TaskCounters {
        oncpu_ns: prev.oncpu_ns.max(new.oncpu_ns),
        runq_wait_ns: prev.runq_wait_ns.max(new.runq_wait_ns),
        tgid: if new.tgid != 0 { new.tgid } else { prev.tgid },
        offcpu: OffcpuCounters {
            blocked_s_ns: prev.offcpu.blocked_s_ns.max(new.offcpu.blocked_s_ns),
            blocked_d_ns: prev.offcpu.blocked_d_ns.max(new.offcpu.blocked_d_ns),
            ..new.offcpu
        },
        ..new
    }
}

fn max_faults(a: &FaultCounters, b: &FaultCounters) -> FaultCounters {
    FaultCounters {
        entries: a.entries.max(b.entries),
        minflt: a.minflt.max(b.minflt),
        majflt: a.majflt.max(b.majflt),
    }
}

fn tgid_of(tid: u32, c: &TaskCounters) -> u32 {
    if c.tgid != 0 {
        c.tgid
    } else {
        tid
    }
}

impl Totals {
    pub fn new() -> Self {
        Self::default()
    }

    /// Folds one snapshot in and returns every process's cumulative counters,
    /// including processes that ended in this snapshot (marked `ended`, and
    /// forgotten afterwards so a reused tgid starts fresh). Ended rows come
    /// before a live row of the same tgid.
    pub fn update(&mut self, snap: &BpfSnapshot) -> Vec<ProcessCounters> {
        self.updates += 1;
        self.drops = snap.drops;
        let mut ending: Vec<Ending> = Vec::new();

        // Freed threads, in kernel free order.
        let mut exited = snap.exited.clone();
        exited.sort_by_key(|(k, _)| k.freed_ns);
        for (key, rec) in &exited {
            let prev = self.take_instance(key.tid, rec.counters.born_ns);
            let last = max_fields(&prev.unwrap_or_default(), &rec.counters);
            let tgid = tgid_of(key.tid, &last);
            self.fold(tgid, &last);
            if key.tid == tgid {
                let comm = (!rec.comm_bytes().is_empty()).then_some(rec.comm);
                ending.push((tgid, Some(rec.process_faults), comm));
            }
        }

        // Threads gone since an earlier update whose record did not come:
        // other threads before leaders, so a leader's row holds them.
        let now = self.updates;
        let (mut lost, keep): (Vec<Pending>, Vec<Pending>) =
            self.pending.drain(..).partition(|p| p.since < now);
        self.pending = keep;
        lost.sort_by_key(|p| p.tid == tgid_of(p.tid, &p.last));
        for p in lost {
            self.lost_exits += 1;
            let tgid = tgid_of(p.tid, &p.last);
            self.fold(tgid, &p.last);
            if p.tid == tgid {
                ending.push((tgid, p.process_faults, None));
            }
        }

        let mut out = self.end_all(ending, snap);
        self.fold_live(snap);
        let idle_inflight = snap.inflight_ns.get(&0).copied().unwrap_or(0);
        self.idle_ns = self.idle_ns.max(snap.idle_ns + idle_inflight);

        let gone = self.gone_processes(snap);
        out.extend(self.end_all(gone, snap));
        out.extend(self.live_rows(snap));
        self.process_faults = snap.process_faults.clone();
        out.sort_by_key(|r| (r.tgid, !r.ended));
        out
    }

    /// The counters of thread `tid` instance `born_ns`, taken out of the
    /// live or pending threads. `born_ns` 0: the task had no TASKS value
    /// (a leader that only faulted, or found TASKS full), so none is its.
    fn take_instance(&mut self, tid: u32, born_ns: u64) -> Option<TaskCounters> {
        if born_ns == 0 {
            return None;
        }
        if self.threads.get(&tid).is_some_and(|t| t.born_ns == born_ns) {
            return self.threads.remove(&tid);
        }
        let i = self
            .pending
            .iter()
            .position(|p| p.tid == tid && p.last.born_ns == born_ns)?;
        Some(self.pending.swap_remove(i).last)
    }

    /// Adds a freed thread's final counters to its process.
    fn fold(&mut self, tgid: u32, last: &TaskCounters) {
        let acc = self.processes.entry(tgid).or_default();
        acc.exited.add(last);
        acc.exited_threads += 1;
    }

    /// Live TASKS values: merged with the same instance, a new instance
    /// under a known tid parks the old one (its record may still come),
    /// and threads gone from TASKS are parked too.
    fn fold_live(&mut self, snap: &BpfSnapshot) {
        let now = self.updates;
        for (&tid, counters) in &snap.tasks {
            if tid == 0 {
                continue;
            }
            let mut c = *counters;
            c.oncpu_ns += snap.inflight_ns.get(&tid).copied().unwrap_or(0);
            c.runq_wait_ns += snap.inflight_wait_ns.get(&tid).copied().unwrap_or(0);
            let merged = match self.threads.get(&tid) {
                Some(prev) if prev.born_ns == c.born_ns => max_fields(prev, &c),
                Some(prev) => {
                    let old = *prev;
                    self.park(tid, old, now);
                    c.widen()
                }
                None => c.widen(),
            };
            self.threads.insert(tid, merged);
        }
        let gone: Vec<u32> = self
            .threads
            .keys()
            .copied()
            .filter(|tid| !snap.tasks.contains_key(tid))
            .collect();
        for tid in gone {
            let old = self.threads.remove(&tid).unwrap();
            self.park(tid, old, now);
        }
    }

    fn park(&mut self, tid: u32, last: TaskCounters, since: u64) {
        let tgid = tgid_of(tid, &last);
        let process_faults = (tid == tgid)
            .then(|| self.process_faults.get(&tgid).copied())
            .flatten();
        self.pending.push(Pending {
            tid,
            last,
            since,
            process_faults,
        });
    }

    /// The final rows of processes whose leader was just freed (or lost),
    /// and forgets them. Their threads gone from TASKS without a record
    /// (the kernel frees the leader after its other threads, so these
    /// records were lost) are folded in and counted lost; threads of the
    /// tgid still in TASKS under the same instance are a new process's.
    fn end_all(&mut self, ending: Vec<Ending>, snap: &BpfSnapshot) -> Vec<ProcessCounters> {
        if ending.is_empty() {
            return Vec::new();
        }
        let tgids: HashSet<u32> = ending.iter().map(|e| e.0).collect();
        let gone: Vec<u32> = self
            .threads
            .iter()
            .filter(|(tid, t)| {
                tgids.contains(&tgid_of(**tid, t))
                    && snap.tasks.get(tid).is_none_or(|s| s.born_ns != t.born_ns)
            })
            .map(|(&tid, _)| tid)
            .collect();
        let mut orphans: Vec<(u32, TaskCounters)> = gone
            .into_iter()
            .filter_map(|tid| Some((tid, self.threads.remove(&tid)?)))
            .collect();
        let (mine, keep): (Vec<Pending>, Vec<Pending>) = self
            .pending
            .drain(..)
            .partition(|p| tgids.contains(&tgid_of(p.tid, &p.last)));
        self.pending = keep;
        orphans.extend(mine.iter().map(|p| (p.tid, p.last)));
        for (tid, t) in &orphans {
            self.lost_exits += 1;
            self.fold(tgid_of(*tid, t), t);
        }
        let mut rows: Vec<ProcessCounters> = Vec::new();
        for (tgid, final_faults, comm) in ending {
            if let Some(r) = rows.iter_mut().find(|r| r.tgid == tgid) {
                // Two instances ended in one update: one row, both counted.
                r.exit_comm = r.exit_comm.or(comm);
                continue;
            }
            let acc = self.processes.remove(&tgid).unwrap_or_default();
            let mut row = ProcessCounters {
                tgid,
                exited_threads: acc.exited_threads,
                ended: true,
                exit_comm: comm,
                ..Default::default()
            };
            add_task(&mut row, &acc.exited);
            let last_read = self.process_faults.remove(&tgid);
            for f in final_faults.iter().chain(last_read.iter()) {
                row.faults = max_faults(&row.faults, f);
            }
            rows.push(row);
        }
        rows
    }

    /// Rows of the processes with live threads or folded ones. A thread
    /// parked in `pending` still counts for its process, unless the tgid's
    /// leader tid now belongs to a new task (a reuse: the parked ones are
    /// the old process's, for its final row).
    fn live_rows(&self, snap: &BpfSnapshot) -> Vec<ProcessCounters> {
        let mut rows: HashMap<u32, ProcessCounters> = HashMap::new();
        fn row(rows: &mut HashMap<u32, ProcessCounters>, tgid: u32) -> &mut ProcessCounters {
            rows.entry(tgid).or_insert_with(|| ProcessCounters {
                tgid,
                ..Default::default()
            })
        }
        for (&tid, t) in &self.threads {
            let r = row(&mut rows, tgid_of(tid, t));
            add_task(r, t);
            if tid == r.tgid {
                r.main_thread_long_blocks = t.offcpu.long_blocks;
            }
            r.live_threads += 1;
        }
        for (&tgid, acc) in &self.processes {
            let r = row(&mut rows, tgid);
            add_task(r, &acc.exited);
            r.exited_threads += acc.exited_threads;
        }
        let reused = |tgid: u32| {
            self.threads.contains_key(&tgid)
                && self
                    .pending
                    .iter()
                    .any(|p| p.tid == tgid && tgid_of(p.tid, &p.last) == tgid)
        };
        for p in &self.pending {
            let tgid = tgid_of(p.tid, &p.last);
            if !reused(tgid) {
                let r = row(&mut rows, tgid);
                add_task(r, &p.last);
                r.exited_threads += 1;
            }
        }
        // The per-tgid fault map also holds faults of threads that found
        // TASKS full, so it wins where it is larger.
        for r in rows.values_mut() {
            if let Some(f) = snap.process_faults.get(&r.tgid) {
                r.faults = max_faults(&r.faults, f);
            }
        }
        rows.into_values().collect()
    }

    /// Processes with nothing left in the kernel: no live or parked thread
    /// and no PROCESS_FAULTS value (deleted when the leader is freed). The
    /// leader had no TASKS value and its record was lost, or a thread's
    /// record came after its leader's.
    fn gone_processes(&self, snap: &BpfSnapshot) -> Vec<Ending> {
        let mut alive: HashSet<u32> = snap.process_faults.keys().copied().collect();
        alive.extend(self.threads.iter().map(|(&t, c)| tgid_of(t, c)));
        alive.extend(self.pending.iter().map(|p| tgid_of(p.tid, &p.last)));
        self.processes
            .keys()
            .filter(|t| !alive.contains(t))
            .map(|&t| (t, None, None))
            .collect()
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
    row.offcpu.add(&t.offcpu);
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

    /// A task whose TASKS value was inserted at `born` ns.
    fn born(born: u64, tgid: u32, oncpu: u64, vol: u32) -> TaskRecord {
        TaskRecord {
            oncpu_ns: oncpu,
            voluntary_switches: vol,
            tgid,
            born_ns: born,
            ..Default::default()
        }
    }

    /// The first instance of a tid (stamped with the tid itself).
    fn task(tgid: u32, oncpu: u64, vol: u32) -> TaskRecord {
        born(u64::from(tgid), tgid, oncpu, vol)
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

    /// A running task's wait before its switch-in counts at once, not only
    /// once it switches out.
    #[test]
    fn inflight_wait_counts_while_the_task_runs() {
        let mut t = Totals::new();
        let mut s = BpfSnapshot::default();
        s.tasks.insert(7, task(7, 1_000, 0));
        s.inflight_wait_ns.insert(7, 300);
        assert_eq!(t.update(&s)[0].runq_wait_ns, 300);
        // Switched out: the kernel side added it to TASKS; not counted twice.
        let mut s = BpfSnapshot::default();
        let mut c = task(7, 2_000, 0);
        c.runq_wait_ns = 300;
        s.tasks.insert(7, c);
        assert_eq!(t.update(&s)[0].runq_wait_ns, 300);
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

    fn faults(minflt: u64) -> FaultCounters {
        FaultCounters {
            minflt,
            ..Default::default()
        }
    }

    fn row(rows: &[ProcessCounters], tgid: u32, ended: bool) -> ProcessCounters {
        *rows
            .iter()
            .find(|r| r.tgid == tgid && r.ended == ended)
            .unwrap_or_else(|| panic!("no row tgid {tgid} ended {ended}: {rows:?}"))
    }

    #[test]
    fn thread_gone_without_record_is_folded_once_then_process_ends() {
        let mut t = Totals::new();
        let mut s = BpfSnapshot::default();
        s.tasks.insert(100, task(100, 1_000, 1));
        s.tasks.insert(101, task(100, 2_000, 2));
        t.update(&s);
        // 101 left TASKS and EXITED was full: still counted for its
        // process while its record may come, then folded and counted lost.
        s.tasks.remove(&101);
        for _ in 0..3 {
            let rows = t.update(&s);
            assert_eq!(rows.len(), 1);
            assert_eq!(rows[0].oncpu_ns, 3_000);
            assert_eq!(rows[0].live_threads, 1);
        }
        assert_eq!(t.lost_exits, 1);
        // The leader goes the same way: one final row, then nothing kept.
        s.tasks.clear();
        assert_eq!(t.update(&s)[0].oncpu_ns, 3_000, "parked, not ended yet");
        let rows = t.update(&s);
        assert_eq!(rows.len(), 1);
        assert!(rows[0].ended);
        assert_eq!((rows[0].oncpu_ns, rows[0].exited_threads), (3_000, 2));
        assert_eq!(t.lost_exits, 2);
        assert!(t.update(&s).is_empty());
        assert!(t.threads.is_empty() && t.pending.is_empty() && t.processes.is_empty());
    }

    #[test]
    fn reused_tid_never_inherits_the_lost_threads_counters() {
        let mut t = Totals::new();
        let mut s = BpfSnapshot::default();
        s.tasks.insert(200, task(200, 5_000, 5));
        s.tasks.insert(201, task(200, 7_000, 7));
        s.process_faults.insert(200, faults(500));
        t.update(&s);
        // Both freed, records lost; tid 201 is now a thread of process
        // 300 and tid 200 a new process, each with a new stamp.
        let mut s = BpfSnapshot::default();
        s.tasks.insert(300, task(300, 50, 1));
        s.tasks.insert(201, born(9_000, 300, 10, 1));
        s.tasks.insert(200, born(9_001, 200, 20, 1));
        s.process_faults.insert(200, faults(3));
        let rows = t.update(&s);
        assert_eq!(row(&rows, 300, false).oncpu_ns, 60);
        assert_eq!(row(&rows, 200, false).oncpu_ns, 20);
        assert_eq!(row(&rows, 200, false).faults.minflt, 3);
        // Next update: no record came; the old process ends with what it
        // had, in a row of its own before the new process's.
        let rows = t.update(&s);
        let old = row(&rows, 200, true);
        assert_eq!((old.oncpu_ns, old.faults.minflt), (12_000, 500));
        let pos = |ended| rows.iter().position(|r| r.tgid == 200 && r.ended == ended);
        assert!(pos(true) < pos(false));
        assert_eq!(row(&rows, 200, false).oncpu_ns, 20);
        assert_eq!(row(&rows, 200, false).faults.minflt, 3);
        assert_eq!(row(&rows, 300, false).oncpu_ns, 60);
        assert_eq!(t.lost_exits, 2);
    }

    #[test]
    fn record_one_read_late_is_not_lost_nor_counted_twice() {
        let mut t = Totals::new();
        let mut s = BpfSnapshot::default();
        s.tasks.insert(100, task(100, 1_000, 1));
        s.tasks.insert(101, task(100, 2_000, 2));
        t.update(&s);
        // Freed between the EXITED drain and the TASKS walk.
        s.tasks.remove(&101);
        assert_eq!(t.update(&s)[0].oncpu_ns, 3_000);
        s.exited.push((
            ExitKey {
                freed_ns: 50,
                tid: 101,
                _pad: 0,
            },
            ExitedTask {
                counters: task(100, 2_100, 2),
                ..Default::default()
            },
        ));
        let rows = t.update(&s);
        assert_eq!((rows[0].oncpu_ns, rows[0].exited_threads), (3_100, 1));
        s.exited.clear();
        assert_eq!(t.update(&s)[0].oncpu_ns, 3_100);
        assert_eq!(t.lost_exits, 0);
    }

    #[test]
    fn leader_without_tasks_value_ends_when_its_fault_value_goes() {
        let mut t = Totals::new();
        let mut s = BpfSnapshot::default();
        s.tasks.insert(401, task(400, 1_000, 1));
        s.process_faults.insert(400, faults(70));
        s.exited.push((
            ExitKey {
                freed_ns: 1,
                tid: 401,
                _pad: 0,
            },
            ExitedTask {
                counters: task(400, 1_000, 1),
                ..Default::default()
            },
        ));
        s.tasks.clear();
        let rows = t.update(&s);
        assert_eq!((rows[0].oncpu_ns, rows[0].faults.minflt), (1_000, 70));
        assert!(!rows[0].ended);
        // The leader's record was lost; the kernel deleted its fault value.
        let rows = t.update(&BpfSnapshot::default());
        assert_eq!(rows.len(), 1);
        assert!(rows[0].ended);
        assert_eq!((rows[0].oncpu_ns, rows[0].faults.minflt), (1_000, 70));
        assert!(t.update(&BpfSnapshot::default()).is_empty());
    }
}
