//! Long blocks whose user stack waits for their thread's switch-in
//! (`CaptureControl::offcpu_user_at_switch_in`): the blocked-stack sample
//! of each is held here until the thread's `OffcpuUserStack` record names
//! its stack, microseconds after the waking that emitted the block.
//! One record covers every held block of its thread that began since its
//! `since_ts` (usually one; more where a switch-in went unseen, and the
//! thread was not back in user mode in between). What is still held when
//! the capture ends (the thread had not run again, it was killed blocked,
//! or its record was lost) is written without a user stack
//! (`USER_STACK_UNSEEN`), and counted.

use std::collections::HashMap;

use vitals_common::{capture as cap, OffcpuEvent, OffcpuUserStack};

use super::{
    decode::{FaultRec, SampleKind},
    EventRecorder, LongBlock,
};

pub use crate::perfetto::fault_samples::USER_STACK_UNSEEN;

#[derive(Debug, Default)]
pub struct AwaitingUserStacks {
    by_tid: HashMap<u32, Vec<FaultRec>>,
    /// Blocks whose user stack came at their switch-in.
    pub resolved: u64,
    /// Blocks written without one (`USER_STACK_UNSEEN`).
    pub unseen: u64,
}

impl AwaitingUserStacks {
    /// Holds a blocked-stack sample (`FaultRec::ts` is the block's start).
    pub fn hold(&mut self, rec: FaultRec) {
        self.by_tid.entry(rec.tid).or_default().push(rec);
    }

    /// The held samples `u` gives a user stack to (its thread's, begun in
    /// `since_ts..=hdr.ts`), with it.
    pub fn resolve(&mut self, u: &OffcpuUserStack) -> Vec<FaultRec> {
        let Some(held) = self.by_tid.get_mut(&u.tid) else {
            return Vec::new();
        };
        let (mine, rest): (Vec<FaultRec>, Vec<FaultRec>) = held
            .drain(..)
            .partition(|r| (u.since_ts..=u.hdr.ts).contains(&r.ts));
        if rest.is_empty() {
            self.by_tid.remove(&u.tid);
        } else {
            *held = rest;
        }
        self.resolved += mine.len() as u64;
        mine.into_iter()
            .map(|r| FaultRec {
                stack_id: u.user_stack,
                ..r
            })
            .collect()
    }

    /// Everything still held, without a user stack: the capture ended.
    pub fn give_up(&mut self) -> Vec<FaultRec> {
        let out: Vec<FaultRec> = self
            .by_tid
            .drain()
            .flat_map(|(_, recs)| recs)
            .map(|r| FaultRec {
                stack_id: USER_STACK_UNSEEN,
                ..r
            })
            .collect();
        self.unseen += out.len() as u64;
        out
    }
}

impl EventRecorder {
    /// A long block: its blocked stack (weighted by the blocked time) and
    /// its waker's go to the symboliser, the block to the timeline.
    pub(super) fn absorb_block(&mut self, e: &OffcpuEvent) {
        let blocked_ns = e.hdr.ts.saturating_sub(e.blocked_ts);
        self.tgids.insert(e.tid as i32, e.tgid as i32);
        self.note_tid(e.tid as i32, e.comm);
        if e.waker_tid > 0 {
            self.tgids.insert(e.waker_tid as i32, e.waker_tgid as i32);
            self.note_tid(e.waker_tid as i32, e.waker_comm);
        }
        // Taken at the waking (tp_btf): the frames, or the helper's error.
        let kernel_stack = if e.blocked_kernel_stack == cap::KERNEL_STACK_AT_WAKING {
            match usize::try_from(e.blocked_kernel_len) {
                Ok(n) => {
                    let ips = &e.blocked_kernel_ips.0[..n.min(cap::OFFCPU_KERNEL_IPS)];
                    self.faults.carried_stack(ips)
                }
                Err(_) => i64::from(e.blocked_kernel_len),
            }
        } else {
            e.blocked_kernel_stack
        };
        let blocked = FaultRec {
            kind: SampleKind::Offcpu {
                blocked_ns,
                kernel_stack,
            },
            ts: e.blocked_ts,
            cpu: e.hdr.cpu,
            tgid: e.tgid,
            tid: e.tid,
            stack_id: e.blocked_user_stack,
        };
        if e.blocked_user_stack == cap::USER_STACK_AT_SWITCH_IN {
            self.awaiting_user.hold(blocked);
        } else {
            self.faults.push(blocked);
        }
        self.faults.push(FaultRec {
            kind: SampleKind::Waker {
                kernel_stack: e.waker_kernel_stack,
            },
            ts: e.hdr.ts,
            cpu: e.hdr.cpu,
            tgid: e.waker_tgid,
            tid: e.waker_tid,
            stack_id: e.waker_user_stack,
        });
        self.blocks.push(LongBlock {
            blocked_ts: e.blocked_ts,
            waking_ts: e.hdr.ts,
            tid: e.tid,
            tgid: e.tgid,
            waker_tid: e.waker_tid,
            waker_tgid: e.waker_tgid,
            prev_state: e.prev_state,
        });
    }
}

#[cfg(test)]
mod tests {
    use vitals_common::{capture, EventHeader};

    use super::*;

    fn block(tid: u32, ts: u64) -> FaultRec {
        FaultRec {
            kind: SampleKind::Offcpu {
                blocked_ns: 5,
                kernel_stack: 1,
            },
            ts,
            cpu: 0,
            tgid: 1,
            tid,
            stack_id: capture::USER_STACK_AT_SWITCH_IN,
        }
    }

    fn user_stack(tid: u32, since_ts: u64, ts: u64, id: i64) -> OffcpuUserStack {
        OffcpuUserStack {
            hdr: EventHeader {
                kind: capture::KIND_OFFCPU_USER_STACK,
                cpu: 0,
                ts,
            },
            since_ts,
            tid,
            tgid: 1,
            user_stack: id,
        }
    }

    /// A record resolves its thread's blocks since its first one, not an
    /// earlier block whose own record was lost, nor another thread's.
    #[test]
    fn a_record_names_the_blocks_since_its_first_only() {
        let mut a = AwaitingUserStacks::default();
        a.hold(block(7, 10));
        a.hold(block(7, 100));
        a.hold(block(7, 120));
        a.hold(block(8, 110));
        let got = a.resolve(&user_stack(7, 100, 130, 42));
        assert_eq!(
            got.iter().map(|r| (r.ts, r.stack_id)).collect::<Vec<_>>(),
            vec![(100, 42), (120, 42)]
        );
        assert!(a.resolve(&user_stack(9, 0, 200, 1)).is_empty());
        let rest = a.give_up();
        let mut rest: Vec<(u32, u64, i64)> =
            rest.iter().map(|r| (r.tid, r.ts, r.stack_id)).collect();
        rest.sort();
        assert_eq!(
            rest,
            vec![(7, 10, USER_STACK_UNSEEN), (8, 110, USER_STACK_UNSEEN)]
        );
        assert_eq!((a.resolved, a.unseen), (2, 2));
        // What the trace says of them.
        let name = |id| {
            crate::perfetto::fault_samples::stack_not_taken("[user stack not taken", id)
                .function
                .unwrap()
        };
        assert!(name(USER_STACK_UNSEEN).contains("had not run again"));
        assert!(a.give_up().is_empty());
    }
}
