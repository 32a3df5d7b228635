//! The BPF ring-buffer end of the capture transport (CAPTURE_EVENTS, the
//! default where the kernel has BPF_MAP_TYPE_RINGBUF). The eBPF side
//! submits with BPF_RB_NO_WAKEUP, so nothing waits on it: the drain thread
//! (`drain`) polls it, like the perf array, and every record goes through
//! the shared `decode`.

use aya::maps::{MapData, RingBuf};

use super::super::decode::{decode, Record};

/// Everything readable in the ring now, decoded, appended to `out`.
pub fn drain(ring: &mut RingBuf<MapData>, out: &mut Vec<Record>) {
    while let Some(item) = ring.next() {
        out.extend(decode(&item));
    }
}
