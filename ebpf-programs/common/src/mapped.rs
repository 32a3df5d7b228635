//! The arrays user space reads through mmap, not bpf() (see the programs'
//! `mapped` module for why), and the ring buffer's freed-task record.

use crate::{ExitKey, ExitedTask, TaskRecord};

/// include/uapi/linux/bpf.h, Linux 5.5.
pub const BPF_F_MMAPABLE: u32 = 1 << 10;
/// CPU_STATE's rows (and DROPS' rows) in the object, what bpfloader
/// creates: any Android device's possible CPUs. aya's loader sizes
/// them to this machine's possible CPUs.
pub const DEFAULT_CPUS: u32 = 256;
/// TASKS_BY_TID / FAULTS_BY_TGID entries in the object: a phone's
/// usual pid_max. aya's loader sizes them from pid_max (at most
/// `MAX_TIDS`); larger ids go to the TASKS / PROCESS_FAULTS hashes.
pub const DEFAULT_TIDS: u32 = 32768;
/// Largest TASKS_BY_TID the loader makes (5.5 MiB of 88-byte records).
pub const MAX_TIDS: u32 = 1 << 16;
/// EXITED_RING's bytes in the object (bpfloader's): 3855 records, as
/// many as the EXITED hash's 4096 entries near enough.
pub const DEFAULT_EXITED_RING_BYTES: u32 = 512 << 10;

/// One freed task in EXITED_RING: what the EXITED hash holds as key and
/// value, drained through the ring's mmap instead of bpf() lookups.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExitRecord {
    pub key: ExitKey,
    pub task: ExitedTask,
}

/// `ExitRecord` without the process's fault counters, which the programs
/// keep only where some tid can miss TASKS_BY_TID (COUNT_PROCESS_FAULTS):
/// elsewhere every freed task's record is this one, 120 bytes, so the
/// ring's 8-byte header makes it 128 and EXITED_RING holds as many in half
/// the bytes of the 152 a full one takes. User space tells the two apart
/// by the ring record's length.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExitRecordShort {
    pub key: ExitKey,
    pub counters: TaskRecord,
    pub comm: [u8; 16],
}

impl ExitRecordShort {
    /// As the full record, with no process fault counters.
    pub fn full(&self) -> ExitRecord {
        ExitRecord {
            key: self.key,
            task: ExitedTask {
                counters: self.counters,
                comm: self.comm,
                ..Default::default()
            },
        }
    }
}
