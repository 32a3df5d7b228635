//! Off-CPU stacks in the daemon's rule captures (issue #24 part 2): a
//! rule's `capture = { offcpu = true }` watches the process it fired for,
//! and `[capture] offcpu_watch` the processes it names. Each stored
//! capture, imported by trace_processor, has the watched workload's long
//! blocks with the blocked stack and the waker's (the README's query), and
//! no off-CPU sample of any other process, though trace_processor's own
//! thread states (decoded from the same capture's sched records) show an
//! unwatched workload blocked just as long meanwhile.

use super::*;
use vitals_tests::trace_processor::readme_offcpu_query;

const SLEEP_MS: i64 = 50;
/// Rounds of SLEEP_MS: long enough to outlast the rule's window and the
/// capture after it (the workloads are killed when the test ends).
const ROUNDS: &str = "400";

/// A `block-release` workload named `arg0` (argv[0], the name rules and
/// `offcpu_watch` match), running; (workload, waiter tid, releaser tid).
fn blocking(arg0: &str, main: bool) -> (Workload, i64, i64) {
    let ms = SLEEP_MS.to_string();
    let mut args = vec!["block-release", ROUNDS, &ms];
    if main {
        args.push("main");
    }
    let mut w = Workload::spawn_named(arg0, &args);
    let tids = w.read_numbers("tids");
    w.expect("ready");
    w.go();
    (w, tids[0], tids[1])
}

/// Waits for the daemon's one capture to be stored; its entry and the
/// trace imported.
fn stored_capture(d: &Daemon, tp: &TraceProcessor) -> (Value, Imported) {
    let (m, path) = d.stored_capture();
    let t = Imported::new(tp, &path);
    (m, t)
}

/// The watched waiter's blocks are there with both stacks, each the S
/// state trace_processor decodes from the sched records; no off-CPU
/// sample belongs to a process outside `watched`; the unwatched waiter
/// did block for at least a long block meanwhile (so leaving it out is
/// the watch's doing, not a quiet machine's). The wait for "go" may come
/// first, woken by the workload's main thread. `named`: the releaser is
/// named `vitals-release` in the trace (a thread that started during the
/// capture may keep its parent's comm from its first switches, which
/// trace_processor then shows; its tid is what identifies it).
fn assert_watched_only(
    t: &Imported,
    what: &str,
    (waiter, releaser, named): (i64, i64, bool),
    watched: &[u32],
    unwatched_waiter: i64,
) {
    assert_import_errors(t, what, &[]);
    let all = blocks(t);
    let mut mine: Vec<&Block> = all.iter().filter(|b| b.tid == waiter).collect();
    mine.sort_by_key(|b| b.ts);
    // Before the test's "go" the waiter waits at a barrier its main thread
    // (tid = pid) completes. A process the capture follows from between
    // its exec and its threads' start (a late joiner, found by the
    // daemon's scan in that window) has that wait as its first long
    // block, woken by the main thread: only the first may be one. (Its
    // user stack ends in glibc, which keeps no frame pointers, so the
    // stack cannot tell it.)
    if mine
        .first()
        .is_some_and(|b| watched.contains(&(b.waker_tid as u32)))
    {
        mine.remove(0);
    }
    assert!(!mine.is_empty(), "{what}: no block of {waiter}: {all:?}");
    for b in &mine {
        assert_release_block(b, releaser, named);
        let (ts, dur, state) = thread_state_at(t, waiter, b.ts);
        assert_eq!(state, "S", "{b:?}");
        assert!((ts - b.ts).abs() < 1_000_000, "{b:?} vs S at {ts}");
        assert!(
            (ts + dur - (b.ts + b.blocked_ns)).abs() < 1_000_000,
            "{b:?} vs S at {ts} for {dur}"
        );
    }
    // Every off-CPU sample (the blocked side of a block) by process.
    let watched_list: Vec<String> = watched.iter().map(u32::to_string).collect();
    let outside = t.q(&format!(
        "select p.pid, p.name, t.tid, count(*) as n from ({}) k \
         join perf_sample ps on ps.id = k.sample_id join thread t using(utid) \
         left join process p using(upid) \
         where k.kind = 'off-cpu' and (p.pid is null or p.pid not in ({})) group by 1, 2, 3",
        readme_offcpu_query("kinds"),
        watched_list.join(", ")
    ));
    assert!(
        outside.is_empty(),
        "{what}: off-CPU samples of unwatched processes: {outside:?}"
    );
    let unwatched_long = t.one(&format!(
        "select count(*) as n from thread_state s join thread using(utid) \
         where tid = {unwatched_waiter} and s.state = 'S' and s.dur >= 16000000"
    ));
    assert!(
        int(&unwatched_long, "n") > 0,
        "{what}: the unwatched waiter {unwatched_waiter} never blocked 16 ms in the capture"
    );
}

/// A rule on the main thread's long blocks of one workload, capturing
/// with `offcpu = true`, watches that workload (its offender) only.
#[test]
fn a_rules_offcpu_capture_watches_the_process_it_fired_for() {
    let tp = trace_processor();
    require_root();
    let d = Daemon::start(
        r#"
[[rule]]
name = "main-thread-blocked"
metric = { kind = "main_thread_long_blocks", process = "vitals-offcpu-rule" }
threshold = 2
window = "1s"
cooldown = "1h"
capture = { duration = "2s", offcpu = true }
"#,
    );
    let (other, other_waiter, _) = blocking("vitals-unwatched", false);
    let (w, waiter, releaser) = blocking("vitals-offcpu-rule", true);
    let pid = w.pid();
    assert_eq!(waiter, pid as i64, "the waiter is the main thread");
    let (m, t) = stored_capture(&d, &tp);
    assert_eq!(m["trigger"]["rule"], "main-thread-blocked", "{m}");
    assert_eq!(m["trigger"]["offender_pid"].as_u64(), Some(pid as u64));
    let notes = m["backend"]["notes"].to_string();
    assert!(notes.contains(&format!("off-cpu: pids [{pid}]")), "{m}");
    print_ui_view(&t, "rule offcpu capture", Some(pid));
    assert_watched_only(
        &t,
        "rule offcpu capture",
        (waiter, releaser, true),
        &[pid],
        other_waiter,
    );
    drop((w, other));
}

/// A system-wide rule has no offender: its `offcpu = true` capture
/// watches the processes `[capture] offcpu_watch` names, those running
/// when it starts and one started while it runs (from the daemon's next
/// scan on).
#[test]
fn a_system_rules_offcpu_capture_watches_the_configured_processes() {
    let tp = trace_processor();
    require_root();
    // Running before the daemon starts: names resolve as the capture does.
    let (other, other_waiter, _) = blocking("vitals-unwatched", false);
    let (w, waiter, releaser) = blocking("vitals-offcpu-list", false);
    let pid = w.pid();
    let d = Daemon::start(
        r#"
[capture]
offcpu_watch = ["vitals-offcpu-list"]

[[rule]]
name = "busy"
metric = { kind = "system_cpu_busy_pct" }
threshold = 0
window = "1s"
cooldown = "1h"
capture = { duration = "3s", offcpu = true }
"#,
    );
    d.wait_status("the capture to start", Duration::from_secs(30), |st| {
        !st["capture"].is_null()
    });
    let (late, late_waiter, late_releaser) = blocking("vitals-offcpu-list", false);
    let late_pid = late.pid();
    let (m, t) = stored_capture(&d, &tp);
    assert_eq!(m["trigger"]["rule"], "busy", "{m}");
    assert!(m["trigger"]["offender_pid"].is_null(), "{m}");
    let notes = m["backend"]["notes"].to_string();
    assert!(notes.contains(&format!("off-cpu: pids [{pid}]")), "{m}");
    print_ui_view(&t, "config-list offcpu capture", Some(pid));
    assert_watched_only(
        &t,
        "config-list offcpu capture",
        (waiter, releaser, true),
        &[pid, late_pid],
        other_waiter,
    );
    assert_watched_only(
        &t,
        "config-list offcpu capture, started during it",
        (late_waiter, late_releaser, false),
        &[pid, late_pid],
        other_waiter,
    );
    drop((w, other, late));
}

/// `vitalsctl capture --offcpu-pid <pid>` (the control request's `offcpu`)
/// watches that process; `--offcpu` with no pid and no
/// `capture.offcpu_watch` is refused with the reason, nothing stored.
#[test]
fn vitalsctl_capture_offcpu_pid_watches_that_process() {
    let tp = trace_processor();
    require_root();
    let d = Daemon::start("");
    let refused = d.vitalsctl(&["capture", "--offcpu", "--duration", "1s"]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    assert!(stderr.contains("no process to watch"), "{stderr}");
    let zero = d.vitalsctl(&["capture", "--offcpu-pid", "0", "--duration", "1s"]);
    let stderr = String::from_utf8_lossy(&zero.stderr);
    assert!(
        !zero.status.success() && stderr.contains("pid 0"),
        "{stderr}"
    );
    assert!(d.list().is_empty());

    let (other, other_waiter, _) = blocking("vitals-unwatched", false);
    let (w, waiter, releaser) = blocking("vitals-offcpu-ctl", false);
    let pid = w.pid();
    let out = d.vitalsctl(&[
        "capture",
        "--offcpu-pid",
        &pid.to_string(),
        "--duration",
        "2s",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (m, t) = stored_capture(&d, &tp);
    assert_eq!(m["trigger"]["rule"], "manual", "{m}");
    print_ui_view(&t, "vitalsctl offcpu capture", Some(pid));
    assert_watched_only(
        &t,
        "vitalsctl offcpu capture",
        (waiter, releaser, true),
        &[pid],
        other_waiter,
    );
    drop((w, other));
}
