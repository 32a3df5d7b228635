//! The one pipeline: every tick reads every registered source once (the
//! eBPF maps, then one procfs scan shared by the procfs rooms) into one
//! [`Tick`], which the caller hands to its sinks: `vitalsd record`'s trace
//! file (`record`), and in the daemon the history, status and top, the
//! Perfetto producer and a capture's recording (`service`). One pipeline
//! per process means procfs is scanned once per tick and the exited-task
//! map drained by one reader, even while a capture records.

use std::{collections::BTreeMap, path::Path};

use crate::{
    accounting::CounterOrigin,
    clock::ClockPair,
    control::protocol::TopRow,
    procfs::sampler::{SampleOptions, Sampler},
    sources::{ebpf::Programs, Sources, Tick},
};

/// The sampler, the rooms and the value of the last tick.
pub struct Pipeline {
    sampler: Sampler,
    pub sources: Sources,
    tick: Tick,
}

impl Pipeline {
    /// The pipeline over `proc_root` with every source that opens
    /// ([`Sources::open`]): the eBPF room on `programs`, or without them
    /// the CTS tier where the kernel has schedstat.
    pub fn open(proc_root: &Path, hz: u64, programs: Option<Programs>) -> Self {
        Self {
            // procfs alongside: system CPU, load, pressure, per-process
            // CPU, memory and faults as the kernel accounts them; its scan
            // also names processes.
            sampler: Sampler::new(
                proc_root,
                SampleOptions {
                    threads: false,
                    status: true,
                    cmdline: true,
                },
            ),
            sources: Sources::open(proc_root, hz, programs),
            tick: Tick {
                hz,
                ..Tick::default()
            },
        }
    }

    /// Where the per-task counters come from (None: clock ticks only).
    pub fn origin(&self) -> Option<CounterOrigin> {
        self.sources.origin()
    }

    /// One tick: the sources that do not scan (the eBPF maps: a process
    /// born after this read is named from the scan), the clocks, one
    /// procfs scan, then the rooms that derive from it. A failed read
    /// costs its part of this tick (`bpf_error`, `procfs_error`).
    pub fn tick(&mut self) -> &mut Tick {
        let t = &mut self.tick;
        t.clear();
        for s in self.sources.registered().into_iter().flatten() {
            s.read(t);
        }
        t.clocks = ClockPair::now();
        t.rows_boottime_ns = t.clocks.boottime_ns;
        self.scan();
        &mut self.tick
    }

    /// The first scan alone (a recording's baseline, before its first
    /// tick reads the eBPF maps).
    pub fn scan_only(&mut self) -> &mut Tick {
        self.tick.clear();
        self.tick.clocks = ClockPair::now();
        self.tick.rows_boottime_ns = self.tick.clocks.boottime_ns;
        self.scan();
        &mut self.tick
    }

    fn scan(&mut self) {
        let t = &mut self.tick;
        match self.sampler.sample_into(&mut t.sample) {
            Ok(()) => {
                t.scanned = true;
                for s in self.sources.registered().into_iter().flatten() {
                    s.sample(t);
                }
            }
            Err(e) => t.procfs_error = Some(e),
        }
    }

    /// The last tick's value.
    pub fn last(&self) -> &Tick {
        &self.tick
    }

    /// The 50 working processes using the most CPU in the last window,
    /// each row filled by every room's columns.
    pub fn top_rows(&self) -> Vec<TopRow> {
        let Some(w) = &self.tick.window else {
            return Vec::new();
        };
        top_rows(&self.tick, w, |task, row| {
            for s in self.sources.each() {
                s.columns(&self.tick, task, row);
            }
        })
    }

    /// Every room's line of a recording's summary.
    pub fn summary(&self) -> Vec<String> {
        self.sources.each().filter_map(|s| s.summary()).collect()
    }

    /// Every room's status counters, by status field.
    pub fn status(&self) -> BTreeMap<&'static str, BTreeMap<String, u64>> {
        let mut out = BTreeMap::new();
        for s in self.sources.each() {
            s.status(&mut out);
        }
        out
    }
}

/// The 50 working processes of `w` using the most CPU, filled by `fill`.
fn top_rows(
    tick: &Tick,
    w: &crate::sources::tasks::Window,
    fill: impl Fn(&crate::sources::tasks::TaskWindow, &mut TopRow),
) -> Vec<TopRow> {
    // Ns accounting (either tier): a process that ran at all is listed,
    // not only one charged a clock tick (ProcessCpuTracker's working set,
    // which leaves a quiet machine's top empty), ordered by its ns.
    let oncpu_ns = |p: &crate::sources::tasks::TaskWindow| {
        tick.deltas.get(&(p.pid as u32)).map_or(0, |d| d.oncpu_ns)
    };
    let mut procs: Vec<&crate::sources::tasks::TaskWindow> = w
        .processes
        .iter()
        .filter(|p| p.working || oncpu_ns(p) > 0)
        .collect();
    procs.sort_by(|a, b| {
        oncpu_ns(b).cmp(&oncpu_ns(a)).then(
            b.core_equivalent_pct
                .unwrap_or(0.0)
                .total_cmp(&a.core_equivalent_pct.unwrap_or(0.0)),
        )
    });
    procs
        .iter()
        .take(50)
        .map(|p| {
            let mut row = TopRow::default();
            fill(p, &mut row);
            row
        })
        .collect()
}

#[cfg(test)]
mod tests;
