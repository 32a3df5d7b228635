//! Wakeup-to-run wait of a nice-19 sleeper sharing CPU 0 with a spinner,
//! against the kernel's schedstat run_delay (tp_btf, which charges it) or
//! bpftrace's timing of the same interval (the classic wakeup programs);
//! see `wakeup_wait_is_the_kernels_run_delay_on_tp_btf` in accounting.rs.

use vitals_tests::*;
use vitalsd::bpf::Accounting;

use super::task;

pub fn check(mut acc: Accounting) {
    let mut spinner = Workload::spawn(&["pinned-spin", "0", "1500"]);
    spinner.expect("ready");
    let mut sleeper = Workload::spawn(&["pinned-sleep", "0", "300", "2", "19"]);
    sleeper.expect("ready");
    let pid = sleeper.pid();
    let script = format!(
        "tracepoint:sched:sched_wakeup,tracepoint:sched:sched_wakeup_new /args->pid == {pid}/ {{ @w = nsecs; }}
         tracepoint:sched:sched_switch /args->prev_pid == {pid} && (args->prev_state & 0xff) == 0/ {{ @w = nsecs; }}
         tracepoint:sched:sched_switch /args->next_pid == {pid}/ {{ if (@w > 0) {{ @sum += nsecs - @w; }} @w = 0; }}
         END {{ printf(\"WAIT_NS %d\\n\", @sum); clear(@w); clear(@sum); }}"
    );
    let bt = Bpftrace::start(&script);
    let t0 = task(&mut acc, pid);
    let run_delay0 = schedstat(pid).1;
    spinner.go();
    sleeper.go();
    sleeper.expect("done");
    // Blocked on its stdin again, its switch-out done (see run_delay.rs).
    std::thread::sleep(std::time::Duration::from_millis(20));
    let t1 = task(&mut acc, pid);
    let run_delay_ns = (schedstat(pid).1 - run_delay0) as f64;
    let out = bt.stop();
    let bt_wait: f64 = out
        .lines()
        .find_map(|l| l.strip_prefix("WAIT_NS "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no WAIT_NS in bpftrace output: {out}"));
    let bpf_wait = (t1.runq_wait_ns - t0.runq_wait_ns) as f64;
    assert!(bt_wait > 0.0, "bpftrace saw no wait");
    assert!(t1.voluntary_switches - t0.voluntary_switches >= 300);
    eprintln!(
        "sleeper's runqueue wait: ours {bpf_wait} ns, bpftrace {bt_wait} ns, \
         schedstat run_delay {run_delay_ns} ns"
    );
    if acc.runq_wait_from_kernel() {
        assert_within_pct(
            "sleeper runqueue wait vs schedstat run_delay",
            bpf_wait,
            run_delay_ns,
            0.1,
        );
    } else {
        assert_within_pct("sleeper runqueue wait vs bpftrace", bpf_wait, bt_wait, 10.0);
    }
    spinner.expect("done");
    sleeper.finish();
    spinner.finish();
}
