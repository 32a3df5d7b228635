//! The CTS tier's always-on accounting (`sources::schedstat`, no eBPF) against
//! the kernel's own figures: each workload's counters as the source folds
//! them from /proc, against what the kernel reports for the same task
//! (read with the `procfs` crate, not our parsers) or the process reports
//! for itself (getrusage). Root only for the sysctl guard.

use std::path::Path;

use vitals_tests::*;
use vitalsd::{
    accounting::ProcessCounters,
    procfs::sampler::{Sample, SampleOptions, Sampler},
    sources::schedstat::SchedProcfs,
};

/// The source over the real /proc, as the daemon runs it.
struct Source {
    sampler: Sampler,
    sample: Sample,
    sched: SchedProcfs,
}

impl Source {
    fn open() -> Self {
        let hz = clk_tck();
        Self {
            sampler: Sampler::new(
                "/proc",
                SampleOptions {
                    threads: false,
                    status: false,
                    cmdline: false,
                },
            ),
            sample: Sample::default(),
            sched: SchedProcfs::open(Path::new("/proc"), hz).expect("this kernel has schedstat"),
        }
    }

    /// One scan; `pid`'s live row.
    fn row(&mut self, pid: u32) -> ProcessCounters {
        self.sampler.sample_into(&mut self.sample).unwrap();
        self.sched
            .update(&self.sample)
            .into_iter()
            .find(|r| r.tgid == pid && !r.ended)
            .unwrap_or_else(|| panic!("no row for {pid}"))
    }
}

/// Every thread's switch-outs, as the kernel's status files count them.
fn kernel_switches(pid: u32) -> (u64, u64) {
    let p = procfs::process::Process::new(pid as i32).unwrap();
    let mut sum = (0, 0);
    for t in p.tasks().unwrap().flatten() {
        let st = t.status().unwrap();
        sum.0 += st.voluntary_ctxt_switches.unwrap_or(0);
        sum.1 += st.nonvoluntary_ctxt_switches.unwrap_or(0);
    }
    sum
}

/// Every thread's (sum_exec_runtime, run_delay), from its schedstat.
fn kernel_schedstat(pid: u32) -> (u64, u64) {
    let p = procfs::process::Process::new(pid as i32).unwrap();
    let mut sum = (0, 0);
    for t in p.tasks().unwrap().flatten() {
        let s = t.schedstat().unwrap();
        sum.0 += s.sum_exec_runtime;
        sum.1 += s.run_delay;
    }
    sum
}

#[test]
fn spinner_oncpu_matches_schedstat() {
    require_root();
    let mut src = Source::open();
    // Waits for `go`. Both baselines are read once it sleeps: schedstat
    // does not bring a task on a CPU up to date (update_curr() does at
    // its next tick or switch), so a read while it still ran on after
    // printing could lag the next one; a 6.1 TCG guest showed 12 ms.
    let mut w = Workload::spawn(&["pinned-spin", "1", "1000"]);
    w.expect("ready");
    wait_blocked(w.pid());
    let (k0, r0) = (kernel_schedstat(w.pid()), src.row(w.pid()));
    w.go();
    w.expect("done");
    // Settled: the spinner now blocks on stdin, so its runtime is final.
    wait_blocked(w.pid());
    let (k1, r1) = (kernel_schedstat(w.pid()), src.row(w.pid()));
    let ours = (r1.oncpu_ns - r0.oncpu_ns) as f64;
    let kernel = (k1.0 - k0.0) as f64;
    eprintln!("spinner: source {ours} ns, schedstat {kernel} ns");
    assert!(kernel > 0.5e9, "the spinner ran {kernel} ns");
    assert_within_pct("spinner on-CPU vs schedstat", ours, kernel, 1.0);
    w.finish();
}

#[test]
fn pinned_spinners_wait_as_run_delay_says() {
    require_root();
    // Before 5.14 without CONFIG_SCHEDSTATS, run_delay needs delay
    // accounting on (its default); the sysctl exists from 5.14, where
    // sched_info is always on. Set where it exists, for older kernels'
    // sakes only.
    let _delayacct = DelayAcct::enable();
    let mut src = Source::open();
    let mut a = Workload::spawn(&["pinned-spin", "0", "1000"]);
    let mut b = Workload::spawn(&["pinned-spin", "0", "1000"]);
    a.expect("ready");
    b.expect("ready");
    wait_blocked(a.pid());
    wait_blocked(b.pid());
    let before: Vec<_> = [&a, &b]
        .iter()
        .map(|w| (kernel_schedstat(w.pid()), kernel_switches(w.pid())))
        .collect();
    let rows0: Vec<_> = [&a, &b].iter().map(|w| src.row(w.pid())).collect();
    a.go();
    b.go();
    a.expect("done");
    b.expect("done");
    wait_blocked(a.pid());
    wait_blocked(b.pid());
    for (i, w) in [&a, &b].into_iter().enumerate() {
        let (k0, s0) = before[i];
        let (k1, s1) = (kernel_schedstat(w.pid()), kernel_switches(w.pid()));
        let r1 = src.row(w.pid());
        let wait = (r1.runq_wait_ns - rows0[i].runq_wait_ns) as f64;
        let run_delay = (k1.1 - k0.1) as f64;
        eprintln!("spinner {i}: runqueue wait {wait} ns, run_delay {run_delay} ns");
        // Two spinners on one CPU: each waits about as long as the other runs.
        assert!(run_delay > 0.3e9, "spinner {i} waited only {run_delay} ns");
        assert_within_pct("runqueue wait vs run_delay", wait, run_delay, 5.0);
        assert_eq!(
            (
                r1.voluntary_switches - rows0[i].voluntary_switches,
                r1.involuntary_switches - rows0[i].involuntary_switches
            ),
            (s1.0 - s0.0, s1.1 - s0.1),
            "spinner {i}: switches vs the kernel's status"
        );
        assert!(s1.1 > s0.1, "spinner {i} was never preempted");
    }
    a.finish();
    b.finish();
}

/// A thread that sleeps 300 times: voluntary switches, as status counts
/// them. (The ping-pong workload's threads exit when done, taking their
/// status with them; the spinners above check involuntary ones.)
#[test]
fn sleeper_switches_equal_status() {
    require_root();
    let mut src = Source::open();
    let mut w = Workload::spawn(&["pinned-sleep", "1", "300", "2"]);
    w.expect("ready");
    wait_blocked(w.pid());
    let r0 = src.row(w.pid());
    let k0 = kernel_switches(w.pid());
    w.go();
    // Mid-way scans, as the daemon's ticks would see it.
    std::thread::sleep(std::time::Duration::from_millis(300));
    src.row(w.pid());
    w.expect("done");
    wait_blocked(w.pid());
    // Blocked on stdin now: its counts are final.
    let k1 = kernel_switches(w.pid());
    let r1 = src.row(w.pid());
    let ours = (
        r1.voluntary_switches - r0.voluntary_switches,
        r1.involuntary_switches - r0.involuntary_switches,
    );
    let kernel = (k1.0 - k0.0, k1.1 - k0.1);
    eprintln!("sleeper: source {ours:?}, status {kernel:?}");
    // Each sleep switches at least once, voluntarily as a rule; a sleeper
    // preempted between setting its state and schedule() switches out
    // involuntarily, and its timer may fire before it runs again, so that
    // sleep ends without a voluntary switch (an arm64 6.1 guest counted
    // 299 and 3, the kernel's status and ours alike).
    assert!(
        ours.0 + ours.1 >= 300,
        "300 sleeps are at least 300 switches: {ours:?}"
    );
    assert_eq!(ours, kernel);
    w.finish();
}

/// 200 threads that live 20 ms each die between two scans: their time is
/// only in the process's stat (the thread group's total). The process's
/// on-CPU total stays complete, never above the kernel's own figure, and
/// the part known at tick precision is counted.
#[test]
fn short_lived_threads_keep_their_time() {
    require_root();
    let mut src = Source::open();
    let mut w = Workload::spawn(&["thread-churn", "200", "20"]);
    w.expect("ready");
    let r0 = src.row(w.pid());
    let ticks0 = src.sched.stats.tick_precision_ns;
    w.go();
    // Scans while the threads come and go, as the daemon's ticks would.
    let start = std::time::Instant::now();
    let mut scans = 0;
    while start.elapsed() < std::time::Duration::from_millis(2500) {
        std::thread::sleep(std::time::Duration::from_millis(500));
        src.row(w.pid());
        scans += 1;
    }
    w.expect("done");
    // Every thread gone and the main one blocked: then our read, then the
    // kernel's getrusage, which can only have grown since (an arm64 TCG
    // guest's threads, joined before a getrusage taken first, still ran
    // their exit paths for 33 ms past it).
    let pid = w.pid();
    wait_blocked_alone(pid);
    let r1 = src.row(pid);
    // The main thread alone, blocked: where it stood at our read.
    let main_at_read_ns = kernel_schedstat(pid).0 as f64;
    w.go();
    let rusage = w.read_numbers("rusage");
    assert_eq!(rusage.len(), 2, "workload said rusage {rusage:?}");
    let rusage_ns = rusage[0] as f64 * 1e3;
    // What the main thread ran from our read to its getrusage (an arm64
    // TCG guest's took over 2 ms to wake, read its line and ask).
    let main_since_read_ns = rusage[1] as f64 - main_at_read_ns;
    let ours = r1.oncpu_ns as f64;
    let tick_ns = 1e9 / clk_tck() as f64;
    eprintln!(
        "thread churn: source {ours} ns (from {} at start), getrusage {rusage_ns} ns, \
         main thread ran {main_since_read_ns} ns between, {} exited threads, \
         {} ns at tick precision, {scans} scans",
        r0.oncpu_ns,
        r1.exited_threads,
        src.sched.stats.tick_precision_ns - ticks0
    );
    assert!(
        main_since_read_ns >= 0.0,
        "the main thread's clock went backwards: {rusage:?} from {main_at_read_ns}"
    );
    assert!(rusage_ns > 3.0e9, "200 x 20 ms ran only {rusage_ns} ns");
    // Never above the kernel's total (both count from the process's
    // start); below it by at most stat's truncation of utime and stime
    // and what the main thread ran between our read and its getrusage.
    assert!(
        ours <= rusage_ns + 1e6,
        "{ours} ns over getrusage's {rusage_ns}"
    );
    assert!(
        ours >= rusage_ns - 2.0 * tick_ns - main_since_read_ns,
        "{ours} ns: lost more than two ticks of getrusage's {rusage_ns} \
         beyond the main thread's {main_since_read_ns} ns since our read"
    );
    assert!(
        src.sched.stats.tick_precision_ns - ticks0 > 1_000_000_000,
        "dead threads' time should come from stat"
    );
    w.finish();
}
