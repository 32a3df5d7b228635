//! The read's mmap side: the arrays of `bpf::mapped` (no bpf() syscall,
//! so no blind window on the reader's CPU), and the fallback hashes for
//! ids past them.

use std::collections::HashMap;

use vitals_common::{
    drop_reason, names, CpuState, ExitKey, ExitRecord, ExitRecordShort, ExitedTask, FaultCounters,
    TaskRecord,
};

use super::super::{
    mapped::{own_ring, MappedArray},
    Accounting, BpfError,
};

impl Accounting {
    /// Maps the arrays at the first read (the maps live as long as `self`).
    pub(super) fn map_arrays(&mut self) -> Result<(), BpfError> {
        if self.mappings().cpu_state.is_some() {
            return Ok(());
        }
        let cpu_state = MappedArray::open(self.map(names::CPU_STATE)?, names::CPU_STATE)?;
        let drops = MappedArray::open(self.map(names::DROPS)?, names::DROPS)?;
        let tasks = MappedArray::open(self.map(names::TASKS_BY_TID)?, names::TASKS_BY_TID)?;
        let faults = MappedArray::open(self.map(names::FAULTS_BY_TGID)?, names::FAULTS_BY_TGID)?;
        let ring = own_ring(self.map(names::EXITED_RING)?, names::EXITED_RING)?;
        let m = self.mappings_mut();
        m.exited_ring = ring;
        m.cpu_state = Some(cpu_state);
        m.drops = Some(drops);
        m.tasks = Some(tasks);
        m.process_faults = Some(faults);
        Ok(())
    }

    /// Freed tasks' records in EXITED_RING, consumed (the ring's consumer
    /// position moves past them): loads and one store on the mapping.
    pub(super) fn drain_exited_ring(&mut self, out: &mut Vec<(ExitKey, ExitedTask)>) {
        let Some(ring) = self.mappings_mut().exited_ring.as_mut() else {
            return;
        };
        while let Some(item) = ring.next() {
            // Full records where the programs count process faults, short
            // ones (no process faults) elsewhere: told by their length.
            // SAFETY: both are plain old data and the record holds one;
            // ring records are only 8-byte aligned, hence unaligned.
            let r = if item.len() >= std::mem::size_of::<ExitRecord>() {
                unsafe { std::ptr::read_unaligned(item.as_ptr() as *const ExitRecord) }
            } else if item.len() >= std::mem::size_of::<ExitRecordShort>() {
                let short =
                    unsafe { std::ptr::read_unaligned(item.as_ptr() as *const ExitRecordShort) };
                short.full()
            } else {
                log::warn!("short {} record: {} bytes", names::EXITED_RING, item.len());
                continue;
            };
            out.push((r.key, r.task));
        }
    }

    /// Every CPU's scheduler state, one CPU_STATE row each (rows past the
    /// possible CPUs, in bpfloader's larger map, stay `valid` 0).
    pub(super) fn cpu_states(&self) -> Vec<CpuState> {
        let a = self.mappings().cpu_state.as_ref().expect("mapped");
        (0..a.entries()).map(|cpu| a.read_stable(cpu)).collect()
    }

    /// The drop counters summed over CPUs (DROPS: one row of
    /// `drop_reason::COUNT` per CPU).
    pub(super) fn drops(&self) -> [u64; drop_reason::COUNT as usize] {
        let a = self.mappings().drops.as_ref().expect("mapped");
        let mut sums = [0u64; drop_reason::COUNT as usize];
        for i in 0..a.entries() {
            let reason = (i % drop_reason::COUNT) as usize;
            sums[reason] = sums[reason].wrapping_add(a.read_stable(i));
        }
        sums
    }

    /// Live tasks: TASKS_BY_TID's stamped slots (`born_ns` non-zero; the
    /// programs clear it first when the task is freed), then the TASKS
    /// hash of tids past the array.
    pub(super) fn read_tasks(&mut self) -> Result<HashMap<u32, TaskRecord>, BpfError> {
        let mut out = HashMap::new();
        {
            let a = self.mappings().tasks.as_ref().expect("mapped");
            // Most slots are free: test the stamp alone before copying a
            // slot until stable (two record copies a slot, every tick).
            let stamp = std::mem::offset_of!(TaskRecord, born_ns);
            for tid in 1..a.entries() {
                if a.copy_u64(tid, stamp) == 0 {
                    continue;
                }
                let t = a.read_stable(tid);
                if t.born_ns != 0 {
                    out.insert(tid, t);
                }
            }
        }
        let last = self.mappings().tasks_hash_len;
        let hash: HashMap<u32, TaskRecord> = self.read_hash(names::TASKS, last)?;
        self.mappings_mut().tasks_hash_len = hash.len();
        out.extend(hash);
        Ok(out)
    }

    /// One task's counters from its TASKS_BY_TID slot, if it has a live
    /// one: tids past the array are not looked up (a bpf() lookup raises
    /// bpf_prog_active, blinding the classic programs on this CPU).
    pub(super) fn read_task_slot(&self, tid: u32) -> Option<TaskRecord> {
        let a = self.mappings().tasks.as_ref().expect("mapped");
        if tid == 0 || tid >= a.entries() {
            return None;
        }
        let t = a.read_stable(tid);
        (t.born_ns != 0).then_some(t)
    }

    /// Processes' fault counters: FAULTS_BY_TGID's non-zero slots, then
    /// the PROCESS_FAULTS hash of tgids past the array.
    pub(super) fn read_process_faults(&mut self) -> Result<HashMap<u32, FaultCounters>, BpfError> {
        let mut out = HashMap::new();
        {
            let a = self.mappings().process_faults.as_ref().expect("mapped");
            for tgid in 1..a.entries() {
                let f = a.read_stable(tgid);
                if f != FaultCounters::default() {
                    out.insert(tgid, f);
                }
            }
        }
        let last = self.mappings().faults_hash_len;
        let hash: HashMap<u32, FaultCounters> = self.read_hash(names::PROCESS_FAULTS, last)?;
        self.mappings_mut().faults_hash_len = hash.len();
        out.extend(hash);
        Ok(out)
    }
}
