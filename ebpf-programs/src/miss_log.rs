//! Debug-only (cargo feature `miss-log`, off in the shipped object): the
//! last `MISS_LOG_LEN` switches per CPU that on_switch counted as
//! SWITCH_MISSED, for finding out what they are (issue #22 item 3). Read it
//! with `bpftool map dump name MISS_LOG` while a daemon built on that
//! object runs. Build: daemon/build.rs's `cargo build -p vitals-ebpf ...`
//! command plus `--features miss-log --target-dir /tmp/miss-log`, then
//! `VITALS_EBPF_OBJ=/tmp/miss-log/bpfel-unknown-none/release/vitals-ebpf
//! cargo build -p vitalsd --bins` (and rebuild without it afterwards).
//! Layout of a value: `count: u64` then `MissRecord`s of 56 bytes.

use aya_ebpf::{
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid},
    macros::map,
    maps::PerCpuArray,
};

pub const MISS_LOG_LEN: usize = 16;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct MissRecord {
    pub now_ns: u64,
    pub last_switch_ns: u64,
    /// `prev` as the program read it (task_struct->pid or the record).
    pub prev: u32,
    /// CPU_STATE.running_tid: `next` of this CPU's previous traced switch.
    pub running_tid: u32,
    pub next: u32,
    pub blocked: u32,
    /// bpf_get_current_pid_tgid(): `current` (still prev) read independently.
    pub current_pid_tgid: u64,
    pub current_comm: [u8; 16],
}

#[repr(C)]
pub struct MissLog {
    pub count: u64,
    pub records: [MissRecord; MISS_LOG_LEN],
}

#[map(name = "MISS_LOG")]
static MISS_LOG: PerCpuArray<MissLog> = PerCpuArray::with_max_entries(1, 0);

#[inline(always)]
pub fn record(
    now_ns: u64,
    last_switch_ns: u64,
    prev: u32,
    running_tid: u32,
    next: u32,
    blocked: bool,
) {
    let Some(log) = MISS_LOG.get_ptr_mut(0) else {
        return;
    };
    let log = unsafe { &mut *log };
    let slot = (log.count as usize) % MISS_LOG_LEN;
    log.count += 1;
    if let Some(r) = log.records.get_mut(slot) {
        r.now_ns = now_ns;
        r.last_switch_ns = last_switch_ns;
        r.prev = prev;
        r.running_tid = running_tid;
        r.next = next;
        r.blocked = blocked as u32;
        r.current_pid_tgid = bpf_get_current_pid_tgid();
        r.current_comm = bpf_get_current_comm().unwrap_or([0; 16]);
    }
}
