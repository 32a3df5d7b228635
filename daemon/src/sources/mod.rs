//! The sources: one room per kernel interface, each owning its reading,
//! its deltas, its counter tracks and the columns it offers (Perfetto's
//! `src/traced/probes` data sources are the model). The pipeline
//! (`pipeline`) runs every registered room once per tick, around one
//! procfs scan, and hands the [`Tick`] they filled to its sinks.
//!
//! Adding a source: its room (a module here implementing [`Source`]), one
//! line in [`registered`], and its tests.

pub mod ebpf;
pub mod offcpu;
pub mod schedstat;
pub mod system;
pub mod tasks;

pub mod tracks;

use std::{
    collections::{BTreeMap, HashMap},
    io::Write,
    path::Path,
};

use crate::{
    accounting::{CounterOrigin, ProcessCounters},
    bpf::BpfError,
    clock::ClockPair,
    control::protocol::TopRow,
    figures::{ProcessFigures, SampleFigures},
    perfetto::{PerfettoError, TraceWriter},
    procfs::sampler::{Sample, SamplerError},
};

/// One tick's value: what every source read, handed to every sink.
#[derive(Default)]
pub struct Tick {
    /// When the per-task counters were read (after the eBPF maps, before
    /// the scan): the time of this tick's packets in a trace.
    pub clocks: ClockPair,
    /// USER_HZ, which the tick counters of `sample` are in.
    pub hz: u64,
    /// This tick's procfs scan (partial or stale when `scanned` is false).
    pub sample: Sample,
    /// Whether this tick's scan succeeded (else `procfs_error`).
    pub scanned: bool,
    /// The system room's window of this scan, until the tasks room takes
    /// it into `window`, and what it dropped.
    pub system: Option<system::SystemWindow>,
    pub system_drops: system::SystemDrops,
    /// The procfs window since the last scan (None: the scan failed, or
    /// was the first).
    pub window: Option<tasks::Window>,
    /// Every process's cumulative per-task counters (either tier; empty
    /// /proc-only without schedstat, or when the read failed).
    pub rows: Vec<ProcessCounters>,
    /// When `rows` were read (CLOCK_BOOTTIME): `clocks`, or the scan's
    /// clock in the CTS tier (schedstat is read with the scan).
    pub rows_boottime_ns: u64,
    /// This window's per-task deltas by tgid (either tier).
    pub deltas: HashMap<u32, ebpf::BpfDelta>,
    /// How long `deltas` cover, as measured: from the last read of the
    /// counters that succeeded to this one (None: no deltas this tick). A
    /// late tick makes it longer than `sampling.interval`.
    pub deltas_window_ns: Option<u64>,
    /// The eBPF programs' cumulative drop counters as read this tick.
    pub bpf_drops: Option<[u64; vitals_common::drop_reason::COUNT as usize]>,
    /// (wakee, waker) process pairs' cumulative wakeups and blocked time
    /// as read this tick (off-CPU accounting; empty while it is off).
    pub wakers: HashMap<vitals_common::WakerKey, vitals_common::WakerCounters>,
    /// The eBPF read failed: this tick has no rows from it.
    pub bpf_error: Option<BpfError>,
    /// The procfs scan failed: no window, no schedstat rows this tick.
    pub procfs_error: Option<SamplerError>,
}

impl Tick {
    /// Forgets the last tick's values, keeping the scan's buffers.
    pub fn clear(&mut self) {
        self.scanned = false;
        self.system = None;
        self.system_drops = Default::default();
        self.window = None;
        self.rows.clear();
        self.deltas.clear();
        self.deltas_window_ns = None;
        self.bpf_drops = None;
        self.wakers.clear();
        self.bpf_error = None;
        self.procfs_error = None;
    }

    /// What a sink on another thread (a recording) needs of this tick.
    pub fn share(&self) -> Tick {
        Tick {
            clocks: self.clocks,
            hz: self.hz,
            sample: self.sample.clone(),
            scanned: self.scanned,
            system: None,
            system_drops: self.system_drops,
            window: self.window.clone(),
            rows: self.rows.clone(),
            rows_boottime_ns: self.rows_boottime_ns,
            deltas: self.deltas.clone(),
            deltas_window_ns: self.deltas_window_ns,
            bpf_drops: self.bpf_drops,
            wakers: self.wakers.clone(),
            bpf_error: None,
            procfs_error: None,
        }
    }
}

/// One room. Starting it is its constructor (a room is registered
/// started); then, every tick, `read` (before the procfs scan) and
/// `sample` (after it) fill its part of the [`Tick`]; `columns` and
/// `status` offer its figures to top and status, `figures` and
/// `process_figures` to history and the rules (by name, see
/// [`crate::figures`]); its packets are written by [`emit`].
pub trait Source: Send {
    /// Reads what does not come from the scan, before it.
    fn read(&mut self, _tick: &mut Tick) {}
    /// Derives this room's part of the tick from a good scan.
    fn sample(&mut self, _tick: &mut Tick) {}
    /// Fills this room's columns of `task`'s top row.
    fn columns(&self, _tick: &Tick, _task: &tasks::TaskWindow, _row: &mut TopRow) {}
    /// Its system-wide figures of this tick's window, for history and rules.
    fn figures(&self, _tick: &Tick, _out: &mut SampleFigures) {}
    /// Its figures of one process history keeps, for history and rules.
    fn process_figures(&self, _tick: &Tick, _task: &tasks::TaskWindow, _out: &mut ProcessFigures) {}
    /// Its counters for status, by status field.
    fn status(&self, _out: &mut BTreeMap<&'static str, BTreeMap<String, u64>>) {}
    /// Its line in a recording's summary, if it has one.
    fn summary(&self) -> Option<String> {
        None
    }
}

/// Every source a pipeline runs.
pub struct Sources {
    /// The eBPF programs' counters (None: /proc-only).
    pub ebpf: Option<ebpf::Ebpf>,
    /// Off-CPU accounting's pairs, figures and columns (None: off, or no
    /// eBPF); after `ebpf`, whose read it takes from the tick.
    pub offcpu: Option<offcpu::Offcpu>,
    /// /proc/stat: its window (before the tasks room, which shares it).
    pub system: system::System,
    /// /proc/<pid>: the per-process window.
    pub tasks: tasks::Tracker,
    /// No eBPF: the kernel's schedstat (the CTS tier; None without it).
    pub schedstat: Option<schedstat::Schedstat>,
}

impl Sources {
    /// Every source that opens here: the eBPF room on `programs`, or
    /// without them the procfs scheduler source (the CTS tier) where the
    /// kernel has schedstat; the procfs rooms always.
    pub fn open(proc_root: &Path, hz: u64, programs: Option<ebpf::Programs>) -> Self {
        // No eBPF: the kernel's own per-thread accounting (the CTS tier).
        let schedstat = match &programs {
            Some(_) => None,
            None => schedstat::open_or_log(proc_root, hz).map(schedstat::Schedstat::new),
        };
        let offcpu = programs.as_ref().and_then(|p| {
            let settings = p.with(|acc| acc.offcpu())?;
            Some(offcpu::Offcpu::new(Some(p.clone()), settings))
        });
        Self {
            ebpf: programs.map(ebpf::Ebpf::new),
            offcpu,
            system: system::System::default(),
            tasks: tasks::Tracker::new(hz),
            schedstat,
        }
    }

    /// Where the per-task counters come from (None: clock ticks only).
    pub fn origin(&self) -> Option<CounterOrigin> {
        match (&self.ebpf, &self.schedstat) {
            (Some(e), _) => {
                let (fault_source, runq_wait) = e.fault_source_and_runq_wait();
                Some(CounterOrigin::Ebpf {
                    fault_source,
                    runq_wait,
                    offcpu: self.offcpu.is_some(),
                })
            }
            (None, Some(_)) => Some(CounterOrigin::Schedstat),
            (None, None) => None,
        }
    }

    /// Every registered room, in tick order; one line per source.
    pub fn registered(&mut self) -> [Option<&mut dyn Source>; 5] {
        [
            self.ebpf.as_mut().map(|s| s as &mut dyn Source),
            self.offcpu.as_mut().map(|s| s as &mut dyn Source),
            Some(&mut self.system as &mut dyn Source),
            Some(&mut self.tasks as &mut dyn Source),
            self.schedstat.as_mut().map(|s| s as &mut dyn Source),
        ]
    }

    /// The same, read-only (columns, status).
    pub fn each(&self) -> impl Iterator<Item = &dyn Source> {
        [
            self.ebpf.as_ref().map(|s| s as &dyn Source),
            self.offcpu.as_ref().map(|s| s as &dyn Source),
            Some(&self.system as &dyn Source),
            Some(&self.tasks as &dyn Source),
            self.schedstat.as_ref().map(|s| s as &dyn Source),
        ]
        .into_iter()
        .flatten()
    }
}

/// Writes every room's packets of `tick` (the native ones from the scan
/// first, then the window's counters, then the programs' drops).
pub fn emit<W: Write>(tick: &Tick, w: &mut TraceWriter<W>) -> Result<(), PerfettoError> {
    let ts = tick.clocks.boottime_ns;
    system::tracks::write_sample(w, ts, &tick.sample, tick.hz)?;
    tasks::tracks::write_sample(w, ts, &tick.sample, tick.hz)?;
    if let Some(win) = &tick.window {
        let figures = system::tracks::SystemFigures {
            loadavg: win.loadavg.as_ref(),
            system: win.system.as_ref(),
            pressure: &win.pressure,
        };
        system::tracks::write_window(w, ts, figures)?;
        tasks::tracks::write_window(w, ts, win)?;
    }
    if let Some(drops) = &tick.bpf_drops {
        ebpf::write_drops(w, ts, drops)?;
    }
    Ok(())
}
