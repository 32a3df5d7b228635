//! Off-CPU accounting (issue #24, part 1) against a workload whose blocks
//! in S and D, and who ends each, it knows: blocked time split by the
//! switch-out state, long blocks, and the (wakee, waker) pairs, on the
//! programs the kernel gets by default and on the classic ones. Blocked
//! time is bounded by the workload's timing of its calls and by the
//! kernel's own on-CPU and runqueue time of its thread (schedstat), which
//! every kernel of the matrix keeps (sum_block_runtime needs
//! CONFIG_SCHEDSTATS and its sysctl on, which not all have).

use std::{collections::HashMap, path::Path, time::Duration};

use vitals_common::{drop_reason, OffcpuCounters, WakerCounters, WakerKey};
use vitals_tests::{
    trace_processor::{kernel_stack_holds, readme_offcpu_query, stack_holds, Row, TraceProcessor},
    *,
};
use vitalsd::bpf::{
    Accounting, AccountingConfig, FaultSourceChoice, OffcpuSettings, SchedPrograms,
};

// A test target's root looks for modules beside it, hence the path.
#[path = "offcpu/capture_paths.rs"]
mod capture_paths;
use capture_paths::*;

/// Blocks of the workload: `N` of `LONG_MS` and `N` of `SHORT_MS` in S,
/// `N` of `LONG_MS` in D, and the stdin read of its go line (S), which
/// the test keeps blocked for at least `GO_MS`.
const N: u64 = 4;
const LONG_MS: u64 = 30;
const SHORT_MS: u64 = 1;
const GO_MS: u64 = 50;
const LONG_BLOCK_US: u32 = 20_000;

fn load(classic: bool) -> Accounting {
    load_with(classic, 4096)
}

fn load_with(classic: bool, max_waker_pairs: u32) -> Accounting {
    require_root();
    let acc = Accounting::load(&AccountingConfig {
        fault_source: FaultSourceChoice::Off,
        force_classic_tracepoints: classic,
        offcpu: Some(OffcpuSettings {
            long_block_us: LONG_BLOCK_US,
            max_waker_pairs,
        }),
        ..Default::default()
    })
    .expect("loading the accounting programs with off-CPU accounting");
    if classic {
        assert_eq!(acc.sched_programs(), SchedPrograms::Classic);
    } else if kernel_version() >= (5, 18) && Path::new("/sys/kernel/btf/vmlinux").exists() {
        // Where tp_btf is certain (sched_switch's 5.18 prototype); older
        // kernels of the matrix may get either kind, and each test here
        // must hold on whichever they get.
        assert_eq!(acc.sched_programs(), SchedPrograms::Btf);
    }
    eprintln!("sched programs: {:?}", acc.sched_programs());
    assert!(acc.offcpu().is_some());
    acc
}

struct Reading {
    offcpu: OffcpuCounters,
    wakers: HashMap<WakerKey, WakerCounters>,
    /// The kernel's own figures for the workload's main thread.
    sched: TaskSchedstat,
}

/// /proc/<pid>/task/<tid>/schedstat: on-CPU time (sum_exec_runtime) and
/// runqueue wait (sched_info.run_delay), ns.
#[derive(Debug, Clone, Copy)]
struct TaskSchedstat {
    oncpu_ns: u64,
    run_delay_ns: u64,
}

fn task_schedstat(pid: u32, tid: u32) -> TaskSchedstat {
    let s = procfs::process::Process::new(pid as i32)
        .and_then(|p| p.task_from_tid(tid as i32))
        .and_then(|t| t.schedstat())
        .unwrap_or_else(|e| panic!("/proc/{pid}/task/{tid}/schedstat: {e}"));
    TaskSchedstat {
        oncpu_ns: s.sum_exec_runtime,
        run_delay_ns: s.run_delay,
    }
}

fn read(acc: &mut Accounting, pid: u32) -> Reading {
    let snap = acc.read().expect("reading maps");
    Reading {
        offcpu: snap
            .tasks
            .get(&pid)
            .map(|t| t.widen().offcpu)
            .unwrap_or_default(),
        wakers: snap.wakers,
        // The workload's blocking calls are all on its main thread (tid = pid).
        sched: task_schedstat(pid, pid),
    }
}

fn pair(r: &Reading, wakee: u32, waker: u32) -> WakerCounters {
    let key = WakerKey {
        wakee_tgid: wakee,
        waker_tgid: waker,
    };
    r.wakers.get(&key).copied().unwrap_or_default()
}

fn check(mut acc: Accounting) {
    let _delayacct = DelayAcct::enable();
    let n = N.to_string();
    // The workload and its wakers (the helper, the vfork children) on one
    // CPU, so that each wakeup enqueues its wakee at once. A wakeup from
    // another CPU may be handed to the target CPU's IPI (TTWU_QUEUE's
    // wakelist), and its time in flight, from the sched_waking that ends
    // a block to the enqueue where run_delay begins, is in no kernel
    // figure: about 1 ms a wakeup in an arm64 TCG guest, which broke the
    // floor below by 12.6 ms.
    let mut w = Workload::spawn(&[
        "offcpu",
        &n,
        &LONG_MS.to_string(),
        &SHORT_MS.to_string(),
        "0",
    ]);
    let helper = w.read_numbers("ready helper")[0] as u32;
    let pid = w.pid();
    wait_blocked(pid);
    // The go line's block is then at least GO_MS long: a long block.
    std::thread::sleep(Duration::from_millis(GO_MS));
    let before = read(&mut acc, pid);
    w.go();
    // A read after each vfork as well: each read flips WAKERS' halves
    // (zeroing the one it folds), and the pairs must still come out
    // cumulative, whole and never going back.
    let mut last = before.wakers.clone();
    let vforks: Vec<u32> = (0..N)
        .map(|_| {
            let v = w.read_numbers("vfork")[0] as u32;
            let now = read(&mut acc, pid).wakers;
            for (k, c) in &last {
                let n = now.get(k).copied().unwrap_or_default();
                assert!(
                    n.wakeups >= c.wakeups && n.blocked_ns >= c.blocked_ns,
                    "pair {k:?} went back: {c:?} -> {n:?}"
                );
            }
            last = now;
            v
        })
        .collect();
    let blocking = w.read_numbers("blocking");
    assert_eq!(blocking.len() as u64, 1 + 3 * N, "{blocking:?}");
    let go_call_ns = blocking[0] as u64;
    // Each pipe read's time, then each vfork's.
    let calls_ns: Vec<u64> = blocking[1..].iter().map(|&c| c as u64).collect();
    let pipe_call_ns: u64 = calls_ns[..2 * N as usize].iter().sum();
    let d_call_ns: u64 = calls_ns[2 * N as usize..].iter().sum();
    w.expect("done");
    wait_blocked(pid);
    let after = read(&mut acc, pid);
    let (b, a) = (before.offcpu, after.offcpu);
    let me = std::process::id();

    // Who ended each block: the test (go line), the helper (2N pipe
    // writes), each vfork child once (its exit completes the vfork).
    assert_eq!(
        pair(&after, pid, me).wakeups - pair(&before, pid, me).wakeups,
        1,
        "go line"
    );
    assert_eq!(
        pair(&after, pid, helper).wakeups - pair(&before, pid, helper).wakeups,
        2 * N,
        "the helper's pipe writes"
    );
    for v in &vforks {
        assert_eq!(pair(&after, pid, *v).wakeups, 1, "vfork child {v}");
        assert_eq!(pair(&before, pid, *v).wakeups, 0, "vfork child {v}");
    }
    assert_eq!(
        a.wakeups - b.wakeups,
        3 * N + 1,
        "blocks ended: {b:?} -> {a:?}"
    );
    // Blocked time, split by who ended it.
    let s_ns = a.blocked_s_ns - b.blocked_s_ns;
    let d_ns = a.blocked_d_ns - b.blocked_d_ns;
    let helper_ns = pair(&after, pid, helper).blocked_ns - pair(&before, pid, helper).blocked_ns;
    let vfork_ns: u64 = vforks
        .iter()
        .map(|v| pair(&after, pid, *v).blocked_ns)
        .sum();
    let go_ns = pair(&after, pid, me).blocked_ns - pair(&before, pid, me).blocked_ns;
    assert_eq!(helper_ns + go_ns, s_ns, "S by waker");
    assert_eq!(vfork_ns, d_ns, "D by waker");

    // Each block lies inside the call the workload timed around it.
    let on_cpu_ns = after.sched.oncpu_ns - before.sched.oncpu_ns;
    let run_delay_ns = after.sched.run_delay_ns - before.sched.run_delay_ns;
    eprintln!(
        "go line {go_ns} ns (call {go_call_ns}), pipe reads {helper_ns} ns (calls \
         {pipe_call_ns}), vforks {d_ns} ns (calls {d_call_ns}); schedstat between the \
         reads: on-CPU {on_cpu_ns} ns, run_delay {run_delay_ns} ns"
    );
    assert!(
        go_ns <= go_call_ns,
        "go line {go_ns} ns > its call's {go_call_ns} ns"
    );
    assert!(
        helper_ns <= pipe_call_ns,
        "pipe reads {helper_ns} ns > the calls' {pipe_call_ns} ns"
    );
    assert!(d_ns <= d_call_ns, "D {d_ns} ns > the calls' {d_call_ns} ns");
    // And is all of it but the thread's time on a CPU or queued for one:
    // the pipe reads and vforks all ran between the two reads, while the
    // thread sat blocked before and after them, so the kernel's
    // sum_exec_runtime and run_delay deltas over that stretch hold every
    // bit of their calls' on-CPU and runqueue time (and more: the go
    // line's return, the workload's prints).
    let floor = (pipe_call_ns + d_call_ns).saturating_sub(on_cpu_ns + run_delay_ns);
    assert!(
        helper_ns + d_ns >= floor,
        "pipe reads and vforks blocked {} ns < their calls' {} ns - on-CPU {on_cpu_ns} ns \
         - run_delay {run_delay_ns} ns",
        helper_ns + d_ns,
        pipe_call_ns + d_call_ns
    );
    // Long blocks: the go line's (below), and one per call whose block
    // could reach LONG_BLOCK_US (a block lies inside its call), of which
    // those the floor's reasoning makes long for sure: their calls less
    // all the on-CPU and runqueue time of the stretch still reach it.
    // (Not exactly the N long reads and the N vforks: a 5.10 x86_64 guest
    // on a loaded host counted one block more.)
    let long_ns = u64::from(LONG_BLOCK_US) * 1000;
    let could = calls_ns.iter().filter(|&&c| c >= long_ns).count() as u64;
    let surely = calls_ns
        .iter()
        .filter(|&&c| c.saturating_sub(on_cpu_ns + run_delay_ns) >= long_ns)
        .count() as u64;
    let long_blocks = a.long_blocks - b.long_blocks;
    assert!(
        (1 + surely..=1 + could).contains(&long_blocks),
        "{long_blocks} blocks of at least {LONG_BLOCK_US} µs: the go line and between \
         {surely} and {could} calls ({calls_ns:?})"
    );
    // And at least the go line and the N vforks: each vfork child sleeps
    // LONG_MS (> LONG_BLOCK_US) while its parent waits in D.
    assert!(long_blocks > N, "{long_blocks} long blocks");
    // The go line's block began before the first read (wait_blocked saw
    // it), which the test then held GO_MS before writing the line.
    assert!(go_ns >= GO_MS * 1_000_000, "go line {go_ns} ns");
    // The workload's own sleeps, as a floor the machine cannot lower.
    assert!(
        s_ns >= (GO_MS + N * LONG_MS) * 1_000_000 * 9 / 10,
        "S {s_ns} ns"
    );
    assert!(d_ns >= N * LONG_MS * 1_000_000, "D {d_ns} ns");
    w.finish();
}

/// With the programs this kernel gets by default (tp_btf where it can).
#[test]
fn blocked_time_and_wakers_default_programs() {
    check(load(false));
}

#[test]
fn blocked_time_and_wakers_classic() {
    check(load(true));
}

/// More (wakee, waker) pairs than `max_waker_pairs` (the least the config
/// takes, 16): each of 48 vfork children wakes the workload once, a pair
/// of its own. The pairs that find no room, in a CPU's region of WAKERS or
/// in the daemon's totals, are counted in `waker_map_full`, the others
/// counted whole; none is lost uncounted.
#[test]
fn pairs_past_the_bound_are_counted_as_drops() {
    const MANY: u64 = 48;
    const MAX_PAIRS: u32 = 16;
    let mut acc = load_with(false, MAX_PAIRS);
    let full = |acc: &mut Accounting| {
        acc.read().expect("reading maps").drops[drop_reason::WAKER_MAP_FULL as usize]
    };
    let mut w = Workload::spawn(&["offcpu", &MANY.to_string(), "2", "1"]);
    w.read_numbers("ready helper");
    let pid = w.pid();
    wait_blocked(pid);
    let full_before = full(&mut acc);
    w.go();
    let vforks: Vec<u32> = (0..MANY)
        .map(|_| w.read_numbers("vfork")[0] as u32)
        .collect();
    w.read_numbers("blocking");
    w.expect("done");
    wait_blocked(pid);
    // Two reads: the first flips away from the half the workload's
    // wakeups went to, the second folds it (drops the totals had no room
    // for are counted at the fold).
    let _ = acc.read().expect("reading maps");
    let snap = acc.read().expect("reading maps");
    let dropped = snap.drops[drop_reason::WAKER_MAP_FULL as usize] - full_before;
    let mut counted = 0;
    for v in &vforks {
        let key = WakerKey {
            wakee_tgid: pid,
            waker_tgid: *v,
        };
        if let Some(c) = snap.wakers.get(&key) {
            assert_eq!(c.wakeups, 1, "vfork child {v}");
            counted += 1;
        }
    }
    eprintln!("{counted} of {MANY} vfork pairs counted, {dropped} wakeups dropped");
    assert!(
        snap.wakers.len() <= MAX_PAIRS as usize,
        "{}",
        snap.wakers.len()
    );
    assert!(counted < MANY, "all {MANY} pairs fit in {MAX_PAIRS}");
    assert!(
        counted + dropped >= MANY,
        "{counted} counted + {dropped} dropped < {MANY} vfork pairs"
    );
    w.finish();
}

/// The main thread of the workload blocks long 2N+1 times within a
/// second: a rule on its main thread's long blocks ("more than 2 in 1s")
/// fires a capture naming it, whose trace carries the off-CPU tracks;
/// meanwhile `top` shows the blocks in its columns and status the
/// helper among the main thread's wakers.
#[test]
fn a_rule_on_main_thread_long_blocks_fires_a_capture() {
    let d = vitals_tests::daemon::Daemon::start(
        r#"
[[rule]]
name = "main-thread-blocked"
metric = { kind = "main_thread_long_blocks", process = "vitals-workload" }
threshold = 2
window = "1s"
cooldown = "1h"
capture = { duration = "1s", sched = false }
"#,
    );
    let n = N.to_string();
    let mut w = Workload::spawn(&["offcpu", &n, &LONG_MS.to_string(), &SHORT_MS.to_string()]);
    let helper = w.read_numbers("ready helper")[0];
    let pid = w.pid() as u64;
    let pair = format!("{pid}<-{helper}.wakeups");
    let pair_seen = std::cell::Cell::new(0);
    // In history for a whole window before the blocks (a growth rule
    // compares the window's first sample with its last).
    std::thread::sleep(Duration::from_millis(1500));
    w.go();
    let top_row = std::cell::RefCell::new(None);
    let st = d.wait_status("the capture to be stored", Duration::from_secs(20), |st| {
        if let Some(n) = st["offcpu_wakers"][&pair].as_u64() {
            pair_seen.set(pair_seen.get().max(n));
        }
        if top_row.borrow().is_none() {
            let top = d.call(&vitalsd::control::Request::Top { n: 200 });
            *top_row.borrow_mut() = top["processes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| {
                    p["pid"].as_u64() == Some(pid) && p["offcpu"]["long_blocks"].as_u64() > Some(0)
                })
                .cloned();
        }
        st["store"]["captures"] == 1 && st["capture"].is_null()
    });
    assert_eq!(st["triggers_fired"], 1, "{st}");
    let list = d.list();
    let m = &list[0];
    assert_eq!(m["trigger"]["rule"], "main-thread-blocked");
    // On a failure, what the daemon saw: the entry, status (its top and
    // history) and its log.
    let seen = || format!("{m}\n{st}\n{}", d.log());
    assert_eq!(
        m["trigger"]["offender_pid"].as_u64(),
        Some(pid),
        "{}",
        seen()
    );
    let value = m["trigger"]["value"].as_f64().unwrap();
    assert!(
        value > 2.0 && value <= (2 * N + 1) as f64,
        "{value}: {}",
        seen()
    );
    // The helper wakes the main thread 2N times over about N x LONG_MS:
    // some 250 ms window has at least one of them.
    assert!(pair_seen.get() > 0, "status never showed {pair}");
    let row = top_row
        .into_inner()
        .expect("a top row with the workload's long blocks");
    assert!(
        row["offcpu"]["blocked_s_ms"].as_f64().unwrap() > 0.0,
        "{row}"
    );
    let path = d
        .store()
        .join(format!("{}.pftrace", m["id"].as_str().unwrap()));
    let t = decode_trace(&path);
    let names: Vec<&str> = t["track_descriptors"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|x| x["name"].as_str())
        .collect();
    for track in [
        "offcpu.blocked_s_ns",
        "offcpu.blocked_d_ns",
        "offcpu.long_blocks",
    ] {
        assert!(names.contains(&track), "no {track} track: {names:?}");
    }
}

/// Issue #24 part 3, in every cell of the kernel matrix: a `record
/// --offcpu-pid` capture (stacks only, no `--sched`) of the
/// `block-release` workload, imported by
/// trace_processor (through tests/python/trace_processor_query.py: on the
/// host, or from a guest over the decoder relay) and asked the README's
/// "blocks" query. Each round's block of the waiter thread is found,
/// ended by the releaser thread, with the waiting function on the blocked
/// stack and the releasing one on the waker's (user frames, from the
/// binaries' symbol tables). Kernel frames are named only where
/// /proc/kallsyms shows addresses to the recorder (kptr_restrict 0 here;
/// it keeps CAP_SYSLOG, so 1 would do too); otherwise they must say why.
#[test]
fn offcpu_capture_stacks_name_the_blocked_and_the_waking_function() {
    const ROUNDS: usize = 3;
    const SLEEP_MS: u64 = 50;
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("offcpu.pftrace");
    let mut w = Workload::spawn(&["block-release", &ROUNDS.to_string(), &SLEEP_MS.to_string()]);
    let tids = w.read_numbers("tids");
    let (waiter, releaser) = (tids[0], tids[1]);
    w.expect("ready");
    let pid = w.pid().to_string();
    let (printed, ran) = record_offcpu(&mut w, &trace, &["--offcpu-pid", &pid]);
    w.finish();
    let btf = assert_kernel_stack_taken_at_waking(&ran);
    // The waiter's user stacks come at its switch-ins where a switch-in
    // program attaches, else from the walk at each blocking switch-out.
    assert_user_stacks_path(btf, &ran, &printed, ROUNDS);

    let tp = TraceProcessor::through_python();
    let blocks = tp.query(&trace, &readme_offcpu_query("blocks"));
    // Without --sched the capture is offwaketime's job alone: the long
    // blocks, no timeline (trace_processor.rs's `--sched --offcpu-pid`
    // capture has both).
    let timeline = tp.query(&trace, "select count(*) as n from sched_slice");
    assert_eq!(timeline[0]["n"].as_i64(), Some(0), "{timeline:?}");
    let text = |r: &Row, k: &str| r[k].as_str().unwrap_or("").to_owned();
    let mine: Vec<&Row> = blocks
        .iter()
        .filter(|r| r["tid"].as_i64() == Some(waiter))
        .collect();
    assert_eq!(mine.len(), ROUNDS, "one block per round: {blocks:#?}");
    let kptr_restrict = std::fs::read_to_string("/proc/sys/kernel/kptr_restrict").unwrap();
    let kernel_symbols = kptr_restrict.trim() != "2";
    eprintln!(
        "kptr_restrict {}: kernel frames {}",
        kptr_restrict.trim(),
        if kernel_symbols { "named" } else { "hidden" }
    );
    for b in mine {
        assert_eq!(b["waker_tid"].as_i64(), Some(releaser), "{b:?}");
        assert_eq!(text(b, "waker"), "vitals-release", "{b:?}");
        let (blocked, waker) = (text(b, "blocked_stack"), text(b, "waker_stack"));
        assert!(
            stack_holds(&blocked, "vitals_wait_for_release") && blocked.contains("[off-cpu]"),
            "{b:?}"
        );
        assert!(
            stack_holds(&waker, "vitals_release_after_sleep") && waker.contains("[waker]"),
            "{b:?}"
        );
        // The kernel's side of both: the pipe's read and write.
        if kernel_symbols {
            assert!(kernel_stack_holds(&blocked, "pipe_read"), "{b:?}");
            assert!(kernel_stack_holds(&waker, "pipe_write"), "{b:?}");
        } else {
            assert!(blocked.contains("kptr_restrict"), "{b:?}");
        }
    }
}

/// A daemon's off-CPU capture holds only blocks that began after it
/// started. The daemon's always-on accounting times blocks all along, and
/// on tp_btf with a switch-in program the capture takes its blocks from
/// it (`CaptureControl::blocks_from_accounting`), so it must leave out
/// one already under way, as the switch-out path (which never saw that
/// block begin) does. The waiter is in read() before the capture is
/// asked for; its release ends that block during the capture; the next
/// block, wholly inside it, is there with its waker.
#[test]
fn a_daemon_capture_leaves_out_a_block_begun_before_it() {
    const RELEASE_MS: u64 = 100;
    // The daemon attaches a capture's sched_waking after dropping to
    // CAP_BPF and CAP_PERFMON; Debian's kernels default to
    // perf_event_paranoid 3, where their patch wants CAP_SYS_ADMIN for any
    // perf_event_open (README, "Privileges"). 2 is upstream's default.
    let paranoid = std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid").unwrap();
    let _sysctl = (paranoid.trim().parse::<i32>().unwrap() > 2)
        .then(|| vitals_tests::Sysctls::set(&[("/proc/sys/kernel/perf_event_paranoid", "2")]));
    let d = vitals_tests::daemon::Daemon::start("");
    let mut w = Workload::spawn(&["block-release", "2", &RELEASE_MS.to_string(), "gated"]);
    let tids = w.read_numbers("tids");
    let (waiter, releaser) = (tids[0], tids[1]);
    w.expect("ready");
    w.go();
    wait_blocked_in_read(w.pid() as i32, waiter as i32, None);
    let asked_ns = vitals_tests::boottime_ns();
    let reply = d.call(&vitalsd::control::Request::Capture {
        duration_s: 5.0,
        // A daemon's off-CPU capture has the timeline too.
        sched: true,
        faults: false,
        offcpu: Some(vitalsd::control::protocol::OffcpuAsk {
            pids: vec![w.pid()],
        }),
    });
    assert!(reply["error"].is_null(), "{reply}");
    d.wait_capture_recording();
    // Each line lets the releaser write once, RELEASE_MS later.
    w.go();
    w.go();
    w.expect("done");
    let done_ns = vitals_tests::boottime_ns();
    let (m, path) = d.stored_capture();
    let blocks = TraceProcessor::through_python().query(&path, &readme_offcpu_query("blocks"));
    let mine: Vec<&Row> = blocks
        .iter()
        .filter(|r| r["tid"].as_i64() == Some(waiter))
        .collect();
    assert_eq!(
        mine.len(),
        1,
        "only the block begun in the capture (asked at {asked_ns}): {blocks:#?}\n{m}\n{}",
        d.log()
    );
    let b = mine[0];
    let (ts, blocked_ns) = (b["ts"].as_i64().unwrap(), b["blocked_ns"].as_i64().unwrap());
    assert!(
        ts > asked_ns as i64,
        "a block from before the capture was asked for: {b:?}"
    );
    assert_eq!(b["waker_tid"].as_i64(), Some(releaser), "{b:?}");
    // Within the second release's period: it began when the waiter read
    // again after the first release (RELEASE_MS less however late the
    // waiter ran again, not at least RELEASE_MS) and ended before the
    // workload said "done"; at least the capture's long block.
    assert!(
        ts + blocked_ns <= done_ns as i64,
        "{b:?} ends after {done_ns}"
    );
    assert!(blocked_ns >= 16_000_000, "{b:?}");
    w.finish();
}

/// A thread blocked in S inside a page fault, not a syscall (a missing
/// page of a userfaultfd mapping, as ART's compaction blocks threads).
/// On tp_btf, where a switch-in program attaches, a long block's user
/// stack waits for the thread's switch-in (`offcpu_switch_in*` on
/// finish_task_switch), where its user registers are still those of the
/// fault: the stack names the faulting function, as the walk at the
/// switch-out does elsewhere, and never the stack of the syscall the
/// thread makes next (a deferral to the syscall's return would have
/// given that). Either way the waker is the filling thread, from the
/// function that filled the page.
#[test]
fn offcpu_capture_stacks_a_block_in_a_page_fault_at_the_faulting_function() {
    const ROUNDS: usize = 3;
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("uffd.pftrace");
    let mut w = Workload::spawn(&["uffd-block", &ROUNDS.to_string(), "50"]);
    let tids = w.read_numbers("tids");
    let (faulter, filler) = (tids[0], tids[1]);
    w.expect("ready");
    let pid = w.pid().to_string();
    let (printed, ran) = record_offcpu(&mut w, &trace, &["--offcpu-pid", &pid]);
    w.finish();
    let btf = assert_kernel_stack_taken_at_waking(&ran);
    assert_user_stacks_path(btf, &ran, &printed, ROUNDS);
    let tp = TraceProcessor::through_python();
    let blocks = tp.query(&trace, &readme_offcpu_query("blocks"));
    let text = |r: &Row, k: &str| r[k].as_str().unwrap_or("").to_owned();
    let mine: Vec<&Row> = blocks
        .iter()
        .filter(|r| r["tid"].as_i64() == Some(faulter))
        .collect();
    assert_eq!(
        mine.len(),
        ROUNDS,
        "one block per page: {blocks:#?}\n{printed}"
    );
    let kernel_symbols = std::fs::read_to_string("/proc/sys/kernel/kptr_restrict")
        .unwrap()
        .trim()
        != "2";
    for b in mine {
        assert_eq!(b["waker_tid"].as_i64(), Some(filler), "{b:?}");
        assert_eq!(text(b, "waker"), "vitals-filler", "{b:?}");
        let (blocked, waker) = (text(b, "blocked_stack"), text(b, "waker_stack"));
        // The fault's own stack, not a later syscall's (the faulting
        // thread calls getppid after each page) nor a "not taken" frame.
        assert!(stack_holds(&blocked, "vitals_fault_on_page"), "{b:?}");
        assert!(!blocked.contains("not taken"), "{b:?}");
        assert!(stack_holds(&waker, "vitals_fill_after_sleep"), "{b:?}");
        if kernel_symbols {
            assert!(kernel_stack_holds(&blocked, "handle_userfault"), "{b:?}");
        }
    }
}
