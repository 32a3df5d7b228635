//! The history as Perfetto packets: what a triggered capture's trace (and
//! the producer's prelude) starts with. Each source writes its own
//! packets (`sources::*::tracks`).

use std::io::Write;

use crate::{
    perfetto::{CounterUnit, CounterValue, PerfettoError, ProcessKey, TraceWriter},
    sources::{
        system::figures::{LOADAVG_1M, LOCAL_BUSY_PCT},
        tasks::{figures::CORE_EQUIVALENT_PCT, CORE_EQUIVALENT_FORMULA},
        tracks::{pct, spec},
    },
};

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
        if let Some(v) = s.figures.get(LOCAL_BUSY_PCT.name) {
            w.write_counter(s.boottime_ns, busy, CounterValue::Double(v))?;
        }
        if let Some(v) = s.figures.get(LOADAVG_1M.name) {
            w.write_counter(s.boottime_ns, load, CounterValue::Double(v))?;
        }
        for p in &s.processes {
            let Some(core_equivalent_pct) = p.figures.get(CORE_EQUIVALENT_PCT.name) else {
                continue;
            };
            let key = ProcessKey {
                pid: p.pid,
                starttime_ticks: p.starttime_ticks,
            };
            let t = w.process_counter_track(
                key,
                &p.name,
                &pct("history.core_equivalent_pct", CORE_EQUIVALENT_FORMULA),
            )?;
            w.write_counter(s.boottime_ns, t, CounterValue::Double(core_equivalent_pct))?;
        }
    }
    Ok(())
}
