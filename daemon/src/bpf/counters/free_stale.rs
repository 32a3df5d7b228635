//! Frees the task slots `bpf::stale` finds stale, from user space, as
//! sched_process_free would have: the stamp cleared (`forget_task`'s
//! protocol), the fallback hash key deleted, a leader's process fault
//! counters cleared too. Its task then leaves the snapshot, and `totals`
//! ends it from its last counters, as a lost exit record. A program
//! writing the slot while it is cleared (a reused tid's new task) loses
//! what it adds, which the slot mixed with the dead task's anyway.

use aya::maps::{HashMap as AyaHashMap, MapData};
use vitals_common::{names, FaultCounters, TaskRecord};

use super::{
    super::{map_err, mapped::MappedArray, Accounting, BpfError},
    BpfSnapshot,
};

impl Accounting {
    /// Frees the slots of `snap.tasks` that are stale (`StaleSweep`) and
    /// takes them out of `snap`, so `totals` ends their tasks now.
    pub(super) fn free_stale_slots(
        &mut self,
        snap: &mut BpfSnapshot,
        free_missed: Option<u64>,
    ) -> Result<(), BpfError> {
        let clocks = crate::clock::ClockPair::now();
        let boot_offset_ns = clocks.boottime_ns.saturating_sub(clocks.monotonic_ns);
        let stale = self.stale_sweep().stale(
            &snap.tasks,
            free_missed,
            clocks.monotonic_ns,
            boot_offset_ns,
        );
        if stale.is_empty() {
            return Ok(());
        }
        // One writable mapping of each array for the whole batch, not one
        // mmap (and BPF_OBJ_GET_INFO_BY_FD) per slot.
        let tasks = MappedArray::<TaskRecord>::open_writable(
            self.map(names::TASKS_BY_TID)?,
            names::TASKS_BY_TID,
        )?;
        let faults = MappedArray::<FaultCounters>::open_writable(
            self.map(names::FAULTS_BY_TGID)?,
            names::FAULTS_BY_TGID,
        )?;
        let mut freed = 0;
        for tid in stale {
            let Some(task) = snap.tasks.remove(&tid) else {
                continue;
            };
            if !self.forget_task(&tasks, tid, task.born_ns)? {
                continue;
            }
            freed += 1;
            // A leader's slot: its process's fault counters end with it,
            // as at its free (a reused tid's new process starts from 0).
            if task.tgid == tid || task.tgid == 0 {
                snap.process_faults.remove(&tid);
                self.forget_process(&faults, tid)?;
            }
        }
        self.stale_sweep().freed += freed;
        log::info!(
            "freed {freed} task slots of tasks gone from /proc whose sched_process_free did not \
             run (free_missed {}); they end as lost exits",
            free_missed.map_or("not counted by this kernel".to_string(), |n| n.to_string())
        );
        Ok(())
    }

    /// Clears `tid`'s slot if it still holds the stamp `born_ns` (false:
    /// the kernel freed or restamped it meanwhile).
    fn forget_task(
        &mut self,
        slots: &MappedArray<TaskRecord>,
        tid: u32,
        born_ns: u64,
    ) -> Result<bool, BpfError> {
        if tid < slots.entries() {
            let stamp = std::mem::offset_of!(TaskRecord, born_ns);
            if slots.copy_u64(tid, stamp) != born_ns {
                return Ok(false);
            }
            slots.write(tid, TaskRecord::default());
            return Ok(true);
        }
        let map = self.map_mut(names::TASKS)?;
        let mut hash: AyaHashMap<&mut MapData, u32, TaskRecord> =
            AyaHashMap::try_from(map).map_err(map_err(names::TASKS))?;
        // A bpf() delete: rare enough to open no window worth the name.
        Ok(hash.remove(&tid).is_ok())
    }

    /// Clears process `tgid`'s fault counters.
    fn forget_process(
        &mut self,
        slots: &MappedArray<FaultCounters>,
        tgid: u32,
    ) -> Result<(), BpfError> {
        if tgid < slots.entries() {
            slots.write(tgid, FaultCounters::default());
            return Ok(());
        }
        let map = self.map_mut(names::PROCESS_FAULTS)?;
        let mut hash: AyaHashMap<&mut MapData, u32, FaultCounters> =
            AyaHashMap::try_from(map).map_err(map_err(names::PROCESS_FAULTS))?;
        let _ = hash.remove(&tgid);
        Ok(())
    }
}
