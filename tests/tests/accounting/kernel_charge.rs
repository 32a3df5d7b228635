//! On-CPU time as the kernel charges it: a spinner pinned beside a load
//! on the same CPU (a frequent waker, a timer storm, a loopback flood),
//! against its own sum_exec_runtime in
//! /proc/<pid>/schedstat over the same window. Wall time between switches
//! also counts the waker's timer interrupts (irq time, left out of
//! sum_exec_runtime with CONFIG_IRQ_TIME_ACCOUNTING) and steal time
//! (PARAVIRT_TIME_ACCOUNTING), and credits the stretch from a preempting
//! wakeup to the switch differently.

use std::time::{Duration, Instant};

use vitals_common::drop_reason;
use vitals_tests::*;
use vitalsd::bpf::Accounting;

/// Returns once `pid` is blocked (state S): its
/// switch-out has been charged, and a blocked task's schedstat figure is
/// exact (a running one's lags until the scheduler's next update_curr).
fn wait_blocked(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let state = procfs::process::Process::new(pid as i32)
            .and_then(|p| p.stat())
            .expect("/proc/<pid>/stat")
            .state;
        if state == 'S' {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "pid {pid} still in state {state}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A load sharing the spinner's CPU 1, started and ended by the test.
pub struct Load {
    pub what: &'static str,
    pub args: &'static [&'static str],
}

pub const FREQUENT_WAKER: Load = Load {
    what: "a 10 us waker",
    args: &["pinned-waker", "1", "10"],
};

/// Eight timerfds at 50 us, staggered: some 160k hrtimer interrupts and
/// wakeups a second on CPU 1.
pub const TIMER_STORM: Load = Load {
    what: "a timer storm",
    args: &["pinned-timers", "1", "8", "50"],
};

/// UDP over loopback sent and received on CPU 1: NET_RX softirq time
/// there (irq time that CONFIG_IRQ_TIME_ACCOUNTING leaves out of
/// sum_exec_runtime, charged to whichever task was running).
pub const LOOPBACK_FLOOD: Load = Load {
    what: "a loopback UDP flood",
    args: &["pinned-udp-flood", "1"],
};

/// Windows a check may take on this host: its untraced pid 1
/// (`untraced_pid1`) leaves a few switches a second unseen, and a slice
/// around one is charged by wall clock, which no program can avoid (a CI
/// run met +0.14 % with 3 misses in the window; most windows here have
/// misses elsewhere and read +0.00 %). A window off by more than the
/// tolerance *and* with misses is measured again; a stock kernel traces
/// every switch, and its first window counts.
const ATTEMPTS_ON_UNTRACED_HOSTS: u32 = 3;
const TOLERANCE_PCT: f64 = 0.1;

pub fn check(mut acc: Accounting, load: Load) {
    let attempts = if untraced_pid1() {
        ATTEMPTS_ON_UNTRACED_HOSTS
    } else {
        1
    };
    for attempt in 1..=attempts {
        let (ours_ns, kernel_ns, unseen) = measure(&mut acc, &load);
        let off_pct = (ours_ns / kernel_ns - 1.0).abs() * 100.0;
        if off_pct > TOLERANCE_PCT && unseen > 0 && attempt < attempts {
            eprintln!(
                "window {attempt}: {unseen} switches unseen or charged by wall clock \
                 (this host's untraced pid 1); measuring again"
            );
            continue;
        }
        // The sum of the kernel's own charges, slice by slice: equal to
        // the ns here. Wall time between switches (the classic programs)
        // read +0.5 % beside the timer storm and +0.8 % beside the
        // loopback flood on this host, and fails this.
        assert_within_pct(
            &format!(
                "spinner beside {}: on-CPU time vs schedstat sum_exec_runtime",
                load.what
            ),
            ours_ns,
            kernel_ns,
            TOLERANCE_PCT,
        );
        return;
    }
}

/// One window: the spinner's on-CPU time by our counters and by its
/// schedstat, and how many switches the programs missed or charged by
/// wall clock meanwhile (anywhere: the counters are per machine).
fn measure(acc: &mut Accounting, load: &Load) -> (f64, f64, u64) {
    let unseen_now = |acc: &mut Accounting| {
        let d = acc.read().expect("reading maps").drops;
        d[drop_reason::ONCPU_WALL_CLOCK as usize] + d[drop_reason::SWITCH_MISSED as usize]
    };
    let mut spinner = Workload::spawn(&["pinned-spin", "1", "2000"]);
    let mut other = Workload::spawn(load.args);
    spinner.expect("ready");
    other.expect("ready");
    other.go();
    let pid = spinner.pid();
    wait_blocked(pid);
    let stat0 = proc_stat::ProcStat::read();
    let unseen0 = unseen_now(acc);
    let (kernel0, ours0) = (schedstat(pid).0, super::task(acc, pid).oncpu_ns);
    spinner.go();
    spinner.expect("done");
    wait_blocked(pid);
    let (kernel1, ours1) = (schedstat(pid).0, super::task(acc, pid).oncpu_ns);
    let unseen = unseen_now(acc) - unseen0;
    let excluded_ns = stat0.excluded_ns_since(Some(1));
    // Ended (its process group, from Workload's drop too) before the
    // assertions, so a failure leaves nothing running.
    other.finish();
    let snap = acc.read().expect("reading maps");
    let (kernel_ns, ours_ns) = ((kernel1 - kernel0) as f64, (ours1 - ours0) as f64);
    eprintln!(
        "spinner beside {} on CPU 1: eBPF {ours_ns} ns, sum_exec_runtime \
         {kernel_ns} ns ({:+.2} %); CPU 1 irq+softirq+steal at most {excluded_ns} ns; \
         oncpu_wall_clock {}, switch_missed {} ({unseen} in the window)",
        load.what,
        (ours_ns / kernel_ns - 1.0) * 100.0,
        snap.drops[drop_reason::ONCPU_WALL_CLOCK as usize],
        snap.drops[drop_reason::SWITCH_MISSED as usize],
    );
    spinner.finish();
    (ours_ns, kernel_ns, unseen)
}
