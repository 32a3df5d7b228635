//! procfs samples and tracker windows as Perfetto packets.
//!
//! Native packets where Perfetto has them, so trace_processor's own tables
//! fill in: SysStats.cpu_stat (cumulative per-CPU times, ns), SysStats.psi
//! (cumulative stall totals, ns), ProcessStats (memory in kB,
//! runtime_user_mode / runtime_kernel_mode in ns). TrackEvent counters for
//! the rest: loadavg, PSI averages, the two CPU shares (each named by its
//! formula), per-window fault deltas, and every drop counter.

use std::io::Write;

use crate::{
    perfetto::{
        CounterSpec, CounterUnit, CounterValue, CpuTimesNs, PerfettoError, ProcessKey,
        ProcessStatsEntry, PsiResource, TraceWriter,
    },
    procfs::{pressure::PsiState, sampler::Sample, stat::CpuTimes},
    tracker::{Window, CORE_EQUIVALENT_FORMULA, MACHINE_SHARE_FORMULA},
};

fn ticks_to_ns(ticks: u64, hz: u64) -> u64 {
    // u128: ticks * 1e9 overflows u64 after ~213 days at HZ=1000.
    (ticks as u128 * 1_000_000_000 / hz.max(1) as u128) as u64
}

fn cpu_times_ns(cpu_id: u32, t: &CpuTimes, hz: u64) -> CpuTimesNs {
    CpuTimesNs {
        cpu_id,
        // /proc/stat user and nice already include guest and guest_nice.
        user_ns: ticks_to_ns(t.user_ticks, hz),
        user_nice_ns: ticks_to_ns(t.nice_ticks, hz),
        system_mode_ns: ticks_to_ns(t.system_ticks, hz),
        idle_ns: ticks_to_ns(t.idle_ticks, hz),
        io_wait_ns: ticks_to_ns(t.iowait_ticks, hz),
        irq_ns: ticks_to_ns(t.irq_ticks, hz),
        softirq_ns: ticks_to_ns(t.softirq_ticks, hz),
        steal_ns: ticks_to_ns(t.steal_ticks, hz),
    }
}

fn spec(name: &str, unit: CounterUnit, description: &str) -> CounterSpec {
    CounterSpec {
        name: name.into(),
        unit,
        description: Some(description.into()),
    }
}

fn pct(name: &str, formula: &str) -> CounterSpec {
    spec(name, CounterUnit::Custom("%".into()), formula)
}

/// Native packets from one raw sample.
pub fn write_sample<W: Write>(
    w: &mut TraceWriter<W>,
    ts_boot_ns: u64,
    sample: &Sample,
    hz: u64,
) -> Result<(), PerfettoError> {
    if let Some(sys) = &sample.system {
        let cpus: Vec<CpuTimesNs> = sys
            .per_cpu
            .iter()
            .map(|(id, t)| cpu_times_ns(*id, t, hz))
            .collect();
        w.write_cpu_stats(ts_boot_ns, &cpus)?;
    }
    let mut psi = Vec::new();
    let kinds = [
        (PsiResource::CpuSome, PsiResource::CpuFull),
        (PsiResource::MemorySome, PsiResource::MemoryFull),
        (PsiResource::IoSome, PsiResource::IoFull),
    ];
    for (state, (some, full)) in sample.pressure.iter().zip(kinds) {
        if let Some(PsiState::Available(p)) = state {
            // /proc/pressure totals are in microseconds.
            psi.push((some, p.some.total_us.saturating_mul(1000)));
            if let Some(f) = &p.full {
                psi.push((full, f.total_us.saturating_mul(1000)));
            }
        }
    }
    w.write_psi(ts_boot_ns, &psi)?;
    let procs: Vec<ProcessStatsEntry> = sample
        .processes
        .iter()
        .map(|p| ProcessStatsEntry {
            pid: p.stat.pid,
            vm_size_kb: None,
            vm_rss_kb: p.status.as_ref().and_then(|s| s.vm_rss_kb),
            rss_anon_kb: p.status.as_ref().and_then(|s| s.rss_anon_kb),
            rss_file_kb: p.status.as_ref().and_then(|s| s.rss_file_kb),
            rss_shmem_kb: p.status.as_ref().and_then(|s| s.rss_shmem_kb),
            vm_swap_kb: p.status.as_ref().and_then(|s| s.vm_swap_kb),
            runtime_user_mode_ns: Some(ticks_to_ns(p.stat.utime_ticks, hz)),
            runtime_kernel_mode_ns: Some(ticks_to_ns(p.stat.stime_ticks, hz)),
        })
        .collect();
    w.write_process_stats(ts_boot_ns, &procs)
}

/// TrackEvent counters from one tracker window: the system-wide ones, the
/// drop counters, then each working process's.
pub fn write_window<W: Write>(
    w: &mut TraceWriter<W>,
    ts_boot_ns: u64,
    win: &Window,
) -> Result<(), PerfettoError> {
    write_system_counters(w, ts_boot_ns, win)?;
    write_drop_counters(w, ts_boot_ns, win)?;
    write_process_counters(w, ts_boot_ns, win)
}

/// One value on the global counter track `s`.
fn global_counter<W: Write>(
    w: &mut TraceWriter<W>,
    ts_boot_ns: u64,
    s: CounterSpec,
    v: CounterValue,
) -> Result<(), PerfettoError> {
    let t = w.global_counter_track(&s)?;
    w.write_counter(ts_boot_ns, t, v)
}

/// loadavg, local busy CPU and the PSI averages.
fn write_system_counters<W: Write>(
    w: &mut TraceWriter<W>,
    ts_boot_ns: u64,
    win: &Window,
) -> Result<(), PerfettoError> {
    let global = |w: &mut TraceWriter<W>, s: CounterSpec, v: CounterValue| {
        global_counter(w, ts_boot_ns, s, v)
    };
    if let Some(l) = &win.loadavg {
        for (name, v) in [
            ("loadavg.1m", l.load1),
            ("loadavg.5m", l.load5),
            ("loadavg.15m", l.load15),
        ] {
            global(
                w,
                spec(name, CounterUnit::Custom("tasks".into()), "/proc/loadavg"),
                CounterValue::Double(v as f64),
            )?;
        }
        global(
            w,
            spec(
                "loadavg.runnable_tasks",
                CounterUnit::Count,
                "/proc/loadavg field 4: runnable threads",
            ),
            CounterValue::Int(l.runnable_tasks as i64),
        )?;
    }
    if let Some(sys) = &win.system {
        global(
            w,
            pct(
                "cpu.local_busy_pct",
                &format!("({}) / ({})", sys.local_busy_formula, sys.total_formula),
            ),
            CounterValue::Double(sys.local_busy_pct),
        )?;
    }
    for (state, res) in win.pressure.iter().zip(["cpu", "memory", "io"]) {
        if let Some(PsiState::Available(p)) = state {
            global(
                w,
                pct(
                    &format!("psi.{res}.some.avg10"),
                    "/proc/pressure some avg10",
                ),
                CounterValue::Double(p.some.avg10_pct as f64),
            )?;
            if let Some(f) = &p.full {
                global(
                    w,
                    pct(
                        &format!("psi.{res}.full.avg10"),
                        "/proc/pressure full avg10",
                    ),
                    CounterValue::Double(f.avg10_pct as f64),
                )?;
            }
        }
    }
    Ok(())
}

/// The window's procfs drop counters, one track per reason.
fn write_drop_counters<W: Write>(
    w: &mut TraceWriter<W>,
    ts_boot_ns: u64,
    win: &Window,
) -> Result<(), PerfettoError> {
    let d = &win.drops;
    for (name, v) in [
        ("drops.procfs.read_failures", d.read_failures),
        ("drops.procfs.vanished_pids", d.vanished_pids),
        ("drops.procfs.vanished_tids", d.vanished_tids),
        ("drops.procfs.negative_deltas", d.negative_deltas),
        ("drops.procfs.clock_not_advancing", d.clock_not_advancing),
        ("drops.procfs.starttime_changes", d.starttime_changes),
    ] {
        global_counter(
            w,
            ts_boot_ns,
            spec(
                name,
                CounterUnit::Count,
                "deltas dropped in this window, by reason",
            ),
            CounterValue::Int(v as i64),
        )?;
    }
    Ok(())
}

/// The eBPF programs' drop counters (`drop_reason`), cumulative since
/// the programs were loaded, one track per reason: `exited_map_full`
/// counts freed tasks whose final counters found EXITED full.
pub fn write_bpf_drops<W: Write>(
    w: &mut TraceWriter<W>,
    ts_boot_ns: u64,
    drops: &[u64; vitals_common::drop_reason::COUNT as usize],
) -> Result<(), PerfettoError> {
    for (name, v) in vitals_common::drop_reason::NAMES.iter().zip(drops) {
        global_counter(
            w,
            ts_boot_ns,
            spec(
                &format!("drops.bpf.{name}"),
                CounterUnit::Count,
                "events the eBPF programs could not count, by reason, since load",
            ),
            CounterValue::Int(*v as i64),
        )?;
    }
    Ok(())
}

/// Per process: the working set (CPU moved, as ProcessCpuTracker reports
/// it) and every process whose faults moved. A process can take thousands
/// of faults inside one clock tick (a short page-touching burst), and its
/// faults are no less real for not having been charged a tick.
fn write_process_counters<W: Write>(
    w: &mut TraceWriter<W>,
    ts_boot_ns: u64,
    win: &Window,
) -> Result<(), PerfettoError> {
    for p in &win.processes {
        let Some(delta) = &p.delta else { continue };
        if !p.working && delta.minflt == 0 && delta.majflt == 0 {
            continue;
        }
        let key = ProcessKey {
            pid: p.pid,
            starttime_ticks: p.starttime_ticks,
        };
        let name = p.name();
        let put = |w: &mut TraceWriter<W>, s: CounterSpec, v: CounterValue| {
            let t = w.process_counter_track(key, &name, &s)?;
            w.write_counter(ts_boot_ns, t, v)
        };
        if let Some(v) = p.core_equivalent_pct {
            put(
                w,
                pct("procfs.core_equivalent_pct", CORE_EQUIVALENT_FORMULA),
                CounterValue::Double(v),
            )?;
        }
        if let Some(v) = p.machine_share_pct {
            put(
                w,
                pct("procfs.machine_share_pct", MACHINE_SHARE_FORMULA),
                CounterValue::Double(v),
            )?;
        }
        put(
            w,
            spec(
                "procfs.minflt_delta",
                CounterUnit::Count,
                "/proc/<pid>/stat minflt, this window",
            ),
            CounterValue::Int(delta.minflt as i64),
        )?;
        put(
            w,
            spec(
                "procfs.majflt_delta",
                CounterUnit::Count,
                "/proc/<pid>/stat majflt, this window",
            ),
            CounterValue::Int(delta.majflt as i64),
        )?;
    }
    Ok(())
}

/// The in-memory history as counters at their own timestamps, so a
/// triggered capture shows the minutes that led to the trigger.
pub fn write_history<W: Write>(
    w: &mut TraceWriter<W>,
    samples: &[crate::history::VitalsSample],
) -> Result<(), PerfettoError> {
    let busy = w.global_counter_track(&pct(
        "history.cpu.local_busy_pct",
        "(user+nice+system+irq+softirq) / total of /proc/stat, before the trigger",
    ))?;
    let load = w.global_counter_track(&spec(
        "history.loadavg.1m",
        CounterUnit::Custom("tasks".into()),
        "/proc/loadavg, before the trigger",
    ))?;
    for s in samples {
        if let Some(v) = s.local_busy_pct {
            w.write_counter(s.boottime_ns, busy, CounterValue::Double(v))?;
        }
        if let Some(v) = s.loadavg1 {
            w.write_counter(s.boottime_ns, load, CounterValue::Double(v as f64))?;
        }
        for p in &s.processes {
            let key = ProcessKey {
                pid: p.pid,
                starttime_ticks: p.starttime_ticks,
            };
            let t = w.process_counter_track(
                key,
                &p.name,
                &pct("history.core_equivalent_pct", CORE_EQUIVALENT_FORMULA),
            )?;
            w.write_counter(
                s.boottime_ns,
                t,
                CounterValue::Double(p.core_equivalent_pct),
            )?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ClockPair;
    use crate::procfs::testutil::{Cols, FakeProc, Task};
    use crate::procfs::{SampleOptions, Sampler};
    use crate::tracker::Tracker;
    use prost::Message;
    use std::collections::HashMap;
    use vitals_proto::protos::{
        self, trace_packet::Data, track_descriptor::StaticOrDynamicName,
        track_event::CounterValueField,
    };

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
        let mut tracker = Tracker::new(100);
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
        let mut w = TraceWriter::new(Vec::new());
        write_window(&mut w, 2_000_000_000, &window).unwrap();
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
        assert_eq!(ticks_to_ns(250, 250), 1_000_000_000);
        assert_eq!(ticks_to_ns(100, 100), 1_000_000_000);
        // 300 days at HZ=1000 would overflow u64 ns if multiplied first.
        let ticks = 300 * 86_400 * 1000u64;
        assert_eq!(ticks_to_ns(ticks, 1000), 300 * 86_400 * 1_000_000_000);
    }
}
