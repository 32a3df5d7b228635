//! The procfs scheduler source against fake procfs trees.

use std::path::Path;

use super::*;
use crate::procfs::{
    parse_pid_stat,
    sampler::ProcessSample,
    testutil::{pid_stat_line, Task},
};

const HZ: u64 = 100;
const TICK_NS: u64 = 10_000_000;

/// One thread's files: schedstat and the status lines we read.
#[allow(clippy::too_many_arguments)]
fn write_thread(root: &Path, pid: u32, tid: u32, ns: u64, wait: u64, ins: u64, vol: u64, inv: u64) {
    let dir = root.join(format!("{pid}/task/{tid}"));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("schedstat"), format!("{ns} {wait} {ins}\n")).unwrap();
    std::fs::write(
        dir.join("status"),
        format!(
            "Name:\tt\nState:\tS (sleeping)\nvoluntary_ctxt_switches:\t{vol}\n\
             nonvoluntary_ctxt_switches:\t{inv}\n"
        ),
    )
    .unwrap();
}

fn remove_thread(root: &Path, pid: u32, tid: u32) {
    std::fs::remove_dir_all(root.join(format!("{pid}/task/{tid}"))).unwrap();
}

/// A sample holding one process whose stat says `cpu_ticks` and `threads`.
fn sample(pid: u32, cpu_ticks: u64, threads: u64, minflt: u64) -> Sample {
    let line = pid_stat_line(&Task {
        pid: pid as i32,
        comm: "app",
        minflt,
        majflt: 1,
        utime: cpu_ticks,
        stime: 0,
        starttime: 500,
    });
    let mut stat = parse_pid_stat(line.as_bytes()).unwrap();
    stat.num_threads = threads;
    Sample {
        processes: vec![ProcessSample {
            stat,
            status: None,
            cmdline: None,
        }],
        ..Sample::default()
    }
}

#[test]
fn threads_fold_into_their_process() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    write_thread(root, 10, 10, 30_000_000, 5_000, 4, 3, 0);
    write_thread(root, 10, 11, 12_000_000, 7_000, 9, 6, 3);
    let mut src = SchedProcfs::new(root, HZ);
    let rows = src.update(&sample(10, 4, 2, 77));
    assert_eq!(rows.len(), 1);
    let r = rows[0];
    assert_eq!(r.tgid, 10);
    assert_eq!(r.oncpu_ns, 42_000_000);
    assert_eq!(r.runq_wait_ns, 12_000);
    assert_eq!((r.voluntary_switches, r.involuntary_switches), (9, 3));
    assert_eq!((r.faults.minflt, r.faults.majflt), (77, 1));
    assert_eq!(r.live_threads, 2);
    // stat's 4 ticks (40 ms) are below the threads' 42 ms: nothing added.
    assert_eq!(src.stats.tick_precision_ns, 0);
}

/// A thread that exits keeps its last counters in the process, and what
/// the process's stat shows beyond every thread's counters (its unseen
/// end, a thread born and dead between scans) is added at tick precision.
#[test]
fn an_exited_thread_keeps_its_time_and_stat_fills_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    write_thread(root, 20, 20, 10_000_000, 0, 2, 2, 0);
    write_thread(root, 20, 21, 50_000_000, 1_000, 5, 5, 0);
    let mut src = SchedProcfs::new(root, HZ);
    src.update(&sample(20, 6, 2, 0));
    // Thread 21 ran 30 ms more after its last read, then exited; a thread
    // nobody saw ran 40 ms: the group's utime+stime is 13 ticks = 130 ms.
    remove_thread(root, 20, 21);
    let r = src.update(&sample(20, 13, 1, 0))[0];
    assert_eq!(r.exited_threads, 1);
    assert_eq!(r.live_threads, 1);
    assert_eq!(r.oncpu_ns, 13 * TICK_NS, "the process total is stat's");
    assert_eq!(src.stats.tick_precision_ns, 13 * TICK_NS - 60_000_000);
    assert_eq!(r.runq_wait_ns, 1_000, "the exited thread's wait is kept");
    assert_eq!(r.voluntary_switches, 7);
    // The total never goes back when the live thread moves under a tick.
    write_thread(root, 20, 20, 14_000_000, 0, 3, 3, 0);
    let r2 = src.update(&sample(20, 14, 1, 0))[0];
    assert!(r2.oncpu_ns >= r.oncpu_ns + 4_000_000);
    assert!(r2.oncpu_ns <= 14 * TICK_NS + 4_000_000);
}

/// Sub-tick work (stat does not move) is still read: a thread that sleeps
/// often uses under a tick, and its switches count.
#[test]
fn sub_tick_work_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    write_thread(root, 30, 30, 1_000_000, 0, 1, 1, 0);
    let mut src = SchedProcfs::new(root, HZ);
    src.update(&sample(30, 0, 1, 0));
    write_thread(root, 30, 30, 3_000_000, 0, 300, 300, 0);
    let r = src.update(&sample(30, 0, 1, 0))[0];
    assert_eq!(r.oncpu_ns, 3_000_000);
    assert_eq!(r.voluntary_switches, 300);
}

/// A process whose threads do not move is re-read after 1, 2, 4, then 8
/// scans; its sub-tick work shows at the next read, and a new tick in its
/// stat makes it read at once.
#[test]
fn a_quiet_process_backs_off_and_a_tick_wakes_it() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    write_thread(root, 31, 31, 1_000_000, 0, 1, 1, 0);
    let mut src = SchedProcfs::new(root, HZ);
    let mut reads = Vec::new();
    for _ in 0..16 {
        let before = src.stats.schedstat_reads;
        src.update(&sample(31, 0, 1, 0));
        reads.push(src.stats.schedstat_reads - before);
    }
    // Scans 1, 2 (quiet: 2 next), 4 (4 next), 8 (8 next), 16.
    let read_at: Vec<usize> = (0..16).filter(|&i| reads[i] == 1).map(|i| i + 1).collect();
    assert_eq!(read_at, vec![1, 2, 4, 8, 16]);
    assert_eq!(src.stats.deferred_processes, 11);
    // Sub-tick work: seen at the next due read, then read every scan.
    write_thread(root, 31, 31, 2_000_000, 0, 2, 2, 0);
    let skipped = src.update(&sample(31, 0, 1, 0))[0];
    assert_eq!(skipped.oncpu_ns, 1_000_000, "deferred, not lost");
    // A tick in stat reads it at once.
    let r = src.update(&sample(31, 1, 1, 0))[0];
    assert_eq!(
        r.oncpu_ns, 10_000_000,
        "2 ms from schedstat, the tick from stat"
    );
    assert_eq!(r.voluntary_switches, 2);
}

/// status is read only when the thread may have switched since: its
/// switch-ins moved, or it was on a CPU at the last read.
#[test]
fn status_is_read_only_after_a_switch() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    // Off a CPU: 4 switch-ins, 4 switch-outs.
    write_thread(root, 40, 40, 1_000_000, 0, 4, 3, 1);
    let mut src = SchedProcfs::new(root, HZ);
    src.update(&sample(40, 1, 1, 0));
    assert_eq!(src.stats.status_reads, 1);
    // Ran on without a switch (a spinner's time moves, pcount does not).
    write_thread(root, 40, 40, 30_000_000, 0, 4, 3, 1);
    src.update(&sample(40, 3, 1, 0));
    assert_eq!(src.stats.status_reads, 1, "no switch-in: status not read");
    // A switch-in: read.
    write_thread(root, 40, 40, 40_000_000, 0, 5, 4, 1);
    let r = src.update(&sample(40, 4, 1, 0))[0];
    assert_eq!(src.stats.status_reads, 2);
    assert_eq!(r.voluntary_switches, 4);
}

/// On a CPU at the last read (one more switch-in than switch-outs): the
/// next read checks status even though pcount did not move, so its
/// switch-out is not missed.
#[test]
fn a_running_thread_is_rechecked() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    write_thread(root, 41, 41, 1_000_000, 0, 5, 3, 1);
    let mut src = SchedProcfs::new(root, HZ);
    src.update(&sample(41, 1, 1, 0));
    write_thread(root, 41, 41, 2_000_000, 0, 5, 4, 1);
    let r = src.update(&sample(41, 2, 1, 0))[0];
    assert_eq!(src.stats.status_reads, 2);
    assert_eq!(r.voluntary_switches, 4);
}

#[test]
fn a_reused_tid_is_a_new_thread() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    write_thread(root, 50, 51, 80_000_000, 9_000, 10, 10, 0);
    write_thread(root, 50, 50, 0, 0, 1, 0, 0);
    let mut src = SchedProcfs::new(root, HZ);
    src.update(&sample(50, 8, 2, 0));
    write_thread(root, 50, 51, 2_000_000, 100, 1, 0, 0);
    let r = src.update(&sample(50, 9, 2, 0))[0];
    assert_eq!(src.stats.tid_reuse, 1);
    assert_eq!(r.exited_threads, 1);
    assert!(r.oncpu_ns >= 82_000_000, "old thread kept, new one added");
    assert_eq!(r.runq_wait_ns, 9_100);
}

#[test]
fn a_gone_process_ends_and_a_reused_pid_starts_afresh() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    write_thread(root, 60, 60, 5_000_000, 0, 1, 1, 0);
    let mut src = SchedProcfs::new(root, HZ);
    src.update(&sample(60, 0, 1, 0));
    let rows = src.update(&Sample::default());
    assert_eq!(rows.len(), 1);
    assert!(rows[0].ended);
    assert_eq!(rows[0].oncpu_ns, 5_000_000);
    // The same pid, another starttime: the old instance's final row, then
    // the new one's from its own counters.
    src.update(&sample(60, 0, 1, 0));
    let mut again = sample(60, 0, 1, 0);
    again.processes[0].stat.starttime_ticks = 900;
    write_thread(root, 60, 60, 1_000, 0, 1, 1, 0);
    let rows = src.update(&again);
    assert_eq!(rows.len(), 2);
    assert!(rows[0].ended && !rows[1].ended);
    assert_eq!(rows[1].oncpu_ns, 1_000);
}

/// Unreadable and malformed files are counted; the thread keeps its last
/// counters, and a process whose stat was unreadable is not ended.
#[test]
fn bad_files_are_counted_not_fatal() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    write_thread(root, 70, 70, 5_000_000, 0, 3, 3, 0);
    let mut src = SchedProcfs::new(root, HZ);
    src.update(&sample(70, 0, 1, 0));
    std::fs::write(root.join("70/task/70/schedstat"), "garbage\n").unwrap();
    let r = src.update(&sample(70, 1, 1, 0))[0];
    assert_eq!(src.stats.read_failures, 1);
    // A stale thread would make stat's tick look like a dead thread's
    // time: no reconciling until every thread is read afresh.
    assert_eq!(r.oncpu_ns, 5_000_000);
    assert_eq!(src.stats.tick_precision_ns, 0);
    assert_eq!(r.live_threads, 1);
    let unreadable = Sample {
        unreadable_pids: vec![70],
        ..Sample::default()
    };
    assert!(
        src.update(&unreadable).is_empty(),
        "alive, no row, not ended"
    );
}

/// A busy thread beside 20 quiet ones: the quiet ones back off, the busy
/// one is read every scan; when a deferred one starts running (the
/// process's stat gains more than the threads read explain) all are read
/// at once.
#[test]
fn quiet_threads_of_a_busy_process_back_off_until_stat_says_otherwise() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    for tid in 101..=120 {
        write_thread(root, 100, tid, 1_000_000, 0, 1, 1, 0);
    }
    let mut busy_ns = 10_000_000;
    write_thread(root, 100, 100, busy_ns, 0, 1, 1, 0);
    let mut src = SchedProcfs::new(root, HZ);
    let mut ticks = 3;
    src.update(&sample(100, ticks, 21, 0));
    let mut reads = Vec::new();
    for _ in 0..5 {
        busy_ns += 10_000_000;
        ticks += 1;
        write_thread(root, 100, 100, busy_ns, 0, 1, 1, 0);
        let before = src.stats.schedstat_reads;
        src.update(&sample(100, ticks, 21, 0));
        reads.push(src.stats.schedstat_reads - before);
    }
    // Scan 2 reads all (nothing deferred yet: each thread's backoff is 1),
    // then the quiet 20 wait 2 and 4 scans while the busy one is read.
    assert_eq!(reads, vec![21, 1, 21, 1, 1]);
    assert!(src.stats.deferred_threads > 0);
    // Thread 107 runs 50 ms: stat gains 6 ticks, the busy thread 10 ms.
    write_thread(root, 100, 107, 51_000_000, 0, 2, 2, 0);
    busy_ns += 10_000_000;
    write_thread(root, 100, 100, busy_ns, 0, 1, 1, 0);
    ticks += 6;
    let r = src.update(&sample(100, ticks, 21, 0))[0];
    assert_eq!(src.stats.escalated_reads, 1);
    assert_eq!(r.oncpu_ns, busy_ns + 19 * 1_000_000 + 51_000_000);
}
