//! The sweep against fake /proc trees: which slots it frees, and when.

use super::*;

const HZ: u64 = 100;
const S: u64 = 1_000_000_000;

/// A /proc with tasks `(tid, starttime_ticks)`.
fn fake_proc(tasks: &[(u32, u64)]) -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    for &(tid, start) in tasks {
        let dir = root.path().join(tid.to_string());
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("stat"),
            format!(
                "{tid} (w) S 1 {tid} {tid} 0 -1 4194560 10 0 0 0 1 2 0 0 20 0 1 0 {start} 1 1\n"
            ),
        )
        .unwrap();
    }
    root
}

fn slot(born_ns: u64) -> TaskRecord {
    TaskRecord {
        born_ns,
        tgid: 1,
        ..Default::default()
    }
}

#[test]
fn nothing_is_swept_while_the_kernel_counts_no_missed_free() {
    // 200 is gone from /proc, but free_missed stays 0: no sweep at all.
    let proc = fake_proc(&[(100, 50)]);
    let mut sweep = StaleSweep::new(proc.path(), HZ);
    let tasks = HashMap::from([(100, slot(10 * S)), (200, slot(10 * S))]);
    for now in [20 * S, 30 * S, 90 * S] {
        assert!(sweep.stale(&tasks, Some(0), now, 0).is_empty());
    }
}

#[test]
fn a_gone_tid_is_freed_once_it_stayed_gone() {
    let proc = fake_proc(&[(100, 50)]);
    let mut sweep = StaleSweep::new(proc.path(), HZ);
    let tasks = HashMap::from([(100, slot(10 * S)), (200, slot(10 * S))]);
    // The miss is counted: 200 becomes a suspect, not yet stale (its free
    // may be an RCU grace period away).
    assert!(sweep.stale(&tasks, Some(1), 20 * S, 0).is_empty());
    assert!(sweep.stale(&tasks, Some(1), 21 * S, 0).is_empty());
    assert_eq!(sweep.stale(&tasks, Some(1), 22 * S, 0), vec![200]);
    // Taken once; 100, alive in /proc, never.
    assert!(sweep.stale(&tasks, Some(1), 30 * S, 0).is_empty());
}

#[test]
fn a_suspect_freed_by_the_kernel_meanwhile_is_dropped() {
    let proc = fake_proc(&[]);
    let mut sweep = StaleSweep::new(proc.path(), HZ);
    assert!(sweep
        .stale(&HashMap::from([(200, slot(10 * S))]), Some(1), 20 * S, 0)
        .is_empty());
    // The late free ran: the slot is gone. A new task stamped tid 200
    // since (a new born_ns) is not the suspect either.
    assert!(sweep.stale(&HashMap::new(), Some(1), 21 * S, 0).is_empty());
    let again = HashMap::from([(200, slot(25 * S))]);
    assert!(sweep.stale(&again, Some(1), 30 * S, 0).is_empty());
}

#[test]
fn a_tid_reused_after_the_stamp_is_stale_at_once() {
    // Stamped at 10 s; tid 300's task now started at 15 s (1500 ticks).
    let proc = fake_proc(&[(300, 1500), (400, 1000)]);
    let mut sweep = StaleSweep::new(proc.path(), HZ);
    let tasks = HashMap::from([(300, slot(10 * S)), (400, slot(10 * S))]);
    // 400 started at exactly 10 s: its own slot.
    assert_eq!(sweep.stale(&tasks, Some(3), 20 * S, 0), vec![300]);
}

#[test]
fn time_suspended_since_the_stamp_is_no_reuse() {
    // Stamped at 10 s monotonic; the task started at 12 s boottime, of
    // which 5 s were spent suspended before it: its own slot.
    let proc = fake_proc(&[(300, 1200)]);
    let mut sweep = StaleSweep::new(proc.path(), HZ);
    let tasks = HashMap::from([(300, slot(10 * S))]);
    assert!(sweep.stale(&tasks, Some(1), 20 * S, 5 * S).is_empty());
}

#[test]
fn without_the_kernels_count_every_slot_is_checked_once_a_minute() {
    let proc = fake_proc(&[(300, 1500)]);
    let mut sweep = StaleSweep::new(proc.path(), HZ);
    let tasks = HashMap::from([(300, slot(10 * S))]);
    // The first a minute after the first read.
    assert!(sweep.stale(&tasks, None, 20 * S, 0).is_empty());
    assert!(sweep.stale(&tasks, None, 60 * S, 0).is_empty());
    assert_eq!(sweep.stale(&tasks, None, 80 * S, 0), vec![300]);
    // Not again before a minute has passed.
    assert!(sweep.stale(&tasks, None, 120 * S, 0).is_empty());
    assert_eq!(sweep.stale(&tasks, None, 140 * S, 0), vec![300]);
}

#[test]
fn an_unreadable_or_malformed_stat_keeps_the_slot() {
    let proc = fake_proc(&[]);
    let dir = proc.path().join("500");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("stat"), "garbage").unwrap();
    let mut sweep = StaleSweep::new(proc.path(), HZ);
    let tasks = HashMap::from([(500, slot(10 * S))]);
    assert!(sweep.stale(&tasks, Some(1), 20 * S, 0).is_empty());
    assert!(sweep.stale(&tasks, Some(2), 30 * S, 0).is_empty());
}

#[test]
fn misses_counted_soon_after_a_sweep_wait_for_the_next() {
    let proc = fake_proc(&[(300, 1500)]);
    let mut sweep = StaleSweep::new(proc.path(), HZ);
    let tasks = HashMap::from([(300, slot(10 * S)), (301, slot(10 * S))]);
    let reused = |s: &mut StaleSweep, missed, now| s.stale(&tasks, Some(missed), now, 0);
    assert_eq!(reused(&mut sweep, 1, 20 * S), vec![300]);
    // 300's slot is still read (the test keeps it): a new miss 5 s later
    // waits; 301 stays a suspect meanwhile and is freed once confirmed.
    assert_eq!(reused(&mut sweep, 2, 22 * S), vec![301]);
    assert!(reused(&mut sweep, 2, 25 * S).is_empty());
    assert_eq!(reused(&mut sweep, 2, 30 * S), vec![300]);
}
