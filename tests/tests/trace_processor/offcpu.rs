//! Checks of a `record --offcpu-pid` capture (issue #24 part 2): the
//! README's own queries, read from README.md so the documented query is
//! the one the test runs, find each long block of the `block-release`
//! workload with its waker and both stacks.

use super::*;
use vitals_tests::trace_processor::{readme_offcpu_query, stack_holds};

/// One row of the README's "blocks" query.
#[derive(Debug)]
pub struct Block {
    pub ts: i64,
    pub blocked_ns: i64,
    pub tid: i64,
    pub waker_tid: i64,
    pub waker: String,
    pub blocked_stack: String,
    pub waker_stack: String,
}

pub fn blocks(t: &Imported) -> Vec<Block> {
    t.q(&readme_offcpu_query("blocks"))
        .iter()
        .map(|r| Block {
            ts: int(r, "ts"),
            blocked_ns: int(r, "blocked_ns"),
            tid: int(r, "tid"),
            waker_tid: int(r, "waker_tid"),
            waker: text(r, "waker").unwrap_or("").to_owned(),
            blocked_stack: text(r, "blocked_stack").unwrap_or("").to_owned(),
            waker_stack: text(r, "waker_stack").unwrap_or("").to_owned(),
        })
        .collect()
}

/// A block of the `block-release` workload: woken by `releaser` (named
/// `vitals-release` where `named`), the blocked stack in the waiting
/// function under `[off-cpu]`, the waker's in the releasing one under
/// `[waker]`.
pub fn assert_release_block(b: &Block, releaser: i64, named: bool) {
    assert_eq!(b.waker_tid, releaser, "{b:?}");
    if named {
        assert_eq!(b.waker, "vitals-release", "{b:?}");
    }
    assert!(
        stack_holds(&b.blocked_stack, "vitals_wait_for_release")
            && b.blocked_stack.contains("[off-cpu]"),
        "{b:?}"
    );
    assert!(
        stack_holds(&b.waker_stack, "vitals_release_after_sleep")
            && b.waker_stack.contains("[waker]"),
        "{b:?}"
    );
}

/// trace_processor's own thread state of `tid` (from the same capture's
/// sched_switch and sched_waking records, an independent decoding of the
/// kernel's events) covering `ts`: (start, dur, state).
pub fn thread_state_at(t: &Imported, tid: i64, ts: i64) -> (i64, i64, String) {
    let rows = t.q(&format!(
        "select s.ts, s.dur, s.state from thread_state s join thread using(utid) \
         where tid = {tid} and s.ts <= {ts} + 1000000 and s.ts + s.dur > {ts} \
         and s.state in ('S', 'D') order by abs(s.ts - {ts}) limit 1"
    ));
    let Some(r) = rows.first() else {
        // What trace_processor has of the thread around it, for the
        // failure to say why.
        let around = t.q(&format!(
            "select s.ts, s.dur, s.state, s.utid, s.cpu from thread_state s \
             join thread using(utid) where tid = {tid} \
             and s.ts + s.dur > {ts} - 100000000 and s.ts < {ts} + 100000000 order by s.ts"
        ));
        let threads = t.q(&format!("select * from thread where tid = {tid}"));
        panic!(
            "no S or D thread state of {tid} at {ts}; its states within 100 ms: \
             {around:#?}; its thread rows: {threads:?}"
        );
    };
    (
        int(r, "ts"),
        int(r, "dur"),
        text(r, "state").unwrap_or("").to_owned(),
    )
}

/// Samples per kind (README's "kinds" query) of the threads `tids`.
pub fn sample_kinds(t: &Imported, tids: &[i64]) -> HashMap<String, i64> {
    let tids: Vec<String> = tids.iter().map(i64::to_string).collect();
    t.q(&format!(
        "select k.kind, count(*) as n from ({}) k join perf_sample ps on ps.id = k.sample_id \
         join thread using(utid) where tid in ({}) group by 1",
        readme_offcpu_query("kinds"),
        tids.join(", ")
    ))
    .iter()
    .map(|r| (text(r, "kind").unwrap().to_owned(), int(r, "n")))
    .collect()
}
