use std::collections::HashMap;

use super::*;

use crate::bpf::totals::ProcessCounters;

fn row(tgid: u32, oncpu_ns: u64, vol: u64) -> ProcessCounters {
    ProcessCounters {
        tgid,
        oncpu_ns,
        voluntary_switches: vol,
        ..Default::default()
    }
}

#[test]
fn first_sight_baseline_then_deltas_and_backwards_dropped() {
    let mut prev = HashMap::new();
    let mut drops = DropCounters::default();
    assert!(bpf_deltas(&mut prev, &[row(1, 100, 1)], &mut drops).is_empty());
    let d = bpf_deltas(&mut prev, &[row(1, 350, 4), row(2, 10, 0)], &mut drops);
    assert_eq!(d.len(), 1);
    assert_eq!(
        (d[0].tgid, d[0].oncpu_ns, d[0].voluntary_switches),
        (1, 250, 3)
    );
    let d = bpf_deltas(&mut prev, &[row(1, 300, 4), row(2, 30, 0)], &mut drops);
    assert_eq!(d.len(), 1, "tgid 1 went backwards: dropped, not clamped");
    assert_eq!((d[0].tgid, d[0].oncpu_ns), (2, 20));
    assert_eq!(drops.negative_deltas, 1);
}

#[test]
fn ended_process_is_forgotten() {
    let mut prev = HashMap::new();
    let mut drops = DropCounters::default();
    bpf_deltas(&mut prev, &[row(5, 100, 0)], &mut drops);
    let mut last = row(5, 150, 0);
    last.ended = true;
    assert_eq!(bpf_deltas(&mut prev, &[last], &mut drops)[0].oncpu_ns, 50);
    // A new process reusing tgid 5 starts from its own zero.
    assert!(bpf_deltas(&mut prev, &[row(5, 7, 0)], &mut drops).is_empty());
    assert_eq!(drops.negative_deltas, 0);
}

#[test]
fn deltas_window_runs_from_the_last_read_that_succeeded() {
    let mut deltas = CounterDeltas::default();
    let mut tick = Tick {
        rows: vec![row(1, 100, 0)],
        ..Default::default()
    };
    deltas.update(&mut tick, 1_000_000_000);
    assert_eq!(
        tick.deltas_window_ns, None,
        "no window before a second read"
    );
    // A failed read in between calls no update: the window spans it.
    tick.rows = vec![row(1, 600_000_000, 0)];
    deltas.update(&mut tick, 1_750_000_000);
    assert_eq!(tick.deltas_window_ns, Some(750_000_000));
    assert_eq!(tick.deltas[&1].oncpu_ns, 599_999_900);
}
