//! Exec by a thread that is not its process's leader: de_thread()
//! (fs/exec.c, exchange_tids) gives that thread the leader's pid while it
//! is on the CPU, so sched_switch shows its switch-in under its own tid and
//! its switch-out under the leader's. That is no missed switch, and the
//! programs must not count one: the tp_btf program sees the same
//! task_struct, the classic ones follow the rename at sched_process_exec.
//! Before, each such exec counted one switch_missed. The kernel's /proc is
//! the witness that every exec ran in the original pid: the last image is
//! that pid's only task.

use std::time::Instant;

use vitals_common::drop_reason;
use vitals_tests::*;
use vitalsd::bpf::{Accounting, SchedPrograms};

const EXECS: u64 = 1000;

fn missed(acc: &mut Accounting) -> u64 {
    acc.read().expect("reading maps").drops[drop_reason::SWITCH_MISSED as usize]
}

pub fn check(mut acc: Accounting) {
    let btf = acc.sched_programs() == SchedPrograms::Btf;
    let mut w = Workload::spawn(&["exec-from-thread", &EXECS.to_string()]);
    w.expect("ready");
    let before = missed(&mut acc);
    let start = Instant::now();
    w.go();
    w.expect("done");
    let after = missed(&mut acc);
    let window = start.elapsed();
    // The background rate over a window as long, nothing of ours running.
    std::thread::sleep(window);
    let idle = missed(&mut acc) - after;
    assert_eq!(w.read_numbers("tid"), vec![w.pid() as i64]);
    let tasks: Vec<String> = std::fs::read_dir(format!("/proc/{}/task", w.pid()))
        .expect("reading the workload's /proc task dir")
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        tasks,
        vec![w.pid().to_string()],
        "the chain ended in its leader's pid"
    );
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", w.pid())).unwrap();
    assert!(
        String::from_utf8_lossy(&cmdline).ends_with("exec-from-thread-next\u{0}0\u{0}"),
        "the last image is the end of the chain: {cmdline:?}"
    );
    w.finish();
    let during = after - before;
    eprintln!(
        "{EXECS} execs from non-leader threads ({} programs) in {window:?}: switch_missed \
         {during}; {idle} in as long a window after",
        if btf { "tp_btf" } else { "classic" }
    );
    if btf && !untraced_pid1() {
        assert_eq!(during, 0, "{EXECS} execs counted {during} switch_missed");
    } else {
        // Misses that are not the execs' still count here: this host's
        // untraced pid 1, and for the classic programs other processes'
        // bpf() syscalls blinding a CPU (README). Without the fix the
        // execs alone counted at least one each, so a quarter of them
        // still tells the fix from its absence. With the classic programs
        // this host counts 20-60 during the execs on a quiet machine and
        // 103-147 with builds beside it, against a few in the window
        // after; the background measured there widens the bound as well.
        assert!(
            during < EXECS / 4 + 2 * idle,
            "{EXECS} execs counted {during} switch_missed ({idle} in as long a window without them)"
        );
    }
}
