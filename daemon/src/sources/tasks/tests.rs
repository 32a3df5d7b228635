//! Tracker tests on fake procfs trees: every procfs rule of docs/architecture.md.

use super::*;
use crate::procfs::testutil::{Cols, FakeProc, Task};
use crate::procfs::{SampleOptions, Sampler};
use crate::sources::system::ANDROID_LEGACY_TOTAL_FORMULA;
use prost::Message;
use std::collections::HashMap;
use vitals_proto::protos::{
    self, trace_packet::Data, track_descriptor::StaticOrDynamicName, track_event::CounterValueField,
};

const CPU0: Cols = [100, 0, 50, 1000, 10, 0, 5, 0, 0, 0];
const CPU1: Cols = [200, 0, 60, 900, 20, 0, 5, 0, 0, 0];

fn sum(a: Cols, b: Cols) -> Cols {
    let mut out = [0; 10];
    for i in 0..10 {
        out[i] = a[i] + b[i];
    }
    out
}

fn add(mut c: Cols, idx: usize, v: u64) -> Cols {
    c[idx] += v;
    c
}

fn task(pid: i32, comm: &str, utime: u64, stime: u64, starttime: u64) -> Task<'_> {
    Task {
        pid,
        comm,
        minflt: 100,
        majflt: 2,
        utime,
        stime,
        starttime,
    }
}

fn clock(s: u64) -> ClockPair {
    ClockPair {
        boottime_ns: s * 1_000_000_000 + 5,
        monotonic_ns: s * 1_000_000_000,
    }
}

struct Fixture {
    fake: FakeProc,
    sampler: Sampler,
    tracker: Windows,
    t: u64,
}

impl Fixture {
    fn new(hz: u64, opts: SampleOptions) -> Self {
        let fake = FakeProc::new();
        fake.set_stat(sum(CPU0, CPU1), &[(0, CPU0), (1, CPU1)]);
        let sampler = Sampler::new(fake.root(), opts);
        Fixture {
            fake,
            sampler,
            tracker: Windows::new(hz),
            t: 1000,
        }
    }

    /// Samples the fake tree with a clock `secs` after the previous one.
    fn step(&mut self, secs: u64) -> Option<Window> {
        self.t += secs;
        let mut s = self.sampler.sample().unwrap();
        s.clock = Some(clock(self.t));
        self.tracker.update(&s)
    }
}

fn proc_row(w: &Window, pid: i32) -> &TaskWindow {
    let rows: Vec<_> = w
        .processes
        .iter()
        .filter(|p| p.pid == pid && !p.removed)
        .collect();
    assert_eq!(rows.len(), 1, "{pid}: {:?}", w.processes);
    rows[0]
}

#[test]
fn first_sample_is_baseline_only() {
    let mut f = Fixture::new(100, SampleOptions::default());
    f.fake.set_process(&task(10, "init", 5, 5, 1));
    assert!(f.step(0).is_none());
    let c0 = add(CPU0, 3, 100);
    f.fake.set_stat(sum(c0, CPU1), &[(0, c0), (1, CPU1)]);
    let w = f.step(1).unwrap();
    let p = proc_row(&w, 10);
    assert!(!p.added && !p.removed && !p.working);
    assert_eq!(p.delta, Some(TaskDelta::default()));
    assert_eq!(w.drops, DropCounters::default());
}

#[test]
fn deltas_shares_and_both_clocks() {
    let mut f = Fixture::new(100, SampleOptions::default());
    f.fake.set_process(&task(10, "spin", 1000, 200, 7));
    f.step(0);
    // 2 s window: the process used 150+50 = 200 ticks = 2 s of CPU.
    let mut t = task(10, "spin", 1150, 250, 7);
    t.minflt = 130;
    t.majflt = 3;
    f.fake.set_process(&t);
    let c0 = add(add(CPU0, 0, 150), 3, 50);
    let c1 = add(add(CPU1, 2, 50), 3, 150);
    f.fake.set_stat(sum(c0, c1), &[(0, c0), (1, c1)]);
    let w = f.step(2).unwrap();

    assert_eq!(w.clocks.monotonic_ns, Some(2_000_000_000));
    assert_eq!(w.clocks.boottime_ns, Some(2_000_000_000));
    let sys = w.system.as_ref().unwrap();
    assert_eq!(sys.total_ticks, 400);
    assert_eq!(sys.local_busy_ticks, 200);
    assert_eq!(sys.local_busy_pct, 50.0);
    assert_eq!(
        sys.total_formula,
        "user+nice+system+idle+iowait+irq+softirq+steal"
    );
    let p = proc_row(&w, 10);
    assert_eq!(
        p.delta,
        Some(TaskDelta {
            utime_ticks: 150,
            stime_ticks: 50,
            minflt: 30,
            majflt: 1
        })
    );
    assert!(p.working);
    assert_eq!(p.core_equivalent_pct, Some(100.0));
    assert_eq!(p.machine_share_pct, Some(50.0));
}

#[test]
fn clock_tick_other_than_100() {
    // USER_HZ 250: 250 ticks over a 1 s window is one full core.
    let mut f = Fixture::new(250, SampleOptions::default());
    f.fake.set_process(&task(10, "spin", 0, 0, 7));
    f.step(0);
    f.fake.set_process(&task(10, "spin", 250, 0, 7));
    let w = f.step(1).unwrap();
    assert_eq!(w.hz, 250);
    assert_eq!(proc_row(&w, 10).core_equivalent_pct, Some(100.0));
    // The same numbers read with hz=100 would claim 250%.
    let mut g = Fixture::new(100, SampleOptions::default());
    g.fake.set_process(&task(10, "spin", 0, 0, 7));
    g.step(0);
    g.fake.set_process(&task(10, "spin", 250, 0, 7));
    assert_eq!(
        proc_row(&g.step(1).unwrap(), 10).core_equivalent_pct,
        Some(250.0)
    );
}

#[test]
fn guest_is_counted_inside_user_not_again() {
    let mut f = Fixture::new(100, SampleOptions::default());
    f.step(0);
    // 100 ticks of guest time: the kernel adds them to user *and* guest.
    let c0 = add(add(CPU0, 0, 100), 8, 100);
    let c1 = add(CPU1, 3, 100);
    f.fake.set_stat(sum(c0, c1), &[(0, c0), (1, c1)]);
    let w = f.step(1).unwrap();
    let sys = w.system.unwrap();
    assert_eq!(sys.delta.guest_ticks, 100);
    assert_eq!(
        sys.total_ticks, 200,
        "guest must not be added on top of user"
    );
    assert_eq!(sys.local_busy_pct, 50.0);
}

#[test]
fn iowait_going_backwards_drops_the_system_window() {
    let mut f = Fixture::new(100, SampleOptions::default());
    f.fake.set_process(&task(10, "p", 10, 0, 7));
    f.step(0);
    let mut c1 = add(CPU1, 0, 100);
    c1[4] -= 5; // iowait goes backwards on cpu1
    f.fake.set_stat(sum(CPU0, c1), &[(0, CPU0), (1, c1)]);
    f.fake.set_process(&task(10, "p", 20, 0, 7));
    let w = f.step(1).unwrap();
    assert!(
        w.system.is_none(),
        "never clamp: the window's system delta is dropped"
    );
    // Counted once, for the aggregate: the dropped window's per-CPU lines
    // are not looked at.
    assert_eq!(w.drops.negative_deltas, 1);
    let p = proc_row(&w, 10);
    assert_eq!(p.delta.unwrap().utime_ticks, 10);
    assert_eq!(p.machine_share_pct, None, "no valid total to divide by");
    assert_eq!(p.core_equivalent_pct, Some(10.0));
    // The next window is computed from the new baseline.
    let c1b = add(c1, 3, 100);
    f.fake.set_stat(sum(CPU0, c1b), &[(0, CPU0), (1, c1b)]);
    let w = f.step(1).unwrap();
    assert_eq!(w.system.unwrap().total_ticks, 100);
    assert_eq!(f.tracker.tasks.drop_totals().negative_deltas, 1);
}

#[test]
fn process_counter_going_backwards_is_dropped_not_clamped() {
    let mut f = Fixture::new(100, SampleOptions::default());
    f.fake.set_process(&task(10, "p", 50, 50, 7));
    f.step(0);
    f.fake.set_process(&task(10, "p", 40, 60, 7));
    let w = f.step(1).unwrap();
    let p = proc_row(&w, 10);
    assert_eq!(p.delta, None);
    assert_eq!(p.core_equivalent_pct, None);
    assert_eq!(w.drops.negative_deltas, 1);
}

#[test]
fn pid_reuse_with_new_starttime_is_a_new_process() {
    let mut f = Fixture::new(100, SampleOptions::default());
    f.fake.set_process(&task(10, "old", 500, 0, 7));
    f.step(0);
    f.fake.set_process(&task(10, "new", 3, 0, 900));
    let w = f.step(1).unwrap();
    assert_eq!(w.drops.starttime_changes, 1);
    let rows: Vec<_> = w.processes.iter().filter(|p| p.pid == 10).collect();
    assert_eq!(rows.len(), 2);
    let old = rows.iter().find(|p| p.removed).unwrap();
    assert_eq!((old.comm.as_bytes(), old.starttime_ticks), (&b"old"[..], 7));
    let new = rows.iter().find(|p| p.added).unwrap();
    assert_eq!(
        (new.comm.as_bytes(), new.starttime_ticks),
        (&b"new"[..], 900)
    );
    assert_eq!(new.delta, None, "no delta across two instances");
    // Next window: the new instance has a normal delta.
    f.fake.set_process(&task(10, "new", 13, 0, 900));
    let w = f.step(1).unwrap();
    assert_eq!(proc_row(&w, 10).delta.unwrap().utime_ticks, 10);
}

#[test]
fn added_removed_and_working_sets() {
    let mut f = Fixture::new(100, SampleOptions::default());
    f.fake.set_process(&task(10, "idle", 1, 1, 7));
    f.fake.set_process(&task(11, "busy", 1, 1, 8));
    f.fake.set_process(&task(12, "exits", 1, 1, 9));
    f.step(0);
    f.fake.set_process(&task(11, "busy", 5, 1, 8));
    f.fake.remove("12");
    f.fake.set_process(&task(13, "born", 0, 0, 50));
    let w = f.step(1).unwrap();
    let pids = |it: &mut dyn Iterator<Item = &TaskWindow>| {
        let mut v: Vec<i32> = it.map(|p| p.pid).collect();
        v.sort();
        v
    };
    assert_eq!(pids(&mut w.added_processes()), vec![13]);
    assert_eq!(pids(&mut w.removed_processes()), vec![12]);
    assert_eq!(pids(&mut w.working_processes()), vec![11, 12, 13]);
    // An exit seen by the tracker is a normal event, not a vanished read.
    assert_eq!(w.drops.vanished_pids, 0);
}

#[test]
fn vanished_between_readdir_and_open_is_counted_not_an_error() {
    let mut f = Fixture::new(100, SampleOptions::default());
    f.fake.set_process(&task(10, "p", 1, 1, 7));
    f.step(0);
    // readdir still lists /proc/10 but its stat is gone: open gets ENOENT.
    f.fake.remove("10/stat");
    let w = f.step(1).unwrap();
    assert_eq!(w.drops.vanished_pids, 1);
    assert_eq!(w.drops.read_failures, 0);
    assert_eq!(w.removed_processes().count(), 1);
}

#[test]
fn vanished_thread_is_counted() {
    let mut f = Fixture::new(
        100,
        SampleOptions {
            threads: true,
            ..SampleOptions::default()
        },
    );
    f.fake.set_process(&task(10, "p", 1, 1, 7));
    f.fake.set_thread(10, &task(11, "worker", 1, 1, 8));
    f.step(0);
    f.fake.set_thread(10, &task(11, "worker", 21, 1, 8));
    let w = f.step(1).unwrap();
    let t = w.threads.iter().find(|t| t.pid == 11).unwrap();
    assert_eq!((t.tgid, t.delta.unwrap().utime_ticks), (10, 20));
    assert_eq!(t.core_equivalent_pct, Some(20.0));
    f.fake.remove("10/task/11/stat");
    let w = f.step(1).unwrap();
    assert_eq!(w.drops.vanished_tids, 1);
    assert!(w.threads.iter().any(|t| t.pid == 11 && t.removed));
}

#[test]
fn truncated_pid_stat_is_a_read_failure_and_keeps_the_instance() {
    let mut f = Fixture::new(100, SampleOptions::default());
    f.fake.set_process(&task(10, "p", 1, 1, 7));
    f.step(0);
    f.fake
        .write("10/stat", "10 (p) S 1 10 10 0 -1 4194560 100 0 2 0 5");
    let w = f.step(1).unwrap();
    assert_eq!(w.drops.read_failures, 1);
    assert_eq!(w.removed_processes().count(), 0, "unreadable is not exited");
    assert!(w.processes.iter().all(|p| p.pid != 10));
    // After the gap, re-baseline: no delta spanning two windows, not "added".
    f.fake.set_process(&task(10, "p", 100, 1, 7));
    let w = f.step(1).unwrap();
    let p = proc_row(&w, 10);
    assert_eq!((p.delta, p.added), (None, false));
    f.fake.set_process(&task(10, "p", 110, 1, 7));
    assert_eq!(
        proc_row(&f.step(1).unwrap(), 10).delta.unwrap().utime_ticks,
        10
    );
}

#[test]
fn comm_with_spaces_and_parens_through_the_whole_path() {
    let mut f = Fixture::new(
        100,
        SampleOptions {
            cmdline: true,
            status: true,
            threads: false,
        },
    );
    f.fake.set_process(&task(10, "my app) (x", 1, 1, 7));
    f.step(0);
    f.fake.set_process(&task(10, "my app) (x", 3, 1, 7));
    let w = f.step(1).unwrap();
    let p = proc_row(&w, 10);
    assert_eq!(p.comm.as_bytes(), b"my app) (x");
    assert_eq!(p.delta.unwrap().utime_ticks, 2);
    assert_eq!(p.status.unwrap().vm_rss_kb, Some(2048));
    let argv: Vec<&str> = crate::procfs::cmdline::argv(p.cmdline.as_deref().unwrap()).collect();
    assert_eq!(argv, vec!["/usr/bin/my app) (x", "--flag"]);
    assert_eq!(p.name(), "my app) (x");
}

#[test]
fn hotplug_changes_the_per_cpu_set() {
    let mut f = Fixture::new(100, SampleOptions::default());
    f.step(0);
    // cpu1 goes offline; the aggregate (summed over possible CPUs) goes on.
    let c0 = add(CPU0, 3, 100);
    f.fake.set_stat(sum(c0, CPU1), &[(0, c0)]);
    let w = f.step(1).unwrap();
    let sys = w.system.unwrap();
    assert_eq!(sys.online_cpus, vec![0]);
    assert_eq!(sys.cpus_offlined, vec![1]);
    assert_eq!(
        sys.per_cpu.iter().map(|(c, _)| *c).collect::<Vec<_>>(),
        vec![0]
    );
    // cpu1 comes back with counters that moved on.
    let c1 = add(CPU1, 3, 50);
    let c0 = add(c0, 3, 100);
    f.fake.set_stat(sum(c0, c1), &[(0, c0), (1, c1)]);
    let sys = f.step(1).unwrap().system.unwrap();
    assert_eq!(sys.cpus_onlined, vec![1]);
    assert_eq!(
        sys.per_cpu.len(),
        1,
        "cpu1 had no baseline in the previous sample"
    );
    assert_eq!(sys.total_ticks, 150);
}

#[test]
fn clock_not_advancing_is_counted() {
    let mut f = Fixture::new(100, SampleOptions::default());
    f.fake.set_process(&task(10, "p", 1, 1, 7));
    f.step(0);
    f.fake.set_process(&task(10, "p", 2, 1, 7));
    let c0 = add(CPU0, 3, 10);
    f.fake.set_stat(sum(c0, CPU1), &[(0, c0), (1, CPU1)]);
    let w = f.step(0).unwrap();
    assert_eq!(w.clocks.monotonic_ns, None);
    assert_eq!(w.drops.clock_not_advancing, 1);
    let p = proc_row(&w, 10);
    assert_eq!(p.core_equivalent_pct, None);
    assert_eq!(p.delta.unwrap().utime_ticks, 1);
    // /proc/stat's tick total not advancing is the same kind of drop.
    let w = f.step(1).unwrap();
    assert!(w.system.is_none());
    assert_eq!(w.drops.clock_not_advancing, 1);
}

#[test]
fn psi_absent_is_unavailable_not_an_error() {
    let mut f = Fixture::new(100, SampleOptions::default());
    f.fake.remove("pressure");
    f.step(0);
    let w = f.step(1).unwrap();
    assert_eq!(w.pressure, [Some(PsiState::Unavailable); 3]);
    assert_eq!(w.drops.read_failures, 0);
}

#[test]
fn psi_present_is_parsed() {
    let mut f = Fixture::new(100, SampleOptions::default());
    f.step(0);
    let w = f.step(1).unwrap();
    match w.pressure[0] {
        Some(PsiState::Available(p)) => assert_eq!(p.some.total_us, 1000),
        other => panic!("{other:?}"),
    }
    assert!(w.loadavg.is_some());
}

#[test]
fn android_legacy_total_differs_and_is_labelled() {
    let mut f = Fixture::new(100, SampleOptions::default());
    f.step(0);
    // 50 user, 50 iowait, 50 softirq, 50 idle.
    let c0 = add(add(add(add(CPU0, 0, 50), 4, 50), 6, 50), 3, 50);
    f.fake.set_stat(sum(c0, CPU1), &[(0, c0), (1, CPU1)]);
    let sys = f.step(1).unwrap().system.unwrap();
    assert_eq!(sys.local_busy_pct, 50.0); // (50+50)/200
    assert_eq!(sys.android_legacy_total_cpu_pct, Some(50.0)); // 50/(50+50)
    assert!(ANDROID_LEGACY_TOTAL_FORMULA.contains("irq) / ("));
}

/// Root bypasses file modes, so drop CAP_DAC_* in this thread only (capset
/// is per-thread) before reading a mode-000 file.
#[test]
fn unreadable_pid_eacces_is_a_read_failure() {
    let mut f = Fixture::new(100, SampleOptions::default());
    f.fake.set_process(&task(10, "secret", 1, 1, 7));
    f.fake.set_process(&task(11, "open", 1, 1, 8));
    f.step(0);
    let stat = f.fake.root().join("10/stat");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&stat, std::fs::Permissions::from_mode(0o000)).unwrap();
    let root = f.fake.root().to_owned();
    let sample = std::thread::spawn(move || {
        use caps::{CapSet, Capability};
        for cap in [
            Capability::CAP_DAC_OVERRIDE,
            Capability::CAP_DAC_READ_SEARCH,
        ] {
            let _ = caps::drop(None, CapSet::Effective, cap);
        }
        let err = std::fs::read(root.join("10/stat")).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EACCES));
        Sampler::new(&root, SampleOptions::default())
            .sample()
            .unwrap()
    })
    .join()
    .unwrap();
    assert_eq!(sample.counts.read_failures, 1);
    assert_eq!(sample.counts.vanished_pids, 0);
    assert_eq!(sample.unreadable_pids, vec![10]);
    let mut s = sample;
    s.clock = Some(clock(f.t + 1));
    let w = f.tracker.update(&s).unwrap();
    assert_eq!(w.drops.read_failures, 1);
    assert_eq!(w.removed_processes().count(), 0);
    assert!(w.processes.iter().any(|p| p.pid == 11));
}

// The real-machine 80-105% window check lives with the kernel tests
// (tests/tests/accounting.rs, procfs_core_equivalent_agrees_with_ebpf): they
// run one at a time, so the spinner is not starved by parallel unit tests.

// The tasks room's counter tracks.

/// (pid, counter name) -> values, from a trace `write_window` wrote.
fn process_counters(trace: &[u8]) -> HashMap<(i32, String), Vec<i64>> {
    let trace = protos::Trace::decode(trace).unwrap();
    let mut pid_of_track = HashMap::new();
    let mut name_of_track = HashMap::new();
    for p in &trace.packet {
        if let Some(Data::TrackDescriptor(d)) = &p.data {
            if let Some(pr) = &d.process {
                pid_of_track.insert(d.uuid(), pr.pid());
            }
            if let (Some(parent), Some(StaticOrDynamicName::Name(n))) =
                (d.parent_uuid, &d.static_or_dynamic_name)
            {
                name_of_track.insert(d.uuid(), (parent, n.clone()));
            }
        }
    }
    let mut out: HashMap<(i32, String), Vec<i64>> = HashMap::new();
    for p in &trace.packet {
        let Some(Data::TrackEvent(e)) = &p.data else {
            continue;
        };
        let Some((parent, name)) = name_of_track.get(&e.track_uuid()) else {
            continue;
        };
        let Some(pid) = pid_of_track.get(parent) else {
            continue;
        };
        let value = match e.counter_value_field {
            Some(CounterValueField::CounterValue(v)) => v,
            Some(CounterValueField::DoubleCounterValue(v)) => v as i64,
            None => continue,
        };
        out.entry((*pid, name.clone())).or_default().push(value);
    }
    out
}

#[test]
fn faults_without_a_cpu_tick_are_written() {
    const CPU: Cols = [100, 0, 50, 1000, 10, 0, 5, 0, 0, 0];
    let fake = FakeProc::new();
    fake.set_stat(CPU, &[(0, CPU)]);
    let task = |minflt, utime| Task {
        pid: 42,
        comm: "toucher",
        minflt,
        majflt: 0,
        utime,
        stime: 0,
        starttime: 7,
    };
    fake.set_process(&task(100, 10));
    let mut sampler = Sampler::new(fake.root(), SampleOptions::default());
    let mut tracker = Windows::new(100);
    let mut sample = |s: u64| {
        let mut x = sampler.sample().unwrap();
        x.clock = Some(ClockPair {
            boottime_ns: s * 1_000_000_000,
            monotonic_ns: s * 1_000_000_000,
        });
        x
    };
    assert!(tracker.update(&sample(1)).is_none());
    // 5000 faults and no tick: not in ProcessCpuTracker's working set.
    fake.set_stat(add_idle(CPU, 100), &[(0, add_idle(CPU, 100))]);
    fake.set_process(&task(5100, 10));
    let window = tracker.update(&sample(2)).expect("a window");
    let row = window.processes.iter().find(|p| p.pid == 42).unwrap();
    assert!(!row.working);
    let mut w = crate::perfetto::TraceWriter::new(Vec::new());
    tracks::write_window(&mut w, 2_000_000_000, &window).unwrap();
    let counters = process_counters(&w.into_inner());
    assert_eq!(
        counters.get(&(42, "procfs.minflt_delta".to_owned())),
        Some(&vec![5000]),
        "{counters:?}"
    );
}

fn add_idle(mut c: Cols, ticks: u64) -> Cols {
    c[3] += ticks;
    c
}

#[test]
fn tick_conversion_uses_hz_and_does_not_overflow() {
    assert_eq!(crate::sources::tracks::ticks_to_ns(250, 250), 1_000_000_000);
    assert_eq!(crate::sources::tracks::ticks_to_ns(100, 100), 1_000_000_000);
    // 300 days at HZ=1000 would overflow u64 ns if multiplied first.
    let ticks = 300 * 86_400 * 1000u64;
    assert_eq!(
        crate::sources::tracks::ticks_to_ns(ticks, 1000),
        300 * 86_400 * 1_000_000_000
    );
}
