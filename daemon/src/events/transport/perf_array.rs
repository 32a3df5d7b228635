//! The perf-event-array end of the capture transport (kernels without
//! BPF_MAP_TYPE_RINGBUF, or `--capture-transport perf`): one perf buffer per
//! CPU, polled by the same drain thread as the ring buffer. Samples carry
//! the same record bytes and go through the same `decode`.

use aya::maps::{perf::PerfEvent, perf::PerfEventArrayBuffer, MapData};

use super::super::decode::{decode, Record};

/// Drains every CPU's buffer into `out`. Samples that straddle the end of
/// a perf ring arrive in two pieces and are joined first. A
/// PERF_RECORD_LOST (the kernel's count of samples that did not fit)
/// becomes `Record::Lost` for that buffer's CPU.
pub fn drain(bufs: &mut [(u32, PerfEventArrayBuffer<MapData>)], out: &mut Vec<Record>) {
    let mut joined = Vec::new();
    for (cpu, buf) in bufs.iter_mut() {
        if !buf.readable() {
            continue;
        }
        let cpu = *cpu;
        buf.for_each(|ev| match ev {
            PerfEvent::Sample { head, tail } => {
                let r = if tail.is_empty() {
                    decode(head)
                } else {
                    joined.clear();
                    joined.extend_from_slice(head);
                    joined.extend_from_slice(tail);
                    decode(&joined)
                };
                out.extend(r);
            }
            PerfEvent::Lost { count } => out.push(Record::Lost { cpu, count }),
        });
    }
}
