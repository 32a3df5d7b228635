//! Off-CPU accounting (issue #24, part 1) against a workload whose blocks
//! in S and D, and who ends each, it knows: blocked time split by the
//! switch-out state, long blocks, and the (wakee, waker) pairs, on the
//! tp_btf programs and the classic ones. This kernel has no
//! CONFIG_SCHEDSTATS (no sum_block_runtime); where it has, the per-task
//! `sched` file is read as a second reference.

use std::{collections::HashMap, time::Duration};

use vitals_common::{drop_reason, OffcpuCounters, WakerCounters, WakerKey};
use vitals_tests::*;
use vitalsd::bpf::{
    Accounting, AccountingConfig, FaultSourceChoice, OffcpuSettings, SchedPrograms,
};

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
    } else {
        assert_eq!(acc.sched_programs(), SchedPrograms::Btf);
    }
    assert!(acc.offcpu().is_some());
    acc
}

struct Reading {
    offcpu: OffcpuCounters,
    wakers: HashMap<WakerKey, WakerCounters>,
    /// /proc/<pid>/schedstat run_delay (ns).
    run_delay_ns: u64,
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
        run_delay_ns: schedstat(pid).1,
    }
}

fn pair(r: &Reading, wakee: u32, waker: u32) -> WakerCounters {
    let key = WakerKey {
        wakee_tgid: wakee,
        waker_tgid: waker,
    };
    r.wakers.get(&key).copied().unwrap_or_default()
}

/// Per block, what a blocking call costs besides the block itself
/// (syscall entry to switch-out, waking to return): generous, and not a
/// timing of the machine's load, which `run_delay` covers.
const CALL_OVERHEAD_NS: u64 = 1_000_000;

fn check(mut acc: Accounting) {
    let _delayacct = DelayAcct::enable();
    let n = N.to_string();
    let mut w = Workload::spawn(&["offcpu", &n, &LONG_MS.to_string(), &SHORT_MS.to_string()]);
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
    let (s_call_ns, d_call_ns) = (blocking[0] as u64, blocking[1] as u64);
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
    assert_eq!(
        a.long_blocks - b.long_blocks,
        2 * N + 1,
        "blocks of at least {LONG_BLOCK_US} µs: the go line, N pipe reads, N vforks"
    );

    // Blocked time: inside the calls the workload timed, and all of it
    // but their overhead and the runqueue wait after each wakeup.
    let s_ns = a.blocked_s_ns - b.blocked_s_ns;
    let d_ns = a.blocked_d_ns - b.blocked_d_ns;
    let run_delay_ns = after.run_delay_ns - before.run_delay_ns;
    eprintln!(
        "S {s_ns} ns (calls {s_call_ns}), D {d_ns} ns (calls {d_call_ns}), run_delay {run_delay_ns} ns"
    );
    assert!(s_ns <= s_call_ns, "S {s_ns} ns > the calls' {s_call_ns} ns");
    assert!(d_ns <= d_call_ns, "D {d_ns} ns > the calls' {d_call_ns} ns");
    let s_floor = s_call_ns.saturating_sub(run_delay_ns + (2 * N + 1) * CALL_OVERHEAD_NS);
    let d_floor = d_call_ns.saturating_sub(run_delay_ns + N * CALL_OVERHEAD_NS);
    assert!(s_ns >= s_floor, "S {s_ns} ns < {s_floor} ns");
    assert!(d_ns >= d_floor, "D {d_ns} ns < {d_floor} ns");
    // The workload's own sleeps, as a floor the machine cannot lower.
    assert!(
        s_ns >= (GO_MS + N * LONG_MS) * 1_000_000 * 9 / 10,
        "S {s_ns} ns"
    );
    assert!(d_ns >= N * LONG_MS * 1_000_000, "D {d_ns} ns");
    // The pairs' blocked time is the same time, split by waker.
    let helper_ns = pair(&after, pid, helper).blocked_ns - pair(&before, pid, helper).blocked_ns;
    let vfork_ns: u64 = vforks
        .iter()
        .map(|v| pair(&after, pid, *v).blocked_ns)
        .sum();
    let go_ns = pair(&after, pid, me).blocked_ns - pair(&before, pid, me).blocked_ns;
    assert_eq!(helper_ns + go_ns, s_ns, "S by waker");
    assert_eq!(vfork_ns, d_ns, "D by waker");
    w.finish();
}

#[test]
fn blocked_time_and_wakers_tp_btf() {
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
    assert_eq!(m["trigger"]["offender_pid"].as_u64(), Some(pid));
    let value = m["trigger"]["value"].as_f64().unwrap();
    assert!(value > 2.0 && value <= (2 * N + 1) as f64, "{value}");
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
