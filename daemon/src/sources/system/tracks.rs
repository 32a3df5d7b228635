//! The system room's packets: native SysStats (cpu_stat: cumulative
//! per-CPU times in ns; psi: cumulative stall totals in ns) so
//! trace_processor's own tables fill in, and TrackEvent counters for the
//! rest (loadavg, PSI averages, local busy CPU named by its formula).

use std::io::Write;

use crate::{
    perfetto::{
        CounterSpec, CounterUnit, CounterValue, CpuTimesNs, PerfettoError, PsiResource, TraceWriter,
    },
    procfs::{loadavg::LoadAvg, pressure::PsiState, sampler::Sample, stat::CpuTimes},
    sources::tracks::{global_counter, pct, spec, ticks_to_ns},
};

use super::SystemWindow;

/// What a window of this room holds: loadavg and PSI as read at its end,
/// local busy CPU over it (None: no delta this window).
pub struct SystemFigures<'a> {
    pub loadavg: Option<&'a LoadAvg>,
    pub system: Option<&'a SystemWindow>,
    pub pressure: &'a [Option<PsiState>; 3],
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

/// SysStats from one raw sample: per-CPU times and PSI totals.
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
    w.write_psi(ts_boot_ns, &psi)
}

/// A window's counters: loadavg, local busy CPU and the PSI averages.
pub fn write_window<W: Write>(
    w: &mut TraceWriter<W>,
    ts_boot_ns: u64,
    win: SystemFigures<'_>,
) -> Result<(), PerfettoError> {
    let global = |w: &mut TraceWriter<W>, s: CounterSpec, v: CounterValue| {
        global_counter(w, ts_boot_ns, s, v)
    };
    if let Some(l) = win.loadavg {
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
    if let Some(sys) = win.system {
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
