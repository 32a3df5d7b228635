//! trace_processor is the judge (issue #13): every kind of trace vitalsd
//! writes (`record`, `record --sched`, `record --faults`, a service capture
//! and its `vitalsctl export`) is imported by trace_processor_shell, the
//! importer the Perfetto UI runs, and queried for what a user would see:
//! processes with their names, argv and counters, threads under the right
//! process, the CPU timeline with the thread states the kernel reported,
//! fault samples whose stacks resolve, and no import error.
//!
//! The finder (tests/src/trace_processor.rs) looks in `$TRACE_PROCESSOR_SHELL`,
//! then `../shared/tools/`, then the `perfetto` package's download; without
//! one every test here fails, naming the three. Each test asks for it first,
//! so that failure comes before any recording.
//!
//! Three tests hold defects known from review (each failed before its
//! fix):
//! - `threads_whose_tgid_was_never_seen_are_not_attached_to_pid_0`
//! - `a_pid_reused_within_one_recording_is_two_processes_each_with_its_own_tracks_and_row`
//! - `short_lived::short_lived_processes_are_named_in_the_table_and_in_the_process_table`
//! - `short_lived::every_process_with_counters_has_a_name_beside_short_lived_shells`

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    path::{Path, PathBuf},
    time::Duration,
};

use serde_json::Value;
use vitals_tests::{
    daemon::Daemon,
    ftrace::Ftrace,
    proc_stat::ProcStat,
    trace_processor::{
        kernel_stack_holds, trace_processor, Row, TraceProcessor, IMPORT_ERRORS_SQL,
    },
    *,
};
use vitalsd::control::Request;

// A test target's root looks for modules beside it, hence the paths.
#[path = "trace_processor/model.rs"]
mod model;
#[path = "trace_processor/offcpu.rs"]
mod offcpu;
#[path = "trace_processor/offcpu_rules.rs"]
mod offcpu_rules;
#[path = "trace_processor/process_model.rs"]
mod process_model;
#[path = "trace_processor/short_lived.rs"]
mod short_lived;
#[path = "trace_processor/synthetic_switch.rs"]
mod synthetic_switch;
#[path = "trace_processor/timeline.rs"]
mod timeline;

use model::*;
use offcpu::*;
use process_model::*;
use timeline::*;

// ---------------------------------------------------------------------------
// The trace kinds.

/// `record`: a counter track per process per counter, with name and unit,
/// equal to the printed table; processes with their name and argv; threads
/// under their process; SysStats as cpu.times.*; PSI and loadavg tracks.
#[test]
fn record_imports_with_counters_equal_to_the_table_and_named_processes() {
    let tp = trace_processor();
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("record.pftrace");
    let (stat_before, psi_before) = (ProcStat::read().per_cpu, psi_some_total_us("cpu"));
    let rec = Recording::start(
        &record_args(&trace, &["--duration", "3s"]),
        "eBPF accounting attached",
    );
    let mut w = Workload::spawn(&["spin", "1200"]);
    w.expect("ready");
    w.expect("done");
    let pid = w.pid();
    let table = rec.wait();
    let (stat_after, psi_after) = (ProcStat::read().per_cpu, psi_some_total_us("cpu"));
    w.finish();

    let t = Imported::new(&tp, &trace);
    print_ui_view(&t, "record", Some(pid));
    assert_import_errors(&t, "record", &[]);
    let wl = workload_bin();
    check_process(&t, pid, &[wl.to_str().unwrap(), "spin", "1200"]);
    check_threads(&t, Threads::MainOnly);
    check_counters_equal_table(&t, &table, pid);
    check_system_tracks(&t, &stat_before, &stat_after, psi_before, psi_after);
}

/// `record --sched`: the ping-pong as the CPU timeline shows it, every
/// switch a slice, no thread unknown or under pid 0.
#[test]
fn sched_capture_imports_as_a_cpu_timeline_with_the_kernels_thread_states() {
    let tp = trace_processor();
    const N: u64 = 3000;
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("sched.pftrace");
    let rec = Recording::start(
        &record_args(&trace, &["--duration", "4s", "--sched"]),
        "capture started",
    );
    let (mut w, tids) = Workload::spawn_ping_pong(N);
    w.go();
    let pp = finish_ping_pong(&mut w, tids);
    let table = rec.wait();
    w.finish();
    assert_eq!(capture_figure(&table, "sched"), 0, "records lost:\n{table}");
    // Switches the always-on programs found missing (prev not the CPU's
    // last next), for reading a thread-state mismatch below.
    eprintln!(
        "{}",
        table
            .lines()
            .find(|l| l.starts_with("map drops:"))
            .unwrap_or("no map drops line")
    );

    let t = Imported::new(&tp, &trace);
    print_ui_view(&t, "record --sched", Some(pp.pid));
    assert_import_errors(&t, "record --sched", &[]);
    check_threads(&t, Threads::Sched);
    check_ping_pong(&t, &pp, N, map_drop(&table, "switch_missed") as i64);
    check_counters_equal_table(&t, &table, pp.pid);
    // Every switch is a slice, but the first on each CPU: CompactSched
    // leaves its prev implicit, so trace_processor starts the timeline
    // there and counts it as compact_sched_switch_skipped (info). A switch
    // after an unseen one (this host's untraced pid 1) has a synthetic
    // switch to its real prev before it, one slice more each.
    let synthetic = table
        .lines()
        .find_map(|l| l.strip_prefix("switches after an unseen one: "))
        .and_then(|l| {
            l.split_once('(')?
                .1
                .split_whitespace()
                .next()?
                .parse::<i64>()
                .ok()
        })
        .unwrap_or_else(|| panic!("no count of synthetic switches in\n{table}"));
    let r = t.one(
        "select (select count(*) from sched_slice) as slices, \
                (select coalesce(sum(value), 0) from stats where name = 'compact_sched_switch_skipped') as skipped, \
                (select count(distinct cpu) from sched_slice) as cpus",
    );
    let switches = capture_figure(&table, "sched_switch") as i64;
    assert_eq!(
        int(&r, "slices") + int(&r, "skipped"),
        switches + synthetic,
        "slices + skipped vs the {switches} switches captured and {synthetic} synthetic: {r:?}"
    );
    assert!(int(&r, "skipped") <= int(&r, "cpus") + 1, "{r:?}");
}

/// `record --faults`: the samples' callsites resolve to the function that
/// faulted.
#[test]
fn fault_capture_samples_resolve_to_the_faulting_function() {
    let tp = trace_processor();
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("faults.pftrace");
    let rec = Recording::start(
        &record_args(
            &trace,
            &["--duration", "3s", "--faults", "--fault-period", "4"],
        ),
        "capture started",
    );
    let mut w = Workload::spawn(&["touch", "4000"]);
    w.expect("ready");
    w.go();
    w.expect("done");
    let pid = w.pid();
    // Alive until the recorder has symbolised.
    let table = rec.wait();
    w.finish();
    assert!(table.contains("fault samples"), "{table}");

    let t = Imported::new(&tp, &trace);
    print_ui_view(&t, "record --faults", Some(pid));
    assert_import_errors(&t, "record --faults", &[]);
    check_threads(&t, Threads::Samples);
    // 4000 faults at 1 in 4: about 1000 samples.
    check_fault_samples(&t, pid, 500);
    check_counters_equal_table(&t, &table, pid);
}

/// `record --offcpu-pid` (issue #24 part 2): a thread blocked in
/// `vitals_wait_for_release` on a pipe that a second thread writes from
/// `vitals_release_after_sleep` after sleeping SLEEP_MS, ROUNDS times.
/// The README's query finds every block with its waker, the blocked stack
/// in the waiting function and the waker's in the releasing one; the
/// blocked time is trace_processor's own S state of the thread (decoded
/// from the capture's sched records) and the sleep.
#[test]
fn offcpu_capture_shows_who_woke_the_blocked_thread_and_from_where() {
    const ROUNDS: usize = 5;
    const SLEEP_MS: i64 = 50;
    let tp = trace_processor();
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("offcpu.pftrace");
    let mut w = Workload::spawn(&["block-release", &ROUNDS.to_string(), &SLEEP_MS.to_string()]);
    let tids = w.read_numbers("tids");
    let (waiter, releaser) = (tids[0], tids[1]);
    w.expect("ready");
    let wpid = w.pid();
    let pid = wpid.to_string();
    let rec = Recording::start(
        &record_args(
            &trace,
            &["--duration", "3s", "--sched", "--offcpu-pid", &pid],
        ),
        "capture started",
    );
    w.go();
    w.expect("done");
    // Alive until the recorder has symbolised.
    let table = rec.wait();
    w.finish();

    let t = Imported::new(&tp, &trace);
    print_ui_view(&t, "record --offcpu-pid", Some(wpid));
    assert_import_errors(&t, "record --offcpu-pid", &[]);
    let all = blocks(&t);
    for b in &all {
        eprintln!("{b:?}");
    }
    let mine: Vec<&Block> = all.iter().filter(|b| b.tid == waiter).collect();
    assert_eq!(
        mine.len(),
        ROUNDS,
        "one long block per round: {mine:?}\n{table}"
    );
    let sleep_ns = SLEEP_MS * 1_000_000;
    let kptr_restrict = std::fs::read_to_string("/proc/sys/kernel/kptr_restrict").unwrap();
    let kptr_restrict = kptr_restrict.trim();
    let mut blocked: Vec<i64> = Vec::new();
    for b in &mine {
        assert_release_block(b, releaser, true);
        // The kernel's side of both (kallsyms readable without
        // CAP_SYSLOG only at kptr_restrict 0): the pipe's read and write.
        if kptr_restrict == "0" {
            assert!(kernel_stack_holds(&b.blocked_stack, "pipe_read"), "{b:?}");
            assert!(kernel_stack_holds(&b.waker_stack, "pipe_write"), "{b:?}");
        } else {
            assert!(b.blocked_stack.contains("kptr_restrict"), "{b:?}");
        }
        // The same sleep as trace_processor decodes it from the switch and
        // waking records: both ends read in the same program run as ours,
        // microseconds apart; 1 ms leaves room for an interrupt between.
        let (ts, dur, state) = thread_state_at(&t, waiter, b.ts);
        assert_eq!(state, "S", "{b:?}");
        assert!((ts - b.ts).abs() < 1_000_000, "{b:?} vs S at {ts}");
        assert!(
            (ts + dur - (b.ts + b.blocked_ns)).abs() < 1_000_000,
            "{b:?} vs S at {ts} for {dur}"
        );
        blocked.push(b.blocked_ns);
    }
    // The waiter blocks right after the releaser starts sleeping, and is
    // woken when the sleep (plus its 50 us timer slack) ends and the
    // releaser runs: the median block is the sleep, give or take the
    // waiter's own run between two reads and the wakeup latency of a
    // shared 2-CPU machine.
    blocked.sort_unstable();
    let median = blocked[ROUNDS / 2];
    assert!(
        median > sleep_ns - 2_000_000 && median < sleep_ns + 5_000_000,
        "median block {median} ns, sleep {sleep_ns} ns: {blocked:?}"
    );
    // The flamegraph's weight: one [off-cpu] sample per blocked ms.
    let kinds = sample_kinds(&t, &[waiter]);
    let weight: i64 = mine.iter().map(|b| b.blocked_ns / 1_000_000).sum();
    assert_eq!(kinds.get("off-cpu"), Some(&weight), "{kinds:?}");
    assert_eq!(kinds.get("fault"), None, "{kinds:?}");
    let kinds = sample_kinds(&t, &[releaser]);
    assert!(kinds.get("waker") >= Some(&(ROUNDS as i64)), "{kinds:?}");
}

/// A capture of the service (`vitalsd run`), stored, and exported with
/// `vitalsctl export`: the same model as `record`'s, plus the history
/// prelude.
#[test]
fn service_capture_and_its_export_import_like_a_recording() {
    let tp = trace_processor();
    const N: u64 = 2000;
    let mut d = Daemon::start("");
    // A few seconds of history (sampled every 250 ms) for the prelude.
    d.wait_status("history", Duration::from_secs(20), |st| {
        st["samples"].as_u64().unwrap_or(0) >= 8
    });
    let (stat_before, psi_before) = (ProcStat::read().per_cpu, psi_some_total_us("cpu"));
    let v = d.call(&Request::Capture {
        duration_s: 5.0,
        sched: true,
        faults: true,
        offcpu: None,
    });
    let id = v["id"].as_str().unwrap().to_owned();
    d.wait_status("the capture to run", Duration::from_secs(10), |st| {
        st["capture"]["id"] == id.as_str()
    });
    d.wait_capture_recording();
    let (mut pp, tids) = Workload::spawn_ping_pong(N);
    let mut touch = Workload::spawn(&["touch", "4000"]);
    touch.expect("ready");
    pp.go();
    touch.go();
    let ping_pong = finish_ping_pong(&mut pp, tids);
    touch.expect("done");
    let st = d.call(&Request::Status {});
    assert_eq!(
        st["capture"]["id"],
        id.as_str(),
        "the workloads outlasted the capture; it must hold them whole: {st}"
    );
    d.wait_status("the capture to be stored", Duration::from_secs(30), |st| {
        st["capture"].is_null() && st["store"]["newest"] == id.as_str()
    });
    let (stat_after, psi_after) = (ProcStat::read().per_cpu, psi_some_total_us("cpu"));
    let dir = tempfile::tempdir().unwrap();
    let exported = dir.path().join("exported.pftrace");
    let out = d.vitalsctl(&["export", &id, exported.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "vitalsctl export: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stored = d.store().join(format!("{id}.pftrace"));
    assert_eq!(
        std::fs::read(&exported).unwrap(),
        std::fs::read(&stored).unwrap(),
        "export is the stored capture"
    );
    let touch_pid = touch.pid();
    pp.finish();
    touch.finish();
    // The capture loads its own programs, which see the same switches as
    // the daemon's: the daemon's count bounds what the capture missed.
    let missed = d.call(&Request::Status {})["bpf_drops"]["switch_missed"]
        .as_i64()
        .unwrap_or(0);
    d.stop();

    let t = Imported::new(&tp, &exported);
    print_ui_view(&t, "service capture (vitalsctl export)", Some(touch_pid));
    assert_import_errors(&t, "service capture", &[]);
    check_threads(&t, Threads::Sched);
    let wl = workload_bin();
    check_process(
        &t,
        ping_pong.pid,
        &[wl.to_str().unwrap(), "pingpong", "2000"],
    );
    check_process(&t, touch_pid, &[wl.to_str().unwrap(), "touch", "4000"]);
    check_ping_pong(&t, &ping_pong, N, missed);
    // 4000 faults at the default 1 in 100.
    check_fault_samples(&t, touch_pid, 30);
    check_system_tracks(&t, &stat_before, &stat_after, psi_before, psi_after);
    // The process counters, as in `record` (no table to compare with here):
    // each of the ping-pong's switch counters holds at least what its two
    // threads counted.
    let counters = process_counters(&t);
    let instances = &counters[&ping_pong.pid];
    assert_eq!(instances.len(), 1, "{instances:?}");
    let tracks = &instances[0].1;
    let (vol, invol) = ping_pong
        .switches
        .values()
        .fold((0, 0), |(v, i), (a, b)| (v + a, i + b));
    assert!(
        tracks["voluntary_switches"].0 as i64 >= vol,
        "{tracks:?} vs {vol}"
    );
    assert!(
        tracks["involuntary_switches"].0 as i64 >= invol,
        "{tracks:?} vs {invol}"
    );
    assert_eq!(tracks["oncpu_ns"].1, "ns");
    // The history that led to the capture, under its own names.
    let h = t.one(
        "select count(*) as n from counter c join counter_track t on c.track_id = t.id \
         where t.name = 'history.cpu.local_busy_pct'",
    );
    assert!(int(&h, "n") >= 4, "history prelude missing: {h:?}");
}

/// A capture that loses records (a 4 KiB ring buffer under a switch storm)
/// declares it: trace_processor counts `ftrace_cpu_has_data_loss` for the
/// CPUs whose bundles carry `lost_events`, and nothing else.
///
/// Defect (issue #13, fixed): a thread seen in a switch or waking record
/// whose tgid never showed up (its switch-outs lost, or it exited before
/// the capture's last flush could read /proc/<tid>/status) is written in
/// ProcessTree without a tgid, and trace_processor reads the absent tgid as
/// 0: the thread lands under pid 0 (swapper).
#[test]
fn threads_whose_tgid_was_never_seen_are_not_attached_to_pid_0() {
    let tp = trace_processor();
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("lossy.pftrace");
    let rec = Recording::start(
        &record_args(
            &trace,
            &["--duration", "3s", "--sched", "--capture-buffer-kb", "4"],
        ),
        "capture started",
    );
    // Short-lived children, each seen switching in, while a ping-pong
    // floods the ring buffer.
    let (mut pp, tids) = Workload::spawn_ping_pong(20000);
    let mut kids = Workload::spawn(&["children", "300", "2"]);
    kids.expect("ready");
    pp.go();
    kids.go();
    let table = rec.wait();
    let _ = finish_ping_pong(&mut pp, tids);
    while kids.read_line() != "done" {}
    pp.finish();
    kids.finish();
    let lost = capture_figure(&table, "sched");
    assert!(lost > 0, "the 4 KiB buffer lost nothing:\n{table}");

    // The writer's side, decoded with the official schema: every thread it
    // names carries its process.
    let decoded = decode_trace(&trace);
    let orphans: Vec<&Value> = decoded["process_tree"]["threads"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|th| th["tgid"].is_null())
        .collect();

    let t = Imported::new(&tp, &trace);
    print_ui_view(&t, "record --sched, lossy", None);
    // The loss is declared per CPU (FtraceEventBundle.lost_events): expected.
    let errors = assert_import_errors(&t, "lossy record --sched", &["ftrace_cpu_has_data_loss"]);
    assert!(
        errors
            .iter()
            .any(|r| text(r, "name") == Some("ftrace_cpu_has_data_loss")),
        "the loss of {lost} records is not declared to trace_processor: {errors:?}"
    );
    assert!(
        orphans.is_empty(),
        "{} ProcessTree threads written without a tgid: {:?}",
        orphans.len(),
        &orphans[..orphans.len().min(10)]
    );
    check_threads(&t, Threads::Sched);
}

/// Defect (issue #13, fixed): a pid reused within one `record` kept the
/// dead process's identity: the new process got no ProcessTree entry of
/// its own and its counters went on the old process's tracks, and the
/// ended process's row was replaced by the new one's in the table.
#[test]
fn a_pid_reused_within_one_recording_is_two_processes_each_with_its_own_tracks_and_row() {
    let tp = trace_processor();
    let (_dir, trace, pid, table) = (0..3)
        .find_map(|_| record_pid_reuse())
        .expect("in 3 tries, a free of the reused pid ran while a thread of pid 1 was current");

    let rows: Vec<TableRow> = table_rows(&table)
        .into_iter()
        .filter(|r| r.pid == pid)
        .collect();
    eprintln!("table rows of pid {pid}: {rows:?}");
    let t = Imported::new(&tp, &trace);
    print_ui_view(&t, "record, pid reused", Some(pid));
    assert_import_errors(&t, "record (pid reuse)", &[]);
    let procs = t.q(&format!(
        "select upid, name, cmdline, start_ts, end_ts from process where pid = {pid} order by upid"
    ));
    eprintln!("trace_processor's processes with pid {pid}: {procs:?}");
    let counters = process_counters(&t);
    let instances = counters.get(&pid).cloned().unwrap_or_default();

    let mut names: Vec<&str> = rows.iter().map(|r| r.name.as_str()).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        vec!["vitals-reuse-a", "vitals-reuse-b"],
        "both instances of pid {pid} in the table:\n{table}"
    );
    assert!(rows.iter().all(|r| r.ended), "{rows:?}");
    let cmdlines: Vec<&str> = procs.iter().filter_map(|p| text(p, "cmdline")).collect();
    assert_eq!(
        cmdlines,
        vec![
            "vitals-reuse-a spin-exit 500",
            "vitals-reuse-b spin-exit 250"
        ],
        "two processes with pid {pid}, each with its argv: {procs:?}"
    );
    assert_eq!(
        instances.len(),
        2,
        "counter tracks of two processes: {instances:?}"
    );
    // Each instance's tracks equal its own row: A's under A's upid.
    for (p, (upid, tracks)) in procs.iter().zip(&instances) {
        assert_eq!(int(p, "upid"), *upid, "{procs:?} vs {instances:?}");
        let argv0 = text(p, "name").unwrap();
        let row = rows
            .iter()
            .find(|r| r.name == argv0)
            .unwrap_or_else(|| panic!("no table row for {argv0}: {rows:?}"));
        check_row_against_tracks(row, tracks);
    }
}

/// One recording of a pid used by process A, then by B: its directory,
/// trace, the pid and the table; None when a free of the pid ran where
/// no BPF program could see it.
fn record_pid_reuse() -> Option<(tempfile::TempDir, std::path::PathBuf, u32, String)> {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("reuse.pftrace");
    let frees = Ftrace::start("reuse-frees", &["sched/sched_process_free"]);
    let rec = Recording::start(
        &[
            "--duration",
            "60s",
            "--interval",
            "200ms",
            "--top",
            "0",
            "--out",
            trace.to_str().unwrap(),
        ],
        "eBPF accounting attached",
    );
    let mut w = Workload::spawn(&["reuse-pid", "500", "250"]);
    w.expect("ready");
    w.go();
    let pid = w.read_numbers("a")[0] as u32;
    // A's end (its free, an RCU grace period after its reaping) reaches
    // the recording in samples of its own (200 ms apart) before B starts.
    let freed = |n: usize| {
        let frees = frees.wait_for(Duration::from_secs(10), |f| {
            f.iter().filter(|&&p| p == pid).count() >= n
        });
        let seen = frees.iter().filter(|&&p| p == pid).count();
        assert!(
            seen >= n,
            "the kernel freed pid {pid} {seen} times in 10 s, not {n}"
        );
    };
    freed(1);
    std::thread::sleep(Duration::from_millis(600));
    w.go();
    w.expect(&format!("b {pid}"));
    w.expect("done");
    // B's free runs before the SIGINT, so before vitalsd's last read.
    freed(2);
    unsafe { libc::kill(rec.child.id() as i32, libc::SIGINT) };
    let table = rec.wait();
    w.finish();
    // A free that ran while a thread of pid 1 was current reached no BPF
    // program on this VM's kernel (README, Kernel support): A's counters
    // would not have ended, and B would go on from them. Not this test's
    // subject: the caller tries again.
    let unseen = frees.freed_under_pid1(&[pid]);
    if !unseen.is_empty() {
        eprintln!("pid {pid} was freed while a thread of pid 1 was current: trying again");
        return None;
    }
    Some((dir, trace, pid, table))
}
