//! The trace-file sink: a recording's header, then each tick's packets
//! (every source's, the capture tier's records, each process's counter
//! tracks and the ProcessTree naming them), and its summary.

use std::{
    collections::{HashMap, HashSet},
    io::BufWriter,
    path::Path,
    sync::atomic::{AtomicBool, Ordering},
    time::Instant,
};

use super::{
    accounting_mode, accounting_note, Attached, FileTraceWriter, RecordError, RecordOptions,
    RecordSummary, SummaryRow, Tier,
};
use crate::{
    accounting::{CounterOrigin, ProcessCounters},
    bpf::{denied::ProcOnly, FaultSource},
    clock::ClockPair,
    perfetto::{PerfettoError, ProcessKey, SystemFacts, TraceWriter},
    pipeline::Pipeline,
    process_tracks::{process_counters, tree_entries, ProcessCounterTracks, ProcessIdentity},
    procfs::sampler::{ProcessSample, Sample},
    sources::Tick,
    system,
};

/// A recording between its setup and its summary. Fields drop in
/// declaration order, so an error drops the writer (flushing what it
/// buffered) before the capture and the capture before the BPF objects,
/// as when they were locals of one function.
pub(super) struct Recording {
    /// The last counters of every live process instance seen, by pid, for
    /// the summary. With `ended`, the summary has one row per instance
    /// (pid, starttime): a reused pid is a new row.
    final_rows: HashMap<u32, ProcessCounters>,
    /// Instances whose row ended (their leader was freed): who they were
    /// (None: never named) and their last counters.
    ended: Vec<(Option<ProcessIdentity>, ProcessCounters)>,
    /// Ended instances per pid: tells apart the track keys of instances
    /// of one pid that have no starttime.
    ended_per_pid: HashMap<u32, u64>,
    tracks: ProcessCounterTracks,
    /// The live process instance of each pid with counters in the trace
    /// (None: counted but never named); an instance whose row ends moves
    /// to `ended`, so a reused pid is a new process.
    known: HashMap<u32, Option<ProcessIdentity>>,
    /// Pids whose naming waited one tick: gone from /proc before the scan
    /// and not yet freed, so their exit record (and comm) is due.
    waiting: HashSet<u32>,
    /// Processes named in ProcessTree from a scan before any eBPF row of
    /// theirs (born after that tick's eBPF read): their ProcessStats are
    /// in the trace, and their row, if one comes, takes this identity.
    scanned_only: HashMap<u32, ProcessIdentity>,
    /// Process instances never named (gone from /proc before any scan
    /// and ended without a comm): in the table, not in the trace.
    unnamed_left_out: u64,
    start: ClockPair,
    writer: FileTraceWriter,
    runq_wait: bool,
    fault_source: FaultSource,
    /// Where the per-task counters come from (None: clock ticks only).
    origin: Option<CounterOrigin>,
    /// The CTS tier's counters of the processes alive at the start
    /// (schedstat counts from a process's start, eBPF from the attach):
    /// subtracted for the summary, which is about the recording.
    baseline: HashMap<u32, ProcessCounters>,
    capabilities_after_attach: Option<String>,
    /// No accounting: /proc-only (`proc_only` says why).
    tier: Tier,
    proc_only: Option<ProcOnly>,
    samples: u64,
    cut_at_max_bytes: bool,
    /// The eBPF programs' drop counters as last read, by name (none
    /// /proc-only, rather than zeros).
    drops: Vec<(&'static str, u64)>,
}

impl Recording {
    /// Writes the trace's header (clocks, system, the processes alive in
    /// `first`'s scan, then `prelude`); `origin`: where the per-task
    /// counters come from (None: clock ticks only).
    pub(super) fn start(
        attached: Attached,
        first: &Tick,
        origin: Option<CounterOrigin>,
        prelude: impl FnOnce(&mut FileTraceWriter) -> Result<(), PerfettoError>,
    ) -> Result<Self, RecordError> {
        let Attached {
            tier,
            proc_only,
            file,
            capabilities_after_attach,
        } = attached;
        let fault_source = match origin {
            Some(CounterOrigin::Ebpf { fault_source, .. }) => fault_source,
            _ => FaultSource::None,
        };
        let runq_wait = origin.is_some_and(CounterOrigin::runq_wait);
        // Neither tier: no per-task tracks at all, so nothing reads as a zero.
        let counters = origin.map_or_else(Vec::new, |o| process_counters(o, "recording start"));
        let tracks = ProcessCounterTracks::new(counters);

        let mut writer = TraceWriter::new(BufWriter::new(file));
        let start = ClockPair::now();
        writer.write_clock_snapshot(start)?;
        let possible = system::possible_cpus(Path::new("/sys"))?;
        writer.write_system_info(&SystemFacts {
            utsname: system::utsname()?,
            hz: system::clock_ticks_per_second()?,
            page_size_bytes: system::page_size_bytes()?,
            num_cpus: possible.len() as u32,
            system_ram_bytes: None,
        })?;

        // The CTS tier's counters of the processes alive at the start
        // (schedstat counts from a process's start); the eBPF tier's rows
        // are read from the first tick on.
        let baseline = match origin {
            Some(CounterOrigin::Schedstat) => first
                .rows
                .iter()
                .filter(|r| !r.ended)
                .map(|r| (r.tgid, *r))
                .collect(),
            _ => HashMap::new(),
        };

        // Every process alive now, with its real argv.
        let known: HashMap<u32, Option<ProcessIdentity>> = first
            .sample
            .processes
            .iter()
            .map(|p| (p.stat.pid as u32, Some(ProcessIdentity::of(p))))
            .collect();
        let mut initial: Vec<&ProcessIdentity> = known.values().flatten().collect();
        initial.sort_by_key(|p| p.pid);
        writer.write_process_tree(start.boottime_ns, &tree_entries(initial))?;
        writer.write_instant(
            start.boottime_ns,
            "vitalsd",
            &accounting_note(proc_only.as_ref(), fault_source, origin),
        )?;
        prelude(&mut writer)?;
        writer.flush()?;

        Ok(Self {
            tier,
            proc_only,
            capabilities_after_attach,
            fault_source,
            runq_wait,
            origin,
            baseline,
            writer,
            start,
            known,
            waiting: HashSet::new(),
            scanned_only: HashMap::new(),
            unnamed_left_out: 0,
            tracks,
            final_rows: HashMap::new(),
            ended: Vec::new(),
            ended_per_pid: HashMap::new(),
            samples: 0,
            cut_at_max_bytes: false,
            drops: Vec::new(),
        })
    }

    /// Samples every interval until `duration` passes or `stop` is set,
    /// then once more.
    pub(super) fn run(
        &mut self,
        opts: &RecordOptions,
        stop: &AtomicBool,
        pipeline: &mut Pipeline,
    ) -> Result<(), RecordError> {
        let deadline = Instant::now() + opts.duration;
        let mut next_tick = Instant::now() + opts.interval;
        loop {
            let now = Instant::now();
            let finishing = stop.load(Ordering::Relaxed) || now >= deadline;
            if !finishing && now < next_tick {
                // The signal thread unparks us, so one wakeup per interval.
                std::thread::park_timeout((next_tick - now).min(deadline - now));
                continue;
            }
            next_tick += opts.interval;
            let tick = pipeline.tick();
            if let Some(e) = tick.bpf_error.take() {
                return Err(e.into());
            }
            if let Some(e) = tick.procfs_error.take() {
                return Err(e.into());
            }
            self.take(pipeline.last())?;
            if finishing || self.reached(opts.max_bytes) {
                return Ok(());
            }
        }
    }

    /// Whether the trace holds `max_bytes`: then the recording stops.
    pub(super) fn reached(&mut self, max_bytes: Option<u64>) -> bool {
        let Some(max) = max_bytes.filter(|&max| self.writer.bytes_written() >= max) else {
            return false;
        };
        log::warn!(
            "recording stopped at {} bytes: the cap is {max} bytes",
            self.writer.bytes_written(),
        );
        self.cut_at_max_bytes = true;
        true
    }

    /// One tick: every source's packets, the capture's records since the
    /// last tick, and every process's counters that changed.
    pub(super) fn take(&mut self, tick: &Tick) -> Result<(), RecordError> {
        let ts_boot_ns = tick.clocks.boottime_ns;
        self.samples += 1;
        if let Some(drops) = &tick.bpf_drops {
            self.drops = crate::sources::ebpf::named_drops(drops);
        }
        crate::sources::emit(tick, &mut self.writer)?;
        self.tier.flush(&mut self.writer, ts_boot_ns)?;
        // Known instances first: one that ends moves out of `known`, so
        // a new instance of its pid in this tick (a live row after the
        // ended one) is a new process.
        let mut ending = HashSet::new();
        let (old, new): (Vec<ProcessCounters>, Vec<ProcessCounters>) =
            tick.rows.iter().copied().partition(|r| {
                let known = self.known.contains_key(&r.tgid) && !ending.contains(&r.tgid);
                if known && r.ended {
                    ending.insert(r.tgid);
                }
                known
            });
        self.write_counters(&old, ts_boot_ns)?;
        let (new, mut entries) = self.name_new_processes(new, &tick.sample);
        self.write_counters(&new, ts_boot_ns)?;
        entries.extend(self.name_scanned_only(&tick.sample));
        self.tier.follow_new_processes(&entries)?;
        // The ProcessTree entries after the new instances' counters:
        // trace_processor starts a new process for a pid when a process
        // track descriptor with a new uuid resolves (its first counter);
        // an entry before that would rename the old instance of the pid
        // (same parent: UpdateProcessWithParent keeps the upid).
        if !entries.is_empty() {
            self.writer
                .write_process_tree(ts_boot_ns, &tree_entries(&entries))?;
        }
        self.writer.flush()?;
        Ok(())
    }

    /// Identifies the processes in `rows` (none known yet): from this
    /// tick's scan, else from the comm their leader's free record carries.
    /// One gone before the scan and not freed yet waits a tick for that
    /// record (its row is cumulative: nothing is lost); after that, or
    /// ended without a comm, it is counted unnamed, in the table but left
    /// out of ProcessTree (a `<pid>` name there would also rename its main
    /// thread) and of the counter tracks. Returns the rows to write and
    /// the identities for ProcessTree.
    fn name_new_processes(
        &mut self,
        rows: Vec<ProcessCounters>,
        sample: &Sample,
    ) -> (Vec<ProcessCounters>, Vec<ProcessIdentity>) {
        if rows.is_empty() {
            return (rows, Vec::new());
        }
        let scanned: HashMap<u32, &ProcessSample> = sample
            .processes
            .iter()
            .map(|p| (p.stat.pid as u32, p))
            .collect();
        let mut write = Vec::with_capacity(rows.len());
        let mut entries = Vec::new();
        for r in rows {
            let pid = r.tgid;
            let earlier = self.scanned_only.remove(&pid);
            let id = match (scanned.get(&pid), r.exit_comm_str()) {
                (Some(p), _) => Some(ProcessIdentity::of(p)),
                (None, _) if earlier.is_some() => earlier,
                (None, Some(comm)) if !comm.is_empty() => {
                    Some(ProcessIdentity::from_comm(pid, comm))
                }
                _ if !r.ended && self.waiting.insert(pid) => continue,
                _ => {
                    self.unnamed_left_out += 1;
                    None
                }
            };
            self.waiting.remove(&pid);
            entries.extend(id.clone());
            self.known.insert(pid, id);
            write.push(r);
        }
        (write, entries)
    }

    /// The processes of this tick's scan that have no counters in the
    /// trace and were not named yet: their ProcessStats (export) are
    /// written all the same, so trace_processor would list them without a
    /// name (issue 23: one born after the last tick's eBPF read). A pid
    /// that already had an instance here is left to its eBPF row: an
    /// entry before the new instance's tracks would rename the old one.
    fn name_scanned_only(&mut self, sample: &Sample) -> Vec<ProcessIdentity> {
        let mut out = Vec::new();
        for p in &sample.processes {
            let pid = p.stat.pid as u32;
            let named = self.known.contains_key(&pid)
                || self.ended_per_pid.contains_key(&pid)
                || self
                    .scanned_only
                    .get(&pid)
                    .is_some_and(|id| id.starttime_ticks == p.stat.starttime_ticks);
            if !named {
                let id = ProcessIdentity::of(p);
                out.push(id.clone());
                self.scanned_only.insert(pid, id);
            }
        }
        out
    }

    /// Each process's counter tracks (created on its first row, anew when
    /// its pid is reused) and the values that changed since the last tick.
    fn write_counters(
        &mut self,
        rows: &[ProcessCounters],
        ts_boot_ns: u64,
    ) -> Result<(), RecordError> {
        for r in rows {
            let id = &self.known[&r.tgid];
            let key = ProcessKey {
                pid: r.tgid as i32,
                // No starttime: the instance number within this recording
                // keeps a reused pid's tracks apart all the same.
                starttime_ticks: match id {
                    Some(id) if id.starttime_ticks != 0 => id.starttime_ticks,
                    _ => self.ended_per_pid.get(&r.tgid).copied().unwrap_or(0),
                },
            };
            // Counters of a process with no name would be listed by
            // trace_processor as a nameless process (issue 23): it stays
            // in the table, counted, out of the trace.
            if let Some(id) = id {
                self.tracks
                    .write(&mut self.writer, key, id.name(), r, ts_boot_ns)?;
            }
            let during = self.during_recording(r);
            if r.ended {
                // Its last counters are written: the instance is over, and
                // the pid's next user is a new process.
                self.tracks.forget(r.tgid);
                self.final_rows.remove(&r.tgid);
                self.baseline.remove(&r.tgid);
                let id = self.known.remove(&r.tgid).flatten();
                *self.ended_per_pid.entry(r.tgid).or_default() += 1;
                self.ended.push((id, during));
            } else {
                self.final_rows.insert(r.tgid, during);
            }
        }
        Ok(())
    }

    /// `r` less what its process had before the recording (CTS tier).
    fn during_recording(&self, r: &ProcessCounters) -> ProcessCounters {
        let Some(b) = self.baseline.get(&r.tgid) else {
            return *r;
        };
        ProcessCounters {
            oncpu_ns: r.oncpu_ns.saturating_sub(b.oncpu_ns),
            runq_wait_ns: r.runq_wait_ns.saturating_sub(b.runq_wait_ns),
            voluntary_switches: r.voluntary_switches.saturating_sub(b.voluntary_switches),
            involuntary_switches: r
                .involuntary_switches
                .saturating_sub(b.involuntary_switches),
            faults: vitals_common::FaultCounters {
                entries: r.faults.entries.saturating_sub(b.faults.entries),
                minflt: r.faults.minflt.saturating_sub(b.faults.minflt),
                majflt: r.faults.majflt.saturating_sub(b.faults.majflt),
            },
            ..*r
        }
    }

    /// Stops the capture (draining and writing what is left), then the
    /// summary: every process seen, by on-CPU time.
    pub(super) fn finish(
        mut self,
        opts: &RecordOptions,
        sources: Vec<String>,
    ) -> Result<RecordSummary, RecordError> {
        if self.unnamed_left_out > 0 {
            log::info!(
                "{} processes ended before they could be named (gone from /proc before a scan, \
                 no comm in their exit record): their counters are in the table, not the trace",
                self.unnamed_left_out
            );
        }
        let capture_stats = self
            .tier
            .stop(&mut self.writer, ClockPair::now().boottime_ns)?;
        let end = ClockPair::now();
        let wall = end
            .monotonic_ns
            .saturating_sub(self.start.monotonic_ns)
            .max(1);
        let rows = self.summary_rows(wall);
        // /proc-only: no eBPF drop counters, rather than zeros.
        let drops = std::mem::take(&mut self.drops);
        let packets_written = self.writer.packets_written();
        let bytes_written = self.writer.bytes_written();
        self.writer.flush()?;
        Ok(RecordSummary {
            accounting: accounting_mode(self.proc_only.as_ref()),
            tier: crate::accounting::tier_of(self.origin),
            sources,
            trace_path: opts.out.clone(),
            fault_source: self.fault_source,
            wall_monotonic_ns: wall,
            rows,
            drops,
            capabilities_after_attach: self.capabilities_after_attach,
            packets_written,
            bytes_written,
            samples: self.samples,
            capture: capture_stats,
            cut_at_max_bytes: self.cut_at_max_bytes,
        })
    }

    /// The summary's rows, most on-CPU time first; `wall_ns` is the
    /// recording's CLOCK_MONOTONIC duration.
    fn summary_rows(&self, wall_ns: u64) -> Vec<SummaryRow> {
        let live = self
            .final_rows
            .values()
            .map(|r| (self.known.get(&r.tgid).and_then(Option::as_ref), r));
        let ended = self.ended.iter().map(|(id, r)| (id.as_ref(), r));
        let mut rows: Vec<SummaryRow> = live
            .chain(ended)
            .map(|(id, r)| SummaryRow {
                pid: r.tgid,
                name: id
                    .map(|i| i.name().to_owned())
                    .unwrap_or_else(|| format!("<{}>", r.tgid)),
                oncpu_ns: r.oncpu_ns,
                core_equivalent_pct: r.oncpu_ns as f64 * 100.0 / wall_ns as f64,
                voluntary_switches: r.voluntary_switches,
                involuntary_switches: r.involuntary_switches,
                runq_wait_ns: self.runq_wait.then_some(r.runq_wait_ns),
                faults: match self.origin {
                    Some(CounterOrigin::Schedstat) => r.faults.minflt + r.faults.majflt,
                    _ => r.faults(self.fault_source),
                },
                ended: r.ended,
            })
            .collect();
        rows.sort_by(|a, b| b.oncpu_ns.cmp(&a.oncpu_ns).then(a.pid.cmp(&b.pid)));
        rows
    }
}
