//! The eBPF accounting room: the always-on programs' maps, folded into
//! per-process cumulative counters (`bpf::totals`), their per-window
//! deltas, the drop counters the programs keep, and the columns they give
//! `top`. The programs are loaded by `bpf` (`bpf::denied::load`); this
//! room reads them through `Accounting::read`, the one reader.

mod programs;
#[cfg(test)]
mod tests;

pub use programs::Programs;

use std::collections::{BTreeMap, HashMap};
use std::io::Write;

use super::{
    tasks::{DropCounters, TaskWindow},
    tracks::{global_counter, spec},
    Source, Tick,
};
use crate::{
    accounting::ProcessCounters,
    bpf::{totals::Totals, FaultSource},
    control::protocol::{TopEbpf, TopRow},
    perfetto::{CounterUnit, CounterValue, PerfettoError, TraceWriter},
};

/// The source: the programs' maps and what it folded from them so far.
pub struct Ebpf {
    programs: Programs,
    totals: Totals,
    deltas: CounterDeltas,
}

impl Ebpf {
    pub fn new(programs: Programs) -> Self {
        Self {
            programs,
            totals: Totals::new(),
            deltas: CounterDeltas::default(),
        }
    }

    /// The programs, for a recording's capture tier.
    pub fn programs(&self) -> &Programs {
        &self.programs
    }

    /// The fault source and whether runqueue wait is accounted.
    pub fn fault_source_and_runq_wait(&self) -> (FaultSource, bool) {
        self.programs
            .with(|acc| (acc.fault_source(), acc.runq_wait()))
    }

    /// The programs' cumulative drop counters as last read, by name.
    pub fn drops(&self) -> Vec<(&'static str, u64)> {
        named_drops(&self.totals.drops)
    }
}

impl Source for Ebpf {
    /// Reads the maps before the procfs scan: a process born after this
    /// read is named from the scan (`Recording::name_scanned_only`).
    /// Folding drains the EXITED map and keeps the drop counters current.
    fn read(&mut self, tick: &mut Tick) {
        match self.programs.with(|acc| acc.read()) {
            Ok(snap) => {
                tick.rows = self.totals.update(&snap);
                // The snapshot's own clock, which its running tasks'
                // in-flight slices run to.
                self.deltas.update(tick, snap.monotonic_ns);
                tick.bpf_drops = Some(snap.drops);
                tick.wakers = snap.wakers;
            }
            Err(e) => tick.bpf_error = Some(e),
        }
    }

    fn columns(&self, tick: &Tick, task: &TaskWindow, row: &mut TopRow) {
        top_columns(tick, task, row);
    }

    /// `bpf_drops`: the programs' drop counters, the deltas dropped, and
    /// the threads seen alive whose exit record never came (EXITED full):
    /// folded into their process from their last counters.
    fn status(&self, out: &mut BTreeMap<&'static str, BTreeMap<String, u64>>) {
        let mut drops: BTreeMap<String, u64> = self
            .drops()
            .into_iter()
            .map(|(n, v)| (n.to_string(), v))
            .collect();
        drops.insert("negative_deltas".into(), self.deltas.drops.negative_deltas);
        drops.insert("lost_exits".into(), self.totals.lost_exits);
        out.insert("bpf_drops", drops);
    }
}

/// One process's eBPF figures over a window: deltas of the cumulative
/// counters `bpf::totals` keeps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BpfDelta {
    pub tgid: u32,
    pub oncpu_ns: u64,
    pub runq_wait_ns: u64,
    pub voluntary_switches: u64,
    pub involuntary_switches: u64,
    /// Off-CPU accounting's blocked time (S, D), long blocks and blocks
    /// ended by a wakeup (zero while it is off; see `sources::offcpu`).
    pub blocked_s_ns: u64,
    pub blocked_d_ns: u64,
    pub long_blocks: u64,
    pub wakeups: u64,
}

/// Per-window eBPF deltas, by the same rules as the procfs ones: a process
/// seen for the first time has no delta (its counters may span more than
/// the window), and a counter that went backwards drops that process's
/// delta and counts in `negative_deltas`, never clamped. `prev` becomes `cur`.
pub fn bpf_deltas(
    prev: &mut HashMap<u32, ProcessCounters>,
    cur: &[ProcessCounters],
    drops: &mut DropCounters,
) -> Vec<BpfDelta> {
    let mut out = Vec::new();
    for c in cur {
        // An ended row is the last of its instance; a live row of the same
        // tgid after it is a new process, with no baseline yet.
        let p = if c.ended {
            prev.remove(&c.tgid)
        } else {
            prev.get(&c.tgid).copied()
        };
        if let Some(p) = p {
            let d = (|| {
                Some(BpfDelta {
                    tgid: c.tgid,
                    oncpu_ns: c.oncpu_ns.checked_sub(p.oncpu_ns)?,
                    runq_wait_ns: c.runq_wait_ns.checked_sub(p.runq_wait_ns)?,
                    voluntary_switches: c.voluntary_switches.checked_sub(p.voluntary_switches)?,
                    involuntary_switches: c
                        .involuntary_switches
                        .checked_sub(p.involuntary_switches)?,
                    blocked_s_ns: c.offcpu.blocked_s_ns.checked_sub(p.offcpu.blocked_s_ns)?,
                    blocked_d_ns: c.offcpu.blocked_d_ns.checked_sub(p.offcpu.blocked_d_ns)?,
                    long_blocks: c.offcpu.long_blocks.checked_sub(p.offcpu.long_blocks)?,
                    wakeups: c.offcpu.wakeups.checked_sub(p.offcpu.wakeups)?,
                })
            })();
            match d {
                Some(d) => out.push(d),
                None => drops.negative_deltas += 1,
            }
        }
    }
    prev.clear();
    // An ended process's tgid may be reused: forget it.
    prev.extend(cur.iter().filter(|c| !c.ended).map(|c| (c.tgid, *c)));
    out
}

/// The previous counters of every process and the deltas dropped: turns
/// each tick's cumulative rows (either tier) into per-window deltas.
#[derive(Default)]
pub struct CounterDeltas {
    prev: HashMap<u32, ProcessCounters>,
    /// When `prev` was read (the source's clock).
    prev_read_ns: Option<u64>,
    pub drops: DropCounters,
}

impl CounterDeltas {
    /// This window's deltas by tgid (`bpf_deltas`) into `tick.deltas`, and
    /// the window's measured length: `rows` were read at `read_ns` (one
    /// clock per source: the eBPF snapshot's CLOCK_MONOTONIC, the scan's
    /// CLOCK_BOOTTIME).
    pub fn update(&mut self, tick: &mut Tick, read_ns: u64) {
        tick.deltas = bpf_deltas(&mut self.prev, &tick.rows, &mut self.drops)
            .into_iter()
            .map(|d| (d.tgid, d))
            .collect();
        tick.deltas_window_ns = self
            .prev_read_ns
            .replace(read_ns)
            .map(|prev| read_ns.saturating_sub(prev));
    }
}

/// The programs' drop counters (`drop_reason`) by name.
pub fn named_drops(
    drops: &[u64; vitals_common::drop_reason::COUNT as usize],
) -> Vec<(&'static str, u64)> {
    vitals_common::drop_reason::NAMES
        .iter()
        .zip(drops)
        .map(|(n, v)| (*n, *v))
        .collect()
}

/// The per-task figures of `task`'s window (either tier: the schedstat
/// room offers the same columns from its deltas).
pub fn top_columns(tick: &Tick, task: &TaskWindow, row: &mut TopRow) {
    row.ebpf = tick.deltas.get(&(task.pid as u32)).map(|d| TopEbpf {
        oncpu_ms: d.oncpu_ns as f64 / 1e6,
        runq_wait_ms: d.runq_wait_ns as f64 / 1e6,
        voluntary_switches: d.voluntary_switches,
        involuntary_switches: d.involuntary_switches,
    });
}

/// The eBPF programs' drop counters (`drop_reason`), cumulative since
/// the programs were loaded, one track per reason: `exited_map_full`
/// counts freed tasks whose final counters found EXITED full.
pub fn write_drops<W: Write>(
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
