//! On-CPU time as the kernel charges it: a spinner pinned beside a
//! frequent waker on the same CPU, against its own sum_exec_runtime in
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

pub fn check(mut acc: Accounting) {
    let mut spinner = Workload::spawn(&["pinned-spin", "1", "2000"]);
    let mut waker = Workload::spawn(&["pinned-waker", "1", "10"]);
    spinner.expect("ready");
    waker.expect("ready");
    waker.go();
    let pid = spinner.pid();
    wait_blocked(pid);
    let stat0 = proc_stat::ProcStat::read();
    let (kernel0, ours0) = (schedstat(pid).0, super::task(&mut acc, pid).oncpu_ns);
    spinner.go();
    spinner.expect("done");
    wait_blocked(pid);
    let (kernel1, ours1) = (schedstat(pid).0, super::task(&mut acc, pid).oncpu_ns);
    let excluded_ns = stat0.excluded_ns_since(Some(1));
    waker.finish();
    let snap = acc.read().expect("reading maps");
    let (kernel_ns, ours_ns) = ((kernel1 - kernel0) as f64, (ours1 - ours0) as f64);
    eprintln!(
        "spinner beside a 10 us waker on CPU 1: eBPF {ours_ns} ns, sum_exec_runtime \
         {kernel_ns} ns ({:+.2} %); CPU 1 irq+softirq+steal at most {excluded_ns} ns; \
         oncpu_wall_clock {}, switch_missed {}",
        (ours_ns / kernel_ns - 1.0) * 100.0,
        snap.drops[drop_reason::ONCPU_WALL_CLOCK as usize],
        snap.drops[drop_reason::SWITCH_MISSED as usize],
    );
    assert_within_pct(
        "spinner on-CPU time vs schedstat sum_exec_runtime",
        ours_ns,
        kernel_ns,
        1.0,
    );
    spinner.finish();
}
