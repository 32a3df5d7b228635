//! The tasks room's packets: native ProcessStats (memory in kB,
//! runtime_user_mode / runtime_kernel_mode in ns), then per window the
//! procfs drop counters and each process's CPU shares (each named by its
//! formula) and fault deltas.

use std::io::Write;

use crate::{
    perfetto::{
        CounterSpec, CounterUnit, CounterValue, PerfettoError, ProcessKey, ProcessStatsEntry,
        TraceWriter,
    },
    procfs::sampler::Sample,
    sources::tracks::{global_counter, pct, spec, ticks_to_ns},
};

use super::{Window, CORE_EQUIVALENT_FORMULA, MACHINE_SHARE_FORMULA};

/// ProcessStats from one raw sample.
pub fn write_sample<W: Write>(
    w: &mut TraceWriter<W>,
    ts_boot_ns: u64,
    sample: &Sample,
    hz: u64,
) -> Result<(), PerfettoError> {
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

/// A window's counters: the drop counters, then each working process's.
pub fn write_window<W: Write>(
    w: &mut TraceWriter<W>,
    ts_boot_ns: u64,
    win: &Window,
) -> Result<(), PerfettoError> {
    write_drop_counters(w, ts_boot_ns, win)?;
    write_process_counters(w, ts_boot_ns, win)
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
