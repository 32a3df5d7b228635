//! What the rooms' counter tracks share: tick conversion and the specs of
//! TrackEvent counters.

use std::io::Write;

use crate::perfetto::{CounterSpec, CounterUnit, CounterValue, PerfettoError, TraceWriter};

pub fn ticks_to_ns(ticks: u64, hz: u64) -> u64 {
    // u128: ticks * 1e9 overflows u64 after ~213 days at HZ=1000.
    (ticks as u128 * 1_000_000_000 / hz.max(1) as u128) as u64
}

pub fn spec(name: &str, unit: CounterUnit, description: &str) -> CounterSpec {
    CounterSpec {
        name: name.into(),
        unit,
        description: Some(description.into()),
    }
}

pub fn pct(name: &str, formula: &str) -> CounterSpec {
    spec(name, CounterUnit::Custom("%".into()), formula)
}

/// One value on the global counter track `s`.
pub fn global_counter<W: Write>(
    w: &mut TraceWriter<W>,
    ts_boot_ns: u64,
    s: CounterSpec,
    v: CounterValue,
) -> Result<(), PerfettoError> {
    let t = w.global_counter_track(&s)?;
    w.write_counter(ts_boot_ns, t, v)
}
