//! Per-CPU FtraceEventBundle with CompactSched, built from capture records.
//!
//! Pure (no I/O), so the encoding rules are unit-tested here:
//! - `switch_timestamp` / `waking_timestamp` are deltas against the previous
//!   event *of the same kind in the same bundle*; the first is absolute
//!   (relative to 0). trace_processor accumulates them per bundle.
//! - comms are interned per bundle: `intern_table` plus `*_comm_index`.
//! - `switch_prev_state` is the tracepoint's own value (TASK_REPORT bits,
//!   0x100 = preempted), which trace_processor decodes by the kernel release
//!   in SystemInfo.
//! - The prev pid/comm of a switch are implicit (the previous switch's next
//!   on that CPU), as in traced_probes' compact format. Where a switch went
//!   unseen between two recorded ones (a classic program's blind window, a
//!   lost record, a kernel that does not trace some task), the recorded
//!   prev is not the last next: trace_processor would then charge the
//!   switch-out (and its state) to the wrong thread, and the thread that
//!   really blocked would show no state at all. A synthetic switch to the
//!   real prev at the same instant goes first (`gaps`); the thread it
//!   replaces is shown preempted (R+), what it is in a blind window.

use std::collections::HashMap;

use vitals_common::fixed_layout::TASK_REPORT_MAX;
use vitals_proto::protos::{ftrace_event_bundle::CompactSched, FtraceEventBundle};

/// A task's comm as the kernel stores it (NUL-padded).
pub type Comm = [u8; 16];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SwitchRec {
    pub ts: u64,
    pub prev_pid: i32,
    pub prev_prio: i32,
    pub prev_state: i64,
    pub next_pid: i32,
    pub next_prio: i32,
    pub next_comm: Comm,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WakingRec {
    pub ts: u64,
    pub pid: i32,
    pub prio: i32,
    pub target_cpu: i32,
    pub comm: Comm,
}

/// One CPU's events since its last bundle, and the task the last bundle
/// left on it.
#[derive(Debug, Clone, Default)]
pub struct CpuEvents {
    pub switches: Vec<SwitchRec>,
    pub wakings: Vec<WakingRec>,
    /// The last written switch's next pid (kept by `clear`).
    pub last_next: Option<i32>,
    /// Switches written after an unseen one, and of those the ones a
    /// synthetic switch went before (the real prev's comm known).
    pub gaps: u64,
    pub synthetic: u64,
}

impl CpuEvents {
    pub fn is_empty(&self) -> bool {
        self.switches.is_empty() && self.wakings.is_empty()
    }

    /// Empties the events; `last_next` and `gaps` stay.
    pub fn clear(&mut self) {
        self.switches.clear();
        self.wakings.clear();
    }
}

/// The comm up to its first NUL, lossily as UTF-8.
pub fn comm_str(c: &Comm) -> String {
    let end = c.iter().position(|&b| b == 0).unwrap_or(c.len());
    String::from_utf8_lossy(&c[..end]).into_owned()
}

pub fn comm_from(s: &str) -> Comm {
    let mut c = [0u8; 16];
    let n = s.len().min(15);
    c[..n].copy_from_slice(&s.as_bytes()[..n]);
    c
}

#[derive(Default)]
struct Interner {
    index: HashMap<Comm, u32>,
    table: Vec<String>,
}

impl Interner {
    fn get(&mut self, c: &Comm) -> u32 {
        if let Some(&i) = self.index.get(c) {
            return i;
        }
        let i = self.table.len() as u32;
        self.table.push(comm_str(c));
        self.index.insert(*c, i);
        i
    }
}

/// Builds the bundle for `cpu`. Events are sorted by timestamp first (a
/// stable sort: records of one CPU already arrive in order, this only
/// guards the delta encoding, which cannot go negative). `comm_of` names
/// the real prev of a switch after a gap (None: no synthetic switch).
pub fn build_bundle(
    cpu: u32,
    ev: &mut CpuEvents,
    lost_events: bool,
    mut comm_of: impl FnMut(i32) -> Option<Comm>,
) -> FtraceEventBundle {
    ev.switches.sort_by_key(|s| s.ts);
    ev.wakings.sort_by_key(|w| w.ts);
    let mut cs = CompactSched::default();
    let mut interner = Interner::default();
    let mut prev = 0u64;
    let mut push =
        |cs: &mut CompactSched, ts: u64, state: i64, pid: i32, prio: i32, comm: &Comm| {
            cs.switch_timestamp.push(ts - prev);
            prev = ts;
            cs.switch_prev_state.push(state);
            cs.switch_next_pid.push(pid);
            cs.switch_next_prio.push(prio);
            cs.switch_next_comm_index.push(interner.get(comm));
        };
    let (mut last_next, mut gaps, mut synthetic) = (ev.last_next, 0, 0);
    for s in &ev.switches {
        if last_next.is_some_and(|n| n != s.prev_pid) {
            gaps += 1;
            if let Some(comm) = comm_of(s.prev_pid) {
                push(
                    &mut cs,
                    s.ts,
                    TASK_REPORT_MAX,
                    s.prev_pid,
                    s.prev_prio,
                    &comm,
                );
                synthetic += 1;
            }
        }
        push(
            &mut cs,
            s.ts,
            s.prev_state,
            s.next_pid,
            s.next_prio,
            &s.next_comm,
        );
        last_next = Some(s.next_pid);
    }
    ev.last_next = last_next;
    ev.gaps += gaps;
    ev.synthetic += synthetic;
    let mut prev = 0u64;
    for w in &ev.wakings {
        cs.waking_timestamp.push(w.ts - prev);
        prev = w.ts;
        cs.waking_pid.push(w.pid);
        cs.waking_target_cpu.push(w.target_cpu);
        cs.waking_prio.push(w.prio);
        cs.waking_comm_index.push(interner.get(&w.comm));
    }
    cs.intern_table = interner.table;
    FtraceEventBundle {
        cpu: Some(cpu),
        lost_events: lost_events.then_some(true),
        compact_sched: (!ev.is_empty()).then_some(cs),
        ..Default::default()
    }
}

/// Inverse of the timestamp encoding, for tests and tools.
pub fn decode_deltas(deltas: &[u64]) -> Vec<u64> {
    let mut acc = 0u64;
    deltas
        .iter()
        .map(|d| {
            acc = acc.wrapping_add(*d);
            acc
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use vitals_proto::Message;

    fn sw(ts: u64, next: i32, comm: &str, state: i64) -> SwitchRec {
        SwitchRec {
            ts,
            prev_pid: 1,
            prev_prio: 120,
            prev_state: state,
            next_pid: next,
            next_prio: 120,
            next_comm: comm_from(comm),
        }
    }

    #[test]
    fn timestamps_are_deltas_within_the_bundle_first_absolute() {
        let mut ev = CpuEvents {
            switches: vec![
                sw(1_000_000, 5, "a", 1),
                sw(1_000_100, 6, "b", 0x100),
                sw(1_000_350, 5, "a", 0),
            ],
            ..CpuEvents::default()
        };
        let b = build_bundle(3, &mut ev, false, |_| None);
        let cs = b.compact_sched.unwrap();
        assert_eq!(b.cpu, Some(3));
        assert_eq!(cs.switch_timestamp, vec![1_000_000, 100, 250]);
        assert_eq!(
            decode_deltas(&cs.switch_timestamp),
            vec![1_000_000, 1_000_100, 1_000_350]
        );
        assert_eq!(cs.switch_prev_state, vec![1, 0x100, 0]);
        assert_eq!(cs.switch_next_pid, vec![5, 6, 5]);
        assert_eq!(cs.intern_table, vec!["a".to_string(), "b".to_string()]);
        assert_eq!(cs.switch_next_comm_index, vec![0, 1, 0]);
        assert_eq!(b.lost_events, None);
    }

    #[test]
    fn out_of_order_records_are_sorted_and_wakings_have_their_own_base() {
        let mut ev = CpuEvents {
            switches: vec![sw(50, 2, "x", 1), sw(10, 3, "y", 1)],
            wakings: vec![WakingRec {
                ts: 30,
                pid: 9,
                prio: 100,
                target_cpu: 1,
                comm: comm_from("x"),
            }],
            ..CpuEvents::default()
        };
        let b = build_bundle(0, &mut ev, true, |_| None);
        let cs = b.compact_sched.unwrap();
        assert_eq!(cs.switch_timestamp, vec![10, 40]);
        assert_eq!(cs.waking_timestamp, vec![30]);
        assert_eq!(cs.waking_pid, vec![9]);
        assert_eq!(cs.waking_target_cpu, vec![1]);
        assert_eq!(cs.waking_prio, vec![100]);
        // "x" was interned by the switch; the waking reuses its index.
        assert_eq!(cs.intern_table[cs.waking_comm_index[0] as usize], "x");
        assert_eq!(cs.intern_table.len(), 2);
        assert_eq!(b.lost_events, Some(true));
    }

    /// A switch whose recorded prev is not the CPU's last next (one went
    /// unseen between them, here or across bundles) gets a synthetic switch
    /// to its real prev first, so trace_processor's implicit prev is right;
    /// without the prev's comm there is none, the gap still counted.
    #[test]
    fn a_switch_after_an_unseen_one_gets_its_real_prev_first() {
        let rec = |ts, prev_pid, next_pid, comm: &str| SwitchRec {
            ts,
            prev_pid,
            prev_prio: 110,
            prev_state: 1,
            next_pid,
            next_prio: 120,
            next_comm: comm_from(comm),
        };
        let mut ev = CpuEvents {
            switches: vec![rec(10, 0, 5, "a"), rec(20, 5, 6, "b")],
            ..CpuEvents::default()
        };
        let b = build_bundle(0, &mut ev, false, |_| None);
        assert_eq!(b.compact_sched.unwrap().switch_next_pid, vec![5, 6]);
        assert_eq!((ev.last_next, ev.gaps), (Some(6), 0));
        ev.clear();
        // 6 ran, then 7 unseen: 7 switches out (S) to 8.
        ev.switches.push(rec(40, 7, 8, "c"));
        let b = build_bundle(0, &mut ev, false, |pid| {
            (pid == 7).then(|| comm_from("seven"))
        });
        let cs = b.compact_sched.unwrap();
        assert_eq!(cs.switch_next_pid, vec![7, 8]);
        assert_eq!(cs.switch_prev_state, vec![TASK_REPORT_MAX, 1]);
        assert_eq!(decode_deltas(&cs.switch_timestamp), vec![40, 40]);
        assert_eq!(cs.switch_next_prio, vec![110, 120]);
        assert_eq!(
            cs.intern_table[cs.switch_next_comm_index[0] as usize],
            "seven"
        );
        assert_eq!((ev.last_next, ev.gaps, ev.synthetic), (Some(8), 1, 1));
        ev.clear();
        ev.switches.push(rec(50, 9, 8, "d"));
        let b = build_bundle(0, &mut ev, false, |_| None);
        assert_eq!(b.compact_sched.unwrap().switch_next_pid, vec![8]);
        assert_eq!((ev.gaps, ev.synthetic), (2, 1));
    }

    #[test]
    fn empty_bundle_only_reports_loss() {
        let b = build_bundle(1, &mut CpuEvents::default(), true, |_| None);
        assert!(b.compact_sched.is_none());
        assert_eq!(b.lost_events, Some(true));
    }

    #[test]
    fn comm_strings_stop_at_nul_and_full_width_is_kept() {
        assert_eq!(comm_str(&comm_from("kworker/0:1")), "kworker/0:1");
        let full = *b"0123456789abcdef";
        assert_eq!(comm_str(&full), "0123456789abcdef");
    }

    #[test]
    fn a_dense_switch_costs_few_bytes() {
        // 1000 switches 5 us apart between two tasks: the packed columns
        // must stay under 10 bytes per switch.
        let mut ev = CpuEvents::default();
        for i in 0..1000u64 {
            ev.switches
                .push(sw(1_000_000_000 + i * 5_000, 4000 + (i % 2) as i32, "t", 1));
        }
        let b = build_bundle(0, &mut ev, false, |_| None);
        let per = b.encoded_len() as f64 / 1000.0;
        assert!(per <= 10.0, "{per} bytes per switch");
    }
}
