//! The capture's five large maps (the record ring, the user stacks, the
//! fault-sampling counters and the off-CPU blocks in flight), reached in
//! one of two ways, chosen at load by `PER_CAPTURE_MAPS` (frozen
//! `.rodata`, so the verifier walks one way only and the other is dead
//! code):
//!
//! - 1, the daemon's own load: each map lives in slot 0 of a one-slot
//!   BPF_MAP_TYPE_ARRAY_OF_MAPS (`SLOT_*`), where user space puts a map it
//!   creates for one capture and takes it out at the end. Between captures
//!   the slots are empty and the maps do not exist: their megabytes of
//!   kernel memory are held only while a capture runs (#22 item 4).
//! - 0, the default that bpfloader's copy keeps (it folds `.rodata` to its
//!   defaults and creates no map-in-map): the plain maps, created once at
//!   boot at the size they run captures with. The daemon's own load gives
//!   them their minimum size (1 page, 1 entry).
//!
//! A slot is empty only after a capture ended (user space fills the slots
//! before it sets the capture flag and empties them after clearing it): a
//! program that read the flag just before the end then writes nothing,
//! and that is no loss (`ring_write` says written, `stack_id` gives
//! `SLOT_EMPTY`).

use aya_ebpf::{
    btf_maps::{
        ArrayOfMaps, LruHashMap as SlotLruHashMap, RingBuf as SlotRingBuf,
        StackTrace as SlotStackTrace,
    },
    macros::{btf_map, map},
    maps::{LruHashMap, RingBuf, StackTrace},
    programs::tracing::StackIdContext,
};
use vitals_common::{AwaitUserStack, OffcpuStart};

use crate::{setting, PER_CAPTURE_MAPS};

// ---- the plain maps: bpfloader's (sized at boot), or 1 page / 1 entry ----

/// Switch, waking, fault and off-CPU records (`vitals_common::*Event`).
#[map(name = "CAPTURE_EVENTS")]
static CAPTURE_EVENTS: RingBuf = RingBuf::with_byte_size(4096, 0);

/// User and kernel stacks of sampled faults and long blocks.
#[map(name = "CAPTURE_STACKS")]
static CAPTURE_STACKS: StackTrace = StackTrace::with_max_entries(1, 0);

/// tgid -> faults since its last sample (one sample every `fault_period`).
#[map(name = "CAPTURE_FAULT_CTR")]
static CAPTURE_FAULT_CTR: LruHashMap<u32, u32> = LruHashMap::with_max_entries(1, 0);

/// tid -> its switch-out while blocked. LRU: a thread that exits blocked
/// (or whose waking is never seen) ages out instead of filling the map.
#[map(name = "OFFCPU_START")]
static OFFCPU_START: LruHashMap<u32, OffcpuStart> = LruHashMap::with_max_entries(1, 0);

/// tid -> the `blocked_ts` of the first of its long blocks whose user
/// stack waits for its switch-in. LRU: a thread that never runs again
/// (killed while blocked) ages out.
#[map(name = "OFFCPU_AWAIT_USER")]
static OFFCPU_AWAIT_USER: LruHashMap<u32, AwaitUserStack> = LruHashMap::with_max_entries(1, 0);

// ---- the one-slot outers of the daemon's own load; the inner types are
// templates: the kernel checks each capture's map against their type, key
// and value sizes and flags, not their max_entries ----

#[btf_map(name = "SLOT_EVENTS")]
static SLOT_EVENTS: ArrayOfMaps<SlotRingBuf<u8, 4096>, 1> = ArrayOfMaps::new();

#[btf_map(name = "SLOT_STACKS")]
static SLOT_STACKS: ArrayOfMaps<SlotStackTrace<1>, 1> = ArrayOfMaps::new();

#[btf_map(name = "SLOT_FAULT_CTR")]
static SLOT_FAULT_CTR: ArrayOfMaps<SlotLruHashMap<u32, u32, 1>, 1> = ArrayOfMaps::new();

#[btf_map(name = "SLOT_OFFCPU_ST")]
static SLOT_OFFCPU_START: ArrayOfMaps<SlotLruHashMap<u32, OffcpuStart, 1>, 1> = ArrayOfMaps::new();

#[btf_map(name = "SLOT_AWAIT_USER")]
static SLOT_AWAIT_USER: ArrayOfMaps<SlotLruHashMap<u32, AwaitUserStack, 1>, 1> = ArrayOfMaps::new();

/// `stack_id` with the stack map's slot empty: the capture has ended.
pub(crate) const SLOT_EMPTY: i64 = i64::MIN;

#[inline(always)]
fn per_capture() -> bool {
    setting(&PER_CAPTURE_MAPS) != 0
}

/// Copies `ev` into a reserved record submitted with `flags`. False when
/// the ring is full (an ended capture's empty slot is no loss: true).
#[inline(always)]
pub(crate) fn ring_write<T: 'static>(ev: T, flags: u64) -> bool {
    if per_capture() {
        let Some(ring) = SLOT_EVENTS.get(0) else {
            return true;
        };
        match ring.reserve_untyped::<T>(0) {
            Some(mut e) => {
                e.write(ev);
                e.submit(flags);
                true
            }
            None => false,
        }
    } else {
        match CAPTURE_EVENTS.reserve::<T>(0) {
            Some(mut e) => {
                e.write(ev);
                e.submit(flags);
                true
            }
            None => false,
        }
    }
}

/// `ring_write` for a record built in a map (too large for the BPF
/// stack): bpf_ringbuf_output copies it. The helper's error, 0 if written
/// (or the capture has ended).
#[inline(always)]
pub(crate) fn ring_output<T: 'static>(ev: &T, flags: u64) -> i64 {
    let res = if per_capture() {
        match SLOT_EVENTS.get(0) {
            Some(ring) => ring.output_untyped::<T>(ev, flags),
            None => return 0,
        }
    } else {
        CAPTURE_EVENTS.output::<T>(ev, flags)
    };
    match res {
        Ok(()) => 0,
        Err(e) => i64::from(e),
    }
}

/// bpf_get_stackid into the capture's stack map: the id, or the helper's
/// negative error (`SLOT_EMPTY` once the capture has ended).
#[inline(always)]
pub(crate) fn stack_id<C: StackIdContext>(ctx: &C, flags: u64) -> i64 {
    let res = if per_capture() {
        match SLOT_STACKS.get(0) {
            Some(stacks) => ctx.get_stackid(stacks, flags),
            None => return SLOT_EMPTY,
        }
    } else {
        ctx.get_stackid(&CAPTURE_STACKS, flags)
    };
    match res {
        Ok(id) => id,
        Err(e) => i64::from(e),
    }
}

/// A pointer to `tgid`'s fault counter, if it has one.
#[inline(always)]
pub(crate) fn fault_ctr(tgid: &u32) -> Option<*mut u32> {
    if per_capture() {
        SLOT_FAULT_CTR.get(0)?.get_ptr_mut(tgid)
    } else {
        CAPTURE_FAULT_CTR.get_ptr_mut(tgid)
    }
}

#[inline(always)]
pub(crate) fn fault_ctr_insert(tgid: &u32, n: &u32) {
    if per_capture() {
        if let Some(m) = SLOT_FAULT_CTR.get(0) {
            let _ = m.insert(tgid, n, 0);
        }
    } else {
        let _ = CAPTURE_FAULT_CTR.insert(tgid, n, 0);
    }
}

#[inline(always)]
pub(crate) fn offcpu_start_insert(tid: &u32, start: &OffcpuStart) {
    if per_capture() {
        if let Some(m) = SLOT_OFFCPU_START.get(0) {
            let _ = m.insert(tid, start, 0);
        }
    } else {
        let _ = OFFCPU_START.insert(tid, start, 0);
    }
}

/// `tid`'s recorded switch-out, removed from the map.
#[inline(always)]
pub(crate) fn offcpu_start_take(tid: &u32) -> Option<OffcpuStart> {
    if per_capture() {
        let m = SLOT_OFFCPU_START.get(0)?;
        let start = unsafe { *m.get_ptr(tid)? };
        let _ = m.remove(tid);
        Some(start)
    } else {
        let start = unsafe { *OFFCPU_START.get_ptr(tid)? };
        let _ = OFFCPU_START.remove(tid);
        Some(start)
    }
}

/// Inserts `tid`'s wait for its user stack unless one is there already;
/// true if inserted.
#[inline(always)]
pub(crate) fn await_user_insert_new(tid: &u32, w: &AwaitUserStack, noexist: u64) -> bool {
    if per_capture() {
        match SLOT_AWAIT_USER.get(0) {
            Some(m) => m.insert(tid, w, noexist).is_ok(),
            None => false,
        }
    } else {
        OFFCPU_AWAIT_USER.insert(tid, w, noexist).is_ok()
    }
}

/// `tid`'s wait for its user stack, if any, and whether this call removed
/// it (false: a concurrent caller did, or the map is gone).
#[inline(always)]
pub(crate) fn await_user_take(tid: &u32) -> Option<(AwaitUserStack, bool)> {
    if per_capture() {
        let m = SLOT_AWAIT_USER.get(0)?;
        let w = unsafe { *m.get_ptr(tid)? };
        Some((w, m.remove(tid).is_ok()))
    } else {
        let w = unsafe { *OFFCPU_AWAIT_USER.get_ptr(tid)? };
        Some((w, OFFCPU_AWAIT_USER.remove(tid).is_ok()))
    }
}
