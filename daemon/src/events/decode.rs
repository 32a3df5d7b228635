//! The one decoder of capture records. Both transports (`ringbuf`,
//! `perf_array`) carry the same bytes, the `vitals_common` event structs the
//! eBPF side writes; each hands every record it reads to `decode`, which
//! turns it into a `Record`. Sched records decode straight into the
//! CompactSched writer's rows, fault samples into `FaultRec` for the
//! symboliser.

use vitals_common::{
    blind::{self, BlindWindowEvent},
    capture, FaultEvent, OffcpuEvent, OffcpuUserStack, SwitchEvent, WakingEvent,
};

use crate::perfetto::{
    blind_windows::BlindWindow,
    compact_sched::{SwitchRec, WakingRec},
};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    Switch {
        cpu: u32,
        prev_tgid: u32,
        /// 0: the program could not tell (see `SwitchEvent::next_tgid`).
        next_tgid: u32,
        rec: SwitchRec,
    },
    Waking {
        cpu: u32,
        rec: WakingRec,
    },
    Fault(FaultRec),
    /// A long block of a watched thread, with its waker. Boxed: with its
    /// kernel frames it is eight times a switch record, which batches of
    /// records would otherwise each be sized to.
    Offcpu(Box<OffcpuEvent>),
    /// The user stack of long blocks that waited for their thread's switch-in.
    OffcpuUserStack(OffcpuUserStack),
    /// Switches a CPU made that no classic program saw.
    BlindWindow(BlindWindow),
    /// Perf array only: the perf buffer of `cpu` reported `count` samples
    /// it had no room for (PERF_RECORD_LOST).
    Lost {
        cpu: u32,
        count: u64,
    },
}

/// What a stack sample stands for; off-CPU and waker samples get a
/// synthetic root frame (`SampleKind::root`), so trace_processor and the
/// flamegraph tell them from fault samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SampleKind {
    /// A sampled user page fault.
    Fault,
    /// A watched thread's stack at its switch-out, blocked `blocked_ns`;
    /// its kernel stack's id beside the user one (`FaultRec::stack_id`).
    Offcpu { blocked_ns: u64, kernel_stack: i64 },
    /// The stack of the thread that woke a long block, at sched_waking.
    Waker { kernel_stack: i64 },
}

impl SampleKind {
    /// The kernel stack's id, where the sample has one (negative: none).
    pub fn kernel_stack(self) -> i64 {
        match self {
            SampleKind::Fault => -1,
            SampleKind::Offcpu { kernel_stack, .. } | SampleKind::Waker { kernel_stack } => {
                kernel_stack
            }
        }
    }
}

/// One stack sample from the capture transport: a fault sample, or one of
/// the two stacks of a long block. `stack_id` is the user stack's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FaultRec {
    pub kind: SampleKind,
    pub ts: u64,
    pub cpu: u32,
    pub tgid: u32,
    pub tid: u32,
    /// Negative: no stack (bpf_get_stackid failed).
    pub stack_id: i64,
}

fn read<T: Copy>(b: &[u8]) -> Option<T> {
    (b.len() >= std::mem::size_of::<T>())
        // SAFETY: length checked; T is a repr(C) integer-only type.
        .then(|| unsafe { std::ptr::read_unaligned(b.as_ptr() as *const T) })
}

/// Decodes one record; None for an unknown kind or short record.
pub fn decode(b: &[u8]) -> Option<Record> {
    let kind = u32::from_ne_bytes(b.get(..4)?.try_into().ok()?);
    match kind {
        capture::KIND_SWITCH => {
            let e: SwitchEvent = read(b)?;
            Some(Record::Switch {
                cpu: e.hdr.cpu,
                prev_tgid: e.prev_tgid,
                next_tgid: e.next_tgid,
                rec: SwitchRec {
                    ts: e.hdr.ts,
                    prev_pid: e.prev_pid,
                    prev_prio: e.prev_prio,
                    prev_state: e.prev_state,
                    next_pid: e.next_pid,
                    next_prio: e.next_prio,
                    next_comm: e.next_comm,
                },
            })
        }
        capture::KIND_WAKING => {
            let e: WakingEvent = read(b)?;
            Some(Record::Waking {
                cpu: e.hdr.cpu,
                rec: WakingRec {
                    ts: e.hdr.ts,
                    pid: e.pid,
                    prio: e.prio,
                    target_cpu: e.target_cpu,
                    comm: e.comm,
                },
            })
        }
        capture::KIND_FAULT => {
            let e: FaultEvent = read(b)?;
            Some(Record::Fault(FaultRec {
                kind: SampleKind::Fault,
                ts: e.hdr.ts,
                cpu: e.hdr.cpu,
                tgid: e.tgid,
                tid: e.tid,
                stack_id: e.stack_id,
            }))
        }
        capture::KIND_OFFCPU => Some(Record::Offcpu(Box::new(read(b)?))),
        capture::KIND_OFFCPU_USER_STACK => Some(Record::OffcpuUserStack(read(b)?)),
        blind::KIND_BLIND_WINDOW => {
            let e: BlindWindowEvent = read(b)?;
            Some(Record::BlindWindow(BlindWindow {
                cpu: e.hdr.cpu,
                start_ts: e.start_ts,
                end_ts: e.hdr.ts,
                unseen_switches: e.unseen_switches,
                seen_by: e.seen_by,
            }))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vitals_common::EventHeader;

    fn bytes<T>(v: &T) -> Vec<u8> {
        let p = v as *const T as *const u8;
        unsafe { std::slice::from_raw_parts(p, std::mem::size_of::<T>()) }.to_vec()
    }

    #[test]
    fn records_decode_by_kind() {
        let s = SwitchEvent {
            hdr: EventHeader {
                kind: capture::KIND_SWITCH,
                cpu: 1,
                ts: 99,
            },
            prev_state: 1,
            prev_pid: 10,
            prev_prio: 120,
            next_pid: 11,
            next_prio: 100,
            next_comm: *b"abc\0\0\0\0\0\0\0\0\0\0\0\0\0",
            prev_tgid: 10,
            next_tgid: 7,
        };
        match decode(&bytes(&s)) {
            Some(Record::Switch {
                cpu: 1,
                prev_tgid: 10,
                next_tgid: 7,
                rec,
            }) => {
                assert_eq!((rec.ts, rec.prev_pid, rec.next_pid), (99, 10, 11))
            }
            other => panic!("{other:?}"),
        }
        let f = FaultEvent {
            hdr: EventHeader {
                kind: capture::KIND_FAULT,
                cpu: 0,
                ts: 5,
            },
            tgid: 3,
            tid: 4,
            stack_id: -17,
        };
        assert!(matches!(decode(&bytes(&f)), Some(Record::Fault(r)) if r.stack_id == -17));
        assert_eq!(decode(&bytes(&f)[..10]), None);
        let o = OffcpuEvent {
            hdr: EventHeader {
                kind: capture::KIND_OFFCPU,
                cpu: 1,
                ts: 50,
            },
            blocked_ts: 10,
            tid: 4,
            waker_tid: 9,
            ..Default::default()
        };
        assert_eq!(decode(&bytes(&o)), Some(Record::Offcpu(Box::new(o))));
        assert_eq!(decode(&bytes(&o)[..40]), None);
        let u = OffcpuUserStack {
            hdr: EventHeader {
                kind: capture::KIND_OFFCPU_USER_STACK,
                cpu: 0,
                ts: 60,
            },
            since_ts: 10,
            tid: 7,
            tgid: 5,
            user_stack: 3,
        };
        assert_eq!(decode(&bytes(&u)), Some(Record::OffcpuUserStack(u)));
        assert_eq!(decode(&bytes(&u)[..30]), None);
        let w = BlindWindowEvent {
            hdr: EventHeader {
                kind: blind::KIND_BLIND_WINDOW,
                cpu: 1,
                ts: 900,
            },
            start_ts: 100,
            unseen_switches: 3,
            seen_by: blind::SEEN_BY_COUNTER,
        };
        assert_eq!(
            decode(&bytes(&w)),
            Some(Record::BlindWindow(BlindWindow {
                cpu: 1,
                start_ts: 100,
                end_ts: 900,
                unseen_switches: 3,
                seen_by: blind::SEEN_BY_COUNTER,
            }))
        );
        assert_eq!(decode(&bytes(&w)[..20]), None);
        assert_eq!(decode(&[9, 0, 0, 0, 0, 0, 0, 0]), None);
    }
}
