//! The counters: reading the accounting maps and folding what was read.
//! `Accounting::read` takes a `BpfSnapshot`
//! (drains EXITED; reads the mmap-read arrays TASKS_BY_TID,
//! FAULTS_BY_TGID, CPU_STATE and DROPS, `mapped_read`, and WAKERS,
//! `wakers`; walks the fallback
//! hashes TASKS and PROCESS_FAULTS of ids past those arrays), the hashes
//! batched where the kernel has BPF_MAP_LOOKUP_BATCH and they hold many
//! entries, iterated otherwise (`MapRead`); `batch` is
//! BPF_MAP_LOOKUP_BATCH, `totals` folds successive snapshots into
//! cumulative counters per process.

pub mod batch;
mod free_stale;
mod mapped_read;
pub mod totals;
mod wakers;

use std::{collections::HashMap, os::fd::AsFd};

use aya::maps::{HashMap as AyaHashMap, MapData, MapError};
use vitals_common::{
    drop_reason, names, CpuState, ExitKey, ExitedTask, FaultCounters, TaskRecord, WakerCounters,
    WakerKey,
};

use super::{
    map_err,
    object::{
        feature_table::{log_missing, Feature},
        MapRead,
    },
    Accounting, BpfError,
};

/// Everything read from the maps at one instant.
#[derive(Debug, Clone, Default)]
pub struct BpfSnapshot {
    /// CLOCK_MONOTONIC (bpf_ktime_get_ns's clock) when CPU_STATE was read.
    pub monotonic_ns: u64,
    /// Live tasks (never tid 0: see `idle_ns`). `oncpu_ns` here is only
    /// what was attributed at switch-outs; see `inflight_ns`.
    pub tasks: HashMap<u32, TaskRecord>,
    /// The idle tasks' attributed time, summed over CPUs; the in-flight
    /// part is `inflight_ns[0]`.
    pub idle_ns: u64,
    /// On-CPU time of tasks running right now since their last switch-in,
    /// not yet attributed by the kernel side. Read after `tasks`, so
    /// `tasks[t].oncpu_ns + inflight_ns[t]` never exceeds the truth.
    pub inflight_ns: HashMap<u32, u64>,
    /// Runqueue wait that ended at the switch-in of each task running now
    /// (CPU_STATE's `pending_wait_ns`), which the kernel side adds to
    /// `runq_wait_ns` only at its switch-out: like `inflight_ns`, known
    /// already and not yet attributed.
    pub inflight_wait_ns: HashMap<u32, u64>,
    /// Freed tasks drained from EXITED by this read: final counters and
    /// the comm the kernel last had for each (`ExitedTask::comm_bytes`),
    /// which names tasks no procfs scan saw alive.
    pub exited: Vec<(ExitKey, ExitedTask)>,
    /// tgid -> fault counters of the whole process.
    pub process_faults: HashMap<u32, FaultCounters>,
    /// Cumulative drop counters, indexed by `drop_reason`.
    pub drops: [u64; drop_reason::COUNT as usize],
    /// (wakee process, waker process) -> cumulative wakeups and the
    /// blocked time they ended (empty while off-CPU accounting is off).
    pub wakers: HashMap<WakerKey, WakerCounters>,
}

impl Accounting {
    /// Reads every map. Tasks first, then CPU_STATE, so in-flight time is a
    /// lower bound (see `BpfSnapshot::inflight_ns`). Drains EXITED.
    pub fn read(&mut self) -> Result<BpfSnapshot, BpfError> {
        let mut snap = BpfSnapshot::default();

        self.map_arrays()?;
        self.map_wakers()?;
        // Freed tasks first: a task freed between this drain and the TASKS
        // walk below is then seen live now and exited next time, never lost.
        // The ring where the kernel has one; the EXITED hash (then empty
        // where the ring is used: one GET_NEXT_KEY) otherwise.
        self.drain_exited_ring(&mut snap.exited);
        {
            let map = self.map_mut(names::EXITED)?;
            let mut exited: AyaHashMap<&mut MapData, ExitKey, ExitedTask> =
                AyaHashMap::try_from(map).map_err(map_err(names::EXITED))?;
            let keys: Vec<ExitKey> = exited.keys().filter_map(Result::ok).collect();
            for key in keys {
                match exited.get(&key, 0) {
                    Ok(v) => snap.exited.push((key, v)),
                    Err(MapError::KeyNotFound) => continue,
                    Err(e) => {
                        return Err(BpfError::Map {
                            name: names::EXITED,
                            source: e,
                        })
                    }
                }
                // Drained records are final values, not live counters.
                let _ = exited.remove(&key);
            }
        }

        // A task that switches out while TASKS is read can have its ended
        // slice land in TASKS after its entry was read, and CPU_STATE no
        // longer shows it in flight: the slice would be in neither. So the
        // per-CPU switch stamps are read before and after, and the read is
        // taken again (a few times at most) when a switch came in between.
        let mut per_cpu = self.cpu_states();
        for attempt in 0..4 {
            snap.tasks = self.read_tasks()?;
            snap.process_faults = self.read_process_faults()?;
            let after = self.cpu_states();
            let settled = per_cpu
                .iter()
                .zip(&after)
                .all(|(b, a)| b.last_switch_ns == a.last_switch_ns);
            let walked_from = std::mem::replace(&mut per_cpu, after);
            if settled {
                break;
            }
            if attempt == 3 {
                per_cpu = self.reread_switched_out(&mut snap.tasks, walked_from, per_cpu);
            }
        }
        snap.monotonic_ns = crate::clock::monotonic_ns();
        for s in per_cpu.iter() {
            snap.idle_ns += s.idle_ns;
            if s.valid != 0 && snap.monotonic_ns > s.last_switch_ns {
                *snap.inflight_ns.entry(s.running_tid).or_default() +=
                    snap.monotonic_ns - s.last_switch_ns;
            }
            if s.valid != 0 && s.running_tid != 0 && s.pending_wait_ns != 0 {
                *snap.inflight_wait_ns.entry(s.running_tid).or_default() += s.pending_wait_ns;
            }
        }

        snap.drops = self.drops();
        let free_missed = self.free_missed();
        snap.drops[drop_reason::FREE_MISSED as usize] = free_missed.unwrap_or(0);
        // Not worth a failed read: the slots stay, as without the sweep.
        if let Err(e) = self.free_stale_slots(&mut snap, free_missed) {
            log::warn!("freeing task slots sched_process_free left: {e}");
        }
        if self.offcpu().is_some() {
            snap.wakers = self.read_wakers();
            let full = &mut snap.drops[drop_reason::WAKER_MAP_FULL as usize];
            *full = full.wrapping_add(self.wakers_dropped());
        }
        Ok(snap)
    }

    /// After walks of TASKS that each saw a switch land (a slow reader: in a
    /// loaded QEMU TCG guest one walk took over a second): a CPU that
    /// switched during the last walk may have ended the slice of the task
    /// running there (`from`) after that task's entry was read, and
    /// CPU_STATE (`to`) no longer shows it in flight, so a spinner's whole
    /// slice could be in neither. Re-reads those tasks' slots (one copy
    /// each, microseconds) and CPU_STATE again, until no CPU switched in
    /// between; returns the CPU states to take in-flight time from. A slice
    /// that began and ended inside the walk can still be missed, and is
    /// shorter than the walk.
    fn reread_switched_out(
        &self,
        tasks: &mut HashMap<u32, TaskRecord>,
        mut from: Vec<CpuState>,
        mut to: Vec<CpuState>,
    ) -> Vec<CpuState> {
        for _ in 0..8 {
            let switched_out: Vec<u32> = from
                .iter()
                .zip(&to)
                .filter(|(f, t)| f.last_switch_ns != t.last_switch_ns && f.valid != 0)
                .map(|(f, _)| f.running_tid)
                .filter(|&tid| tid != 0)
                .collect();
            if switched_out.is_empty() {
                return to;
            }
            for tid in switched_out {
                if let Some(t) = self.read_task_slot(tid) {
                    tasks.insert(tid, t);
                }
            }
            from = std::mem::replace(&mut to, self.cpu_states());
        }
        log::debug!("switches kept landing while reading TASKS; this read may miss a slice");
        to
    }

    /// One BPF_MAP_TYPE_HASH with u32 keys: iterated while it held at most
    /// `SMALL_HASH` entries at the last read (`last_len`), which for the
    /// fallback hashes is the rule (ids past the arrays are rare): an empty
    /// hash then costs one BPF_MAP_GET_NEXT_KEY, which, unlike a lookup,
    /// does not raise bpf_prog_active. Batched when larger, where the
    /// kernel has it.
    fn read_hash<V: aya::Pod + Default>(
        &mut self,
        name: &'static str,
        last_len: usize,
    ) -> Result<HashMap<u32, V>, BpfError> {
        if self.map_read() == MapRead::Batch && last_len > SMALL_HASH {
            if let aya::maps::Map::HashMap(data) = self.map(name)? {
                let mut out = HashMap::new();
                let batched = batch::hash_u32::<V>(data.fd().as_fd(), |key, value| {
                    out.insert(key, *value);
                })
                .map_err(|source| BpfError::Batch { name, source })?;
                if batched {
                    return Ok(out);
                }
                log_missing(
                    Feature::BatchLookup,
                    format!("BPF_MAP_LOOKUP_BATCH on {name} returned EINVAL"),
                );
                self.set_map_read(MapRead::Iterate);
            }
        }
        iterate_hash(self.map(name)?, name)
    }
}

/// Entries up to which a hash is walked key by key (see `read_hash`).
const SMALL_HASH: usize = 64;

/// Every entry of a hash keyed by u32, by aya's iterator. Keys freed
/// between get_next_key and the lookup are skipped: that race is normal for
/// tasks exiting during the walk.
fn iterate_hash<V: aya::Pod>(
    map: &aya::maps::Map,
    name: &'static str,
) -> Result<HashMap<u32, V>, BpfError> {
    let hash: AyaHashMap<&MapData, u32, V> = AyaHashMap::try_from(map).map_err(map_err(name))?;
    let mut out = HashMap::new();
    for item in hash.iter() {
        match item {
            Ok((key, value)) => {
                out.insert(key, value);
            }
            Err(MapError::KeyNotFound) => continue,
            Err(source) => return Err(BpfError::Map { name, source }),
        }
    }
    Ok(out)
}
