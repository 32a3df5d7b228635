//! eBPF accounting against the kernel's own accounting (/proc, wait4).
//! Run as root; `cargo xtask test` runs them with --test-threads=1 so the
//! workloads do not compete with each other for the two CPUs.

use std::time::{Duration, Instant};

use vitals_common::{drop_reason, TaskCounters};
use vitals_tests::*;
use vitalsd::bpf::{
    Accounting, AccountingConfig, FaultSource, FaultSourceChoice, MapLimits, SchedPrograms,
    TracepointLayout,
};

// A test target's root looks for modules beside it, hence the path.
#[path = "accounting/exec.rs"]
mod exec;
#[path = "accounting/kernel_charge.rs"]
mod kernel_charge;
#[path = "accounting/run_delay.rs"]
mod run_delay;
#[path = "accounting/running_task.rs"]
mod running_task;
#[path = "accounting/switch_program.rs"]
mod switch_program;
#[path = "accounting/wakeup_wait.rs"]
mod wakeup_wait;

fn load(source: FaultSourceChoice) -> Accounting {
    require_root();
    let acc = Accounting::load(&AccountingConfig {
        fault_source: source,
        ..Default::default()
    })
    .expect("loading the accounting programs");
    // With BTF, every kernel must get tp_btf: 5.18+ with sched_switch's
    // prev_state argument, older ones (the 5.10 and 5.15 guests of the
    // kernel matrix) with prev's state read from the task. Every mainline
    // kernel from 5.10 on has the standard sched_switch and sched_wakeup
    // layout, so the fast fixed-layout programs must be chosen.
    let btf = std::path::Path::new("/sys/kernel/btf/vmlinux").exists();
    let expected = if btf {
        SchedPrograms::Btf
    } else {
        SchedPrograms::Classic
    };
    assert_eq!(
        acc.sched_programs(),
        expected,
        "kernel {:?}",
        kernel_version()
    );
    assert_eq!(acc.layout(), TracepointLayout::Fixed);
    // Which sched_switch program the kernel holds: before 5.18 the one
    // that reads prev's state from the task.
    if btf {
        assert_eq!(
            switch_program::names(),
            [if kernel_version() >= (5, 18) {
                "sched_switch_bt"
            } else {
                "switch_pre5_18"
            }],
            "kernel {:?}",
            kernel_version()
        );
    }
    acc
}

/// The classic-tracepoint programs, as Android's bpfloader attaches them.
fn load_classic(portable: bool) -> Accounting {
    require_root();
    let acc = Accounting::load(&AccountingConfig {
        fault_source: FaultSourceChoice::Off,
        force_classic_tracepoints: true,
        force_portable_layout: portable,
        ..Default::default()
    })
    .expect("loading the classic accounting programs");
    assert_eq!(acc.sched_programs(), SchedPrograms::Classic);
    assert_eq!(acc.layout() == TracepointLayout::Portable, portable);
    acc
}

/// A blocked task's counters: summed over CPUs, nothing in flight.
fn task(acc: &mut Accounting, tid: u32) -> TaskCounters {
    let snap = acc.read().expect("reading maps");
    let mut t = snap.tasks.get(&tid).map(|r| r.widen()).unwrap_or_default();
    t.oncpu_ns += snap.inflight_ns.get(&tid).copied().unwrap_or(0);
    t
}

#[test]
fn oncpu_time_matches_utime_plus_stime() {
    let mut acc = load(FaultSourceChoice::Auto);
    let mut w = Workload::spawn(&["spin", "1000"]);
    w.expect("ready");
    w.expect("done");
    let k = kernel_stat(w.pid());
    let bpf = task(&mut acc, w.pid());
    let kernel_ns = (k.utime_ticks + k.stime_ticks) as f64 * 1e9 / clk_tck() as f64;
    assert!(kernel_ns >= 0.8e9, "workload spun only {kernel_ns} ns");
    assert_within_pct(
        "eBPF on-CPU ns vs utime+stime",
        bpf.oncpu_ns as f64,
        kernel_ns,
        10.0,
    );
    w.finish();
}

fn fault_check(source: FaultSourceChoice, expect: FaultSource) {
    const PAGES: u64 = 20_000;
    let mut acc = load(source);
    assert_eq!(acc.fault_source(), expect);
    let mut w = Workload::spawn(&["touch", &PAGES.to_string()]);
    w.expect("ready");
    let (k0, b0) = (kernel_stat(w.pid()), task(&mut acc, w.pid()));
    w.go();
    w.expect("done");
    let (k1, b1) = (kernel_stat(w.pid()), task(&mut acc, w.pid()));
    let minflt = (k1.minflt - k0.minflt) as f64;
    let bpf = (expect.faults(&b1.faults) - expect.faults(&b0.faults)) as f64;
    assert!(
        bpf >= PAGES as f64,
        "{expect:?}: {bpf} faults < {PAGES} pages touched"
    );
    assert!(minflt >= PAGES as f64, "kernel minflt {minflt} < {PAGES}");
    assert_within_pct(&format!("{expect:?} faults vs minflt"), bpf, minflt, 10.0);
    if expect == FaultSource::PerfEvent {
        // Same accounting point as minflt/majflt: the split must match too.
        assert_eq!(b1.faults.majflt - b0.faults.majflt, k1.majflt - k0.majflt);
    }
    w.finish();
}

#[test]
fn faults_match_minflt_tracepoint_source() {
    let tracefs = vitalsd::bpf::tracefs::Tracefs::find_or_mount().unwrap();
    assert!(
        tracefs.has_event("exceptions", "page_fault_user"),
        "this x86 kernel must have exceptions/page_fault_user"
    );
    fault_check(FaultSourceChoice::Auto, FaultSource::Tracepoint);
}

/// What `auto` picks on this architecture counts as minflt does: x86 has
/// exceptions/page_fault_user; arm64 has no such tracepoint, so there the
/// perf software events are the default (run on arm64 kernels by
/// `cargo xtask vm-test`).
#[test]
fn faults_match_minflt_default_source() {
    let expect = if cfg!(target_arch = "x86_64") {
        FaultSource::Tracepoint
    } else {
        FaultSource::PerfEvent
    };
    fault_check(FaultSourceChoice::Auto, expect);
}

#[test]
fn faults_match_minflt_perf_source_forced() {
    fault_check(FaultSourceChoice::PerfEvent, FaultSource::PerfEvent);
}

/// tp_btf: on-CPU time is the kernel's sum_exec_runtime, to 1 %, beside
/// a frequent waker (wall time read about 7 % over).
#[test]
fn oncpu_time_is_the_kernels_charge_beside_a_frequent_waker() {
    kernel_charge::check(load(FaultSourceChoice::Off), kernel_charge::FREQUENT_WAKER);
}

/// The same beside a storm of short timers (hrtimer interrupts).
#[test]
fn oncpu_time_is_the_kernels_charge_beside_a_timer_storm() {
    kernel_charge::check(load(FaultSourceChoice::Off), kernel_charge::TIMER_STORM);
}

/// The same beside a loopback flood (NET_RX softirq time on its CPU).
#[test]
fn oncpu_time_is_the_kernels_charge_beside_a_loopback_flood() {
    kernel_charge::check(load(FaultSourceChoice::Off), kernel_charge::LOOPBACK_FLOOD);
}

/// tp_btf: runqueue wait is the kernel's run_delay, to 1 %, and the
/// switch counts are its nvcsw/nivcsw, for tasks sharing a CPU with a
/// spinner; no wakeup programs are loaded.
#[test]
fn runq_wait_and_switches_are_the_kernels_beside_a_spinner() {
    run_delay::check(load(FaultSourceChoice::Off));
}

/// The pre-5.18 tp_btf sched_switch program on this kernel: runqueue
/// wait and switch counts are the kernel's, sleeps switch voluntarily,
/// on-CPU time is sum_exec_runtime.
#[test]
fn pre_5_18_switch_program_counts_as_the_kernel() {
    use switch_program::load_task_state;
    run_delay::check(load_task_state());
    sleep_check(load_task_state());
    kernel_charge::check(load_task_state(), kernel_charge::FREQUENT_WAKER);
}

#[test]
fn sleeping_child_switches_voluntarily() {
    sleep_check(load(FaultSourceChoice::Off));
}

/// The portable programs (offsets from tracefs, probe reads) count the same.
#[test]
fn portable_layout_programs_count_the_same() {
    sleep_check(load_classic(true));
}

/// The classic fixed-layout programs (bpfloader's, on devices) count the
/// same: voluntary switches, and against schedstat on-CPU time,
/// involuntary switches and runqueue wait.
#[test]
fn classic_tracepoint_programs_count_the_same() {
    sleep_check(load_classic(false));
    spinners_check(|| load_classic(false));
}

/// The classic sched_wakeup programs measure the wakeup path alike.
#[test]
fn classic_wakeup_wait_matches_bpftrace() {
    wakeup_wait::check(load_classic(false));
}

/// Runqueue wait with wakeup times in the hash (hosts with a large pid_max),
/// on the classic programs: tp_btf reads run_delay and stamps no wakeups.
#[test]
fn wake_hash_path_measures_runqueue_wait() {
    spinners_check(|| {
        require_root();
        let acc = Accounting::load(&AccountingConfig {
            fault_source: FaultSourceChoice::Off,
            force_wake_hash: true,
            force_classic_tracepoints: true,
            ..Default::default()
        })
        .unwrap();
        assert!(!acc.runq_wait_from_kernel());
        acc
    });
}

fn sleep_check(mut acc: Accounting) {
    const K: u64 = 200;
    // 10 ms sleeps: a sleep blocks only if its timer has not fired by the
    // time the task calls schedule(), which a 1 ms timer under QEMU TCG
    // missed 4 times in 200 (196 switches on arm64 6.1).
    let mut w = Workload::spawn(&["sleep", &K.to_string(), "10"]);
    w.expect("ready");
    let (k0, b0) = (kernel_stat(w.pid()), task(&mut acc, w.pid()));
    w.go();
    w.expect("done");
    let (k1, b1) = (kernel_stat(w.pid()), task(&mut acc, w.pid()));
    let bpf_vol = b1.voluntary_switches - b0.voluntary_switches;
    let kernel_vol = k1.voluntary_ctxt_switches - k0.voluntary_ctxt_switches;
    assert!(
        (K..=K + K / 10 + 5).contains(&bpf_vol),
        "{K} sleeps gave {bpf_vol} voluntary switches"
    );
    // The kernel's nvcsw counts the same switch-outs.
    assert!(
        bpf_vol.abs_diff(kernel_vol) <= 2,
        "eBPF voluntary {bpf_vol} vs /proc voluntary_ctxt_switches {kernel_vol}"
    );
    w.finish();
}

#[test]
fn pinned_spinners_preempt_each_other_and_wait() {
    spinners_check(|| load(FaultSourceChoice::Off));
}

fn spinners_check(load: impl FnOnce() -> Accounting) {
    let _delayacct = DelayAcct::enable();
    let mut acc = load();
    let mut a = Workload::spawn(&["pinned-spin", "0", "1000"]);
    let mut b = Workload::spawn(&["pinned-spin", "0", "1000"]);
    a.expect("ready");
    b.expect("ready");
    let (ka0, kb0) = (kernel_stat(a.pid()), kernel_stat(b.pid()));
    let (sa0, sb0) = (schedstat(a.pid()), schedstat(b.pid()));
    let (a0, b0) = (task(&mut acc, a.pid()), task(&mut acc, b.pid()));
    let stat0 = proc_stat::ProcStat::read();
    a.go();
    b.go();
    a.expect("done");
    b.expect("done");
    // vitalsd's slices are wall time between switches, so they include
    // the irq, softirq and steal time CPU 0 had meanwhile, which the
    // kernel's runtime leaves out (README "Kernel support"): a download
    // beside this test (network softirqs on CPU 0) once put a spinner 6 %
    // over. The upper bound allows all of it, since /proc does not say how
    // the two spinners shared it, plus a tick of rounding where any is
    // accounted.
    let excluded_ns = stat0.excluded_ns_since(Some(0));
    for (name, w, k0, s0, t0) in [("a", &a, ka0, sa0, a0), ("b", &b, kb0, sb0, b0)] {
        let k1 = kernel_stat(w.pid());
        let s1 = schedstat(w.pid());
        let t1 = task(&mut acc, w.pid());
        // The scheduler's own figures: sum_exec_runtime and run_delay.
        let oncpu_ns = (t1.oncpu_ns - t0.oncpu_ns) as f64;
        let runtime_ns = (s1.0 - s0.0) as f64;
        eprintln!(
            "spinner {name}: eBPF {oncpu_ns} ns, sum_exec_runtime {runtime_ns} ns, CPU 0 irq+softirq+steal at most {excluded_ns} ns"
        );
        assert!(
            oncpu_ns >= 0.95 * runtime_ns && oncpu_ns <= 1.05 * runtime_ns + excluded_ns,
            "spinner {name} on-CPU {oncpu_ns} ns vs sum_exec_runtime {runtime_ns} ns: not within \
             -5 % .. +5 % + {excluded_ns} ns of irq, softirq and steal time on CPU 0"
        );
        assert_within_pct(
            &format!("spinner {name} runqueue wait vs schedstat run_delay"),
            (t1.runq_wait_ns - t0.runq_wait_ns) as f64,
            (s1.1 - s0.1) as f64,
            10.0,
        );
        let invol = t1.involuntary_switches - t0.involuntary_switches;
        let wait_ns = t1.runq_wait_ns - t0.runq_wait_ns;
        let kernel_invol = k1.nonvoluntary_ctxt_switches - k0.nonvoluntary_ctxt_switches;
        assert!(invol > 0, "spinner {name}: no involuntary switches");
        assert!(kernel_invol > 0, "spinner {name}: kernel saw no preemption");
        // Two spinners sharing one CPU: each waits while the other runs.
        assert!(
            wait_ns > 100_000_000,
            "spinner {name}: runqueue wait only {wait_ns} ns"
        );
        assert_within_pct(
            &format!("spinner {name} involuntary switches vs nonvoluntary_ctxt_switches"),
            invol as f64,
            kernel_invol as f64,
            10.0,
        );
    }
    a.finish();
    b.finish();
}

#[test]
fn exited_child_keeps_its_final_counters() {
    exited_check(load(FaultSourceChoice::Auto));
}

/// As bpfloader loads it (no .rodata): sched_process_free tells the pid
/// offset from the record. This 6.18 kernel has `__data_loc comm`, so the
/// old fixed offset 24 would read `prio` and lose every exit.
#[test]
fn exited_child_keeps_its_final_counters_with_the_pid_offset_from_the_record() {
    require_root();
    let free = vitalsd::bpf::tracefs::Tracefs::find_or_mount()
        .unwrap()
        .format("sched", "sched_process_free")
        .unwrap();
    assert_eq!(
        free.offset_of("pid", 4).unwrap(),
        12,
        "this kernel's layout changed"
    );
    exited_check(
        Accounting::load(&AccountingConfig {
            free_pid_from_record: true,
            ..Default::default()
        })
        .unwrap(),
    );
}

fn exited_check(mut acc: Accounting) {
    let mut totals = vitalsd::bpf::totals::Totals::new();
    totals.update(&acc.read().unwrap());
    let mut child = std::process::Command::new(workload_bin())
        .args(["spin-exit", "300"])
        .spawn()
        .unwrap();
    let pid = child.id();
    // Reap it with wait4 for the kernel's own final CPU time.
    let mut status = 0;
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::wait4(pid as i32, &mut status, 0, &mut ru) };
    assert_eq!(r, pid as i32);
    std::mem::forget(child.stdin.take());
    let _ = child.try_wait();
    let rusage_ns = (ru.ru_utime.tv_sec as f64 + ru.ru_stime.tv_sec as f64) * 1e9
        + (ru.ru_utime.tv_usec as f64 + ru.ru_stime.tv_usec as f64) * 1e3;

    // sched_process_free runs after an RCU grace period; poll for it.
    let deadline = Instant::now() + Duration::from_secs(5);
    let row = loop {
        let snap = acc.read().unwrap();
        let exited = snap.exited.iter().find(|(k, _)| k.tid == pid);
        let rows = totals.update(&snap);
        if let Some((_, rec)) = exited {
            assert!(!snap.tasks.contains_key(&pid), "freed tid still in TASKS");
            // The comm the kernel had for it, whichever layout
            // sched_process_free's record has here.
            assert_eq!(
                String::from_utf8_lossy(rec.comm_bytes()),
                "vitals-workload",
                "comm of the freed task"
            );
            break rows
                .into_iter()
                .find(|r| r.tgid == pid)
                .expect("process row");
        }
        assert!(Instant::now() < deadline, "no exit record for {pid}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(row.ended, "the leader's free must end the process row");
    assert_within_pct(
        "final on-CPU vs wait4 rusage",
        row.oncpu_ns as f64,
        rusage_ns,
        10.0,
    );
    // In the counter of the source in use: fault entries from x86's
    // tracepoint, minflt + majflt from the perf events (arm64's default).
    let source = acc.fault_source();
    assert!(
        source.faults(&row.faults) > 0,
        "startup faults of the exited child were lost ({source:?} source: {:?})",
        row.faults
    );
}

#[test]
fn full_task_map_counts_drops_and_keeps_working() {
    require_root();
    let mut acc = Accounting::load(&AccountingConfig {
        fault_source: FaultSourceChoice::Auto,
        limits: MapLimits {
            max_tasks: 16,
            ..MapLimits::default()
        },
        // The bound is the hash's: ids below pid_max have array slots,
        // which cannot fill up.
        force_task_hash: true,
        ..Default::default()
    })
    .unwrap();
    let mut w = Workload::spawn(&["threads", "64", "200"]);
    w.expect("done");
    let snap = acc.read().expect("reading a full map still works");
    assert!(
        snap.tasks.len() <= 16,
        "map bound not enforced: {}",
        snap.tasks.len()
    );
    assert!(
        snap.drops[drop_reason::TASK_MAP_FULL as usize] > 0,
        "no drops counted with 64 threads and 16 entries: {:?}",
        snap.drops
    );
    w.finish();
}

/// Wakeup-to-run wait: a sleeper sharing CPU 0 with a spinner waits after
/// each wakeup. With the classic programs (`classic_wakeup_wait_matches_bpftrace`)
/// our figure is the wakeup programs' timing, and the reference is
/// bpftrace summing the same interval (sched_wakeup or runnable
/// switch-out, to switch-in) in the same run.
///
/// The tp_btf programs charge the kernel's own `sched_info.run_delay`
/// (README "Reliability"), so there the reference is the sleeper's
/// /proc/<pid>/schedstat over the same window, and bpftrace's figure is
/// only reported. The two differ on EEVDF kernels (6.12+): with delayed
/// dequeue a sleeper woken while still queued is re-queued without
/// sched_info restarting its wait clock, so some wakeup waits never reach
/// run_delay. This host's 6.18 usually shows no gap, but a fresh-clone CI
/// run here read 4.0 ms of run_delay against 6.3 ms by tracepoints: the
/// kernel's figure, which is what the tp_btf tier reports, not an error
/// of ours.
///
/// The two sides stamp the same events at different instants: our
/// programs were attached first, so they run first on each tracepoint, and
/// bpftrace's switch-in stamp comes after our whole sched_switch program
/// while its wakeup stamp comes after only our short wakeup program. That
/// lengthens each wait as bpftrace sees it by a near-constant 1-3 us per
/// wakeup here (measured: ours 4-11% below bpftrace over 300 waits of
/// ~17 us). The sleeper therefore runs at nice 19, so each wait is a
/// longer share of the spinner's slice and that skew stays a few percent.
#[test]
fn wakeup_wait_is_the_kernels_run_delay_on_tp_btf() {
    wakeup_wait::check(load(FaultSourceChoice::Off));
}

/// --no-runq-wait: no wakeup programs, and the wait counter stays zero
/// (the daemon then reports it as unavailable, not as zero).
#[test]
fn runq_wait_off_measures_no_wait() {
    require_root();
    let mut acc = Accounting::load(&AccountingConfig {
        fault_source: FaultSourceChoice::Off,
        runq_wait: false,
        ..Default::default()
    })
    .unwrap();
    assert!(!acc.runq_wait());
    let mut a = Workload::spawn(&["pinned-spin", "0", "500"]);
    let mut b = Workload::spawn(&["pinned-spin", "0", "500"]);
    a.expect("ready");
    b.expect("ready");
    a.go();
    b.go();
    a.expect("done");
    b.expect("done");
    let t = task(&mut acc, a.pid());
    assert!(t.involuntary_switches > 0 && t.oncpu_ns > 0);
    assert_eq!(t.runq_wait_ns, 0);
    a.finish();
    b.finish();
}

/// procfs and eBPF see the same spinner: over a 1 s window its
/// core-equivalent % from /proc/<pid>/stat is the kernel's own runtime
/// share (sum_exec_runtime from /proc/<pid>/schedstat over the same window,
/// within 10%), and agrees with the eBPF on-CPU time within 10%. The
/// spinner's absolute share is the machine's business, not vitalsd's: on a
/// busy hypervisor a pinned spinner got 78% of its CPU (steal time, which
/// the kernel does not charge to the task), so only a floor that says the
/// spinner ran at all is asked of it.
#[test]
fn procfs_core_equivalent_agrees_with_ebpf() {
    use vitalsd::procfs::sampler::{SampleOptions, Sampler};
    let mut acc = load(FaultSourceChoice::Off);
    let hz = vitalsd::system::clock_ticks_per_second().unwrap();
    let mut sampler = Sampler::new("/proc", SampleOptions::default());
    let mut tracker = vitalsd::sources::tasks::Windows::new(hz);
    let mut w = Workload::spawn(&["pinned-spin", "1", "2500"]);
    w.expect("ready");
    w.go();
    std::thread::sleep(Duration::from_millis(300));
    let b0 = task(&mut acc, w.pid());
    tracker.update(&sampler.sample().unwrap());
    let (k0, _) = schedstat(w.pid());
    std::thread::sleep(Duration::from_secs(1));
    let b1 = task(&mut acc, w.pid());
    let window = tracker
        .update(&sampler.sample().unwrap())
        .expect("a window");
    let (k1, _) = schedstat(w.pid());
    let row = window
        .processes
        .iter()
        .find(|p| p.pid == w.pid() as i32)
        .expect("spinner in the window");
    let wall_ns = window.clocks.monotonic_ns.expect("monotonic window") as f64;
    let kernel_pct = (k1 - k0) as f64 * 100.0 / wall_ns;
    assert!(
        kernel_pct > 30.0,
        "precondition: the pinned spinner ran only {kernel_pct:.1}% of the \
         window by its schedstat; this machine is too busy to test on"
    );
    let core_eq = row.core_equivalent_pct.expect("core-equivalent %");
    assert_within_pct(
        "procfs core-equivalent % vs the kernel's schedstat runtime %",
        core_eq,
        kernel_pct,
        10.0,
    );
    // Machine share divides by all CPUs' ticks (steal included), which add
    // up to the window's wall time on every CPU: one CPU's share of it.
    let ncpu = window.system.as_ref().unwrap().online_cpus.len() as f64;
    let share = row.machine_share_pct.expect("machine share %");
    assert_within_pct(
        &format!("machine share % on {ncpu} CPUs vs core-equivalent % / CPUs"),
        share,
        core_eq / ncpu,
        15.0,
    );
    let bpf_pct = (b1.oncpu_ns - b0.oncpu_ns) as f64 * 100.0 / wall_ns;
    assert_within_pct(
        "eBPF on-CPU % vs procfs core-equivalent %",
        bpf_pct,
        core_eq,
        10.0,
    );
    w.expect("done");
    w.finish();
}

/// A task still running when the maps are read: its counters hold only
/// finished slices, and the in-flight one comes from CPU_STATE (for the
/// tp_btf programs in the runqueue clock, which user space reaches from
/// CLOCK_MONOTONIC through the CPU's measured offset). Reference: the
/// kernel's sum_exec_runtime from /proc/<pid>/schedstat, as updated after
/// the read (see `schedstat_updated_after`).
#[test]
fn running_task_inflight_time_matches_schedstat() {
    running_task::check(load(FaultSourceChoice::Off));
    running_task::check(load_classic(false));
}

/// BPF_MAP_LOOKUP_BATCH and aya's per-key iteration read the same maps:
/// 400 sleeping threads (more than one batch of 256) have identical
/// counters both ways, and the key sets differ only by tasks that came or
/// went between the two reads. The counters are kept in the TASKS hash
/// (`force_task_hash`), as for tids past pid_max's array.
#[test]
fn batched_map_reads_match_iteration() {
    use vitalsd::bpf::MapRead;
    const THREADS: usize = 400;
    require_root();
    let mut acc = Accounting::load(&AccountingConfig {
        fault_source: FaultSourceChoice::Auto,
        force_task_hash: true,
        ..Default::default()
    })
    .expect("loading the accounting programs");
    assert_eq!(acc.map_read(), MapRead::Batch);
    let mut w = Workload::spawn(&["threads", &THREADS.to_string(), "3000"]);
    // Every thread has spun its millisecond and sleeps for 3 s: the
    // counters of a sleeping thread stay put between the two reads.
    let tids = wait_blocked_with_threads(w.pid(), THREADS);
    // A hash is batched once a read has found it large (`read_hash`).
    acc.read().expect("first read");
    let batched = acc.read().expect("batched read");
    assert_eq!(acc.map_read(), MapRead::Batch, "fell back to iteration");
    acc.set_map_read(MapRead::Iterate);
    let iterated = acc.read().expect("iterated read");
    assert!(
        batched.tasks.len() > THREADS,
        "{} tasks",
        batched.tasks.len()
    );
    for tid in &tids {
        let (b, i) = (batched.tasks.get(tid), iterated.tasks.get(tid));
        assert!(b.is_some(), "thread {tid} missing from the batched read");
        assert_eq!(b, i, "thread {tid}: batched vs iterated counters");
    }
    assert_eq!(
        batched.process_faults.get(&w.pid()),
        iterated.process_faults.get(&w.pid())
    );
    let common = batched
        .tasks
        .keys()
        .filter(|k| iterated.tasks.contains_key(k))
        .count();
    assert!(
        common + 20 >= batched.tasks.len().max(iterated.tasks.len()),
        "{common} common keys of {} batched, {} iterated",
        batched.tasks.len(),
        iterated.tasks.len()
    );
    w.expect("done");
    w.finish();
}

/// Exec by a thread that is not its process's leader takes the leader's
/// pid while on the CPU (de_thread -> exchange_tids): 1000 such execs
/// count no switch_missed on tp_btf (the task pointer is the same).
#[test]
fn exec_from_non_leader_thread_is_no_missed_switch() {
    exec::check(load(FaultSourceChoice::Off));
}

/// The same with the classic programs, which follow the rename at
/// sched_process_exec.
#[test]
fn exec_from_non_leader_thread_is_no_missed_switch_classic() {
    exec::check(load_classic(false));
}
