//! One set of programs (#14): a daemon capture switches the capture tier
//! on in the daemon's own always-on programs through the CAPTURE flag
//! instead of loading a second copy of the object, which ran every
//! sched_switch, wakeup and fault program twice for the capture's length.

use std::time::{Duration, Instant};

use serde_json::Value;
use vitals_tests::{bpf_stats::*, daemon::*, trace_processor::trace_processor, *};
use vitalsd::control::Request;

/// Kills the workload if the test fails before it is reaped.
struct Reaped(Option<Workload>);

impl Drop for Reaped {
    fn drop(&mut self) {
        if let Some(mut w) = self.0.take() {
            let _ = w.child.kill();
            let _ = w.child.wait();
        }
    }
}

/// The on-CPU time of process `pid` now, exact to the nanosecond: its
/// CPU-time clock (MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED); another
/// process's thread clocks are refused) brings a running thread's
/// sum_exec_runtime up to date, which /proc/<pid>/schedstat does not.
fn process_cpu_ns(pid: u32) -> u64 {
    const CPUCLOCK_SCHED: i32 = 2;
    let clock = (!(pid as i32) << 3) | CPUCLOCK_SCHED;
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    let r = unsafe { libc::clock_gettime(clock, &mut ts) };
    assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Stops and continues `pid` and returns once it runs again. A capture
/// has a slice of a task only from a switch-in it saw, so a spinner
/// switched in before the capture began, alone on its CPU while the other
/// CPU takes everything else, may have none for seconds (three of five
/// runs here lost 130-970 ms of the window that way): its next switch-in,
/// after SIGCONT, is in the capture.
fn switch_out_and_back(pid: u32) {
    let p = procfs::process::Process::new(pid as i32).expect("the spinner");
    let state = || p.stat().expect("the spinner's stat").state;
    let wait_until = |what: &str, done: &dyn Fn(char) -> bool| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !done(state()) {
            assert!(Instant::now() < deadline, "the spinner never {what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    // SAFETY: plain signals to the test's own child.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGSTOP) }, 0);
    wait_until("stopped", &|s| s == 'T');
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGCONT) }, 0);
    wait_until("ran again", &|s| s == 'R');
}

#[test]
fn a_daemon_capture_runs_the_daemons_one_set_of_programs() {
    let _stats = StatsEnabled::enable();
    let d = Daemon::start("");
    let mut w = Reaped(Some(Workload::spawn(&["spin", "6000"])));
    let spinner = w.0.as_ref().unwrap().pid();
    w.0.as_mut().unwrap().expect("ready");
    // One thread: its process's CPU clock is that thread's.
    let threads = std::fs::read_dir(format!("/proc/{spinner}/task"))
        .unwrap()
        .count();
    assert_eq!(threads, 1, "the spinner has {threads} threads");

    let started = d.call(&Request::Capture {
        duration_s: 3.0,
        sched: true,
        faults: false,
        offcpu: None,
    });
    let id = started["id"].as_str().unwrap().to_owned();
    d.wait_status("the capture to run", Duration::from_secs(10), |st| {
        !st["capture"].is_null()
    });
    // The capture thread attaches sched_waking a moment after the status
    // says it runs: the window compared below starts once it has run.
    let deadline = Instant::now() + Duration::from_secs(15);
    let before = loop {
        let progs = programs_of(d.pid());
        if progs
            .iter()
            .any(|p| p.name.starts_with("sched_waking") && p.run_cnt > 0)
        {
            break progs;
        }
        assert!(
            Instant::now() < deadline,
            "sched_waking never ran: {progs:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    switch_out_and_back(spinner);
    let stat1 = proc_stat::ProcStat::read();
    let (t1, run1) = (boottime_ns(), process_cpu_ns(spinner));
    std::thread::sleep(Duration::from_secs(1));
    let run2 = process_cpu_ns(spinner);
    let t2 = boottime_ns();
    let excluded_ns = stat1.excluded_ns_since(None);
    let after = programs_of(d.pid());
    let ran = ran_between(&before, &after);
    let named = |prefix: &str| -> Vec<&ProgRuns> {
        ran.iter().filter(|p| p.name.starts_with(prefix)).collect()
    };
    eprintln!("programs of vitalsd that ran during 1 s of the capture: {ran:?}");
    // The spinner is preempted on a loaded machine and everything else
    // switches: sched_switch runs, and exactly one copy of it.
    assert_eq!(named("sched_switch").len(), 1, "{ran:?}");
    assert_eq!(named("sched_waking").len(), 1, "{ran:?}");
    for p in &ran {
        assert_eq!(
            ran.iter().filter(|q| q.name == p.name).count(),
            1,
            "{} runs twice: {ran:?}",
            p.name
        );
    }

    let deadline = Instant::now() + Duration::from_secs(30);
    let meta: Value = loop {
        if let Some(m) = d.list().into_iter().find(|m| m["id"] == id.as_str()) {
            break m;
        }
        assert!(
            Instant::now() < deadline,
            "capture {id} never stored\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let trace = d.store().join(format!("{id}.pftrace"));
    // The spinner's slices clipped to the window, against the kernel's
    // own on-CPU time of the thread over it.
    let rows = trace_processor().query(
        &trace,
        &format!(
            "select count(*) as slices, \
                    coalesce(sum(min(s.ts + s.dur, {t2}) - max(s.ts, {t1})), 0) as dur \
             from sched_slice s join thread t using(utid) \
             where t.tid = {spinner} and s.ts < {t2} and s.ts + s.dur > {t1}"
        ),
    );
    let slices = rows[0]["slices"].as_i64().unwrap();
    let trace_ns = rows[0]["dur"].as_i64().unwrap() as f64;
    let kernel_ns = (run2 - run1) as f64;
    eprintln!(
        "capture {meta}: spinner {spinner} over 1 s of it: {slices} sched slices, \
         {trace_ns} ns on CPU in the trace, {kernel_ns} ns by its CPU clock"
    );
    assert!(slices > 0, "no sched slices of the spinner in {meta}");
    // Slices are wall time between switches, so they also hold the time
    // interrupts and the hypervisor took from the spinner, which its
    // runtime leaves out: above it by at most all CPUs' irq, softirq and
    // steal time meanwhile (/proc/stat, in ticks: one of rounding per
    // CPU). The window's edges are read microseconds apart on the two
    // sides.
    assert!(
        trace_ns >= kernel_ns * 0.99 - 1e6 && trace_ns <= kernel_ns + excluded_ns + 1e6,
        "spinner on CPU: {trace_ns} ns in the trace, {kernel_ns} ns by its CPU clock \
         (+ {excluded_ns} ns of irq, softirq and steal time)"
    );
    w.0.take().unwrap().finish();
}
