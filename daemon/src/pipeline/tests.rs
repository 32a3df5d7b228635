use super::*;
use crate::sources::{
    ebpf::{top_columns, BpfDelta},
    tasks::{quiet_process_window, Tracker},
    Source,
};

/// A process charged no clock tick that still ran (ns accounting of
/// either tier says 3 ms) is in top; ProcessCpuTracker's working set
/// alone left a quiet machine's top empty (#23).
#[test]
fn top_lists_a_process_that_ran_without_a_tick() {
    let w = quiet_process_window(42);
    let tasks = Tracker::new(100);
    let top = |tick: &Tick| {
        top_rows(tick, &w, |task, row| {
            tasks.columns(tick, task, row);
            top_columns(tick, task, row);
        })
    };
    let mut tick = Tick::default();
    assert!(top(&tick).is_empty());
    tick.deltas.insert(
        42,
        BpfDelta {
            tgid: 42,
            oncpu_ns: 3_000_000,
            voluntary_switches: 40,
            ..Default::default()
        },
    );
    let rows = top(&tick);
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].pid, 42);
    assert_eq!(rows[0].name, "quiet");
    assert_eq!(rows[0].ebpf.as_ref().unwrap().voluntary_switches, 40);
}
