//! The event tier (users know it as the capture tier: `--sched`,
//! `--faults`): for a recording's window, the events its event set
//! (`EventSet`) switches on in the running programs: every sched_switch
//! and sched_waking on every CPU and sampled user page faults with their
//! stacks, written as Perfetto FtraceEventBundle/CompactSched packets (per
//! CPU, flushed every sample interval) and PerfSample callstack samples.
//!
//! Kernel side: `ebpf-programs` emits into the CAPTURE_EVENTS ring buffer
//! (or, where the kernel has no ringbuf or it is forced, the CAPTURE_PERF
//! perf event array) only while the CAPTURE flag is set;
//! `transport::start/stop` flip it. The always-on tier is
//! unchanged while no capture runs.

pub mod decode;
pub mod drain;
pub mod fault_stacks;
mod kernel_stacks;
mod lost;
mod mapped_files;
mod offcpu_follow;
mod offcpu_user;
pub mod offcpu_watch;
pub mod transport;

pub use offcpu_watch::{OffcpuRequest, OffcpuWatch, WatchedProcesses};

use std::{
    collections::HashMap,
    io::Write,
    num::NonZeroU32,
    path::{Path, PathBuf},
};

use lost::{merge_lost, LostCounts};
use thiserror::Error;
use vitals_common::capture as cap;
use vitals_proto::protos::{process_tree, trace_packet, ProcessTree, TracePacket};

use crate::{
    bpf::{Accounting, BpfError, EventTransport},
    event_set::EventSet,
    perfetto::{
        blind_windows::{BlindWindow, BlindWindowTracks},
        compact_sched::{build_bundle, comm_from, comm_str, Comm, CpuEvents},
        offcpu_blocks::{LongBlock, OffcpuBlocks},
        CounterSpec, CounterUnit, CounterValue, PerfettoError, TraceWriter, TrackUuid,
        DEFAULT_SEQUENCE_ID,
    },
};

use self::{
    decode::Record,
    drain::{Drainer, Pace},
    fault_stacks::FaultStacks,
};

/// The sequence the fault samples and their interned callstacks live on,
/// apart from the main one so its incremental state is theirs alone.
pub const SAMPLE_SEQUENCE_ID: u32 = DEFAULT_SEQUENCE_ID + 1;

#[derive(Debug, Error)]
pub enum EventsError {
    #[error(transparent)]
    Bpf(#[from] BpfError),
    #[error(transparent)]
    Perfetto(#[from] PerfettoError),
    #[error("starting the ring-buffer drain thread: {0}")]
    Thread(#[source] std::io::Error),
}

/// What a capture records: its event set (`vitalsd record --sched
/// --faults`, a rule's or `vitalsctl capture`'s), and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventOptions {
    pub events: EventSet,
    /// One fault sample every this many faults of each process.
    pub fault_period: u32,
    /// The two stacks of every long block of the watched threads (issue
    /// #24); None: off. Without `events.sched` the capture holds those
    /// and no timeline, as bcc's offwaketime does.
    pub offcpu: Option<OffcpuWatch>,
}

impl EventOptions {
    /// Whether the capture records anything (events or off-CPU stacks).
    pub fn any(&self) -> bool {
        self.events.any() || self.offcpu.is_some()
    }

    /// How the drain waits: polled with a timeline or fault samples, else
    /// (long blocks only) woken by each record.
    pub fn drain_pace(&self) -> Pace {
        if self.events.any() {
            Pace::POLL
        } else {
            Pace::WAKEUP
        }
    }
}

impl Default for EventOptions {
    fn default() -> Self {
        Self {
            events: EventSet::NONE,
            fault_period: 100,
            offcpu: None,
        }
    }
}

/// Figures of a capture, for the summary and the bench.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EventStats {
    pub switch_events: u64,
    pub waking_events: u64,
    pub fault_samples: u64,
    pub bundles: u64,
    /// Bytes of the FtraceEventBundle packets as written (framing included).
    pub bundle_bytes: u64,
    /// Ring buffer full: sched records lost (sum over CPUs).
    pub lost_sched: u64,
    pub lost_faults: u64,
    /// Fault samples whose stack could not be taken.
    pub lost_stacks: u64,
    /// Ring buffer full: long-block records lost.
    pub lost_offcpu: u64,
    /// Watched processes (tgids) the capture's `OFFCPU_WATCH` had no
    /// room for: their blocks are not recorded.
    pub offcpu_watch_dropped: u64,
    /// Processes started during the capture that joined the watch.
    pub offcpu_watched_later: u64,
    /// Perf array only: samples the perf buffers reported lost
    /// (PERF_RECORD_LOST), summed over CPUs. The same drops the kernel-side
    /// counter sees as -ENOSPC, so a cross-check, not extra loss.
    pub perf_reported_lost: u64,
    pub transport: Option<EventTransport>,
    pub fault: fault_stacks::FaultStats,
    /// Threads seen in sched records whose thread group never became
    /// known, left out of ProcessTree (see `write_thread_names`).
    pub threads_without_process: u64,
    /// Blind windows of the classic sched_switch programs, and the
    /// switches the kernel made in them unseen (`vitals_common::blind`).
    pub blind_windows: u64,
    pub unseen_switches: u64,
    /// Of those, the windows only the switch counter revealed: the task
    /// switching out was the one last seen switching in (`switch_missed`
    /// cannot see them).
    pub blind_windows_counter_only: u64,
    /// Recorded switches whose prev was not the CPU's last recorded next
    /// (a switch went unseen between them): each written after a
    /// synthetic switch to its real prev where its comm was known
    /// (`compact_sched::build_bundle`), those written so.
    pub switch_gaps: u64,
    pub synthetic_switches: u64,
    /// Long blocks whose user stack came at their switch-in, and
    /// those whose thread had not run again when the capture ended.
    pub user_stacks_at_switch_in: u64,
    pub user_stacks_unseen: u64,
}

impl EventStats {
    pub fn render(&self) -> String {
        format!(
            "capture: {} sched_switch, {} sched_waking in {} bundles ({} bytes, {:.2} bytes/switch); {} fault samples ({} without stack, {} frames symbolised, {} not, {} retried); {} long blocks ({} weighed as 10 s; user stacks: {} at their switch-in, {} not run again by the end); ring buffer lost: {} sched, {} fault, {} long-block records; {} watched processes dropped, {} joined later; {} stacks not taken; transport {} ({} reported lost by perf buffers); {} threads without a known process",
            self.switch_events,
            self.waking_events,
            self.bundles,
            self.bundle_bytes,
            self.bundle_bytes as f64 / self.switch_events.max(1) as f64,
            self.fault.samples_written,
            self.fault.samples_without_stack,
            self.fault.frames_symbolised,
            self.fault.frames_unsymbolised,
            self.fault.frames_retried,
            self.fault.offcpu_blocks,
            self.fault.offcpu_capped,
            self.user_stacks_at_switch_in,
            self.user_stacks_unseen,
            self.lost_sched,
            self.lost_faults,
            self.lost_offcpu,
            self.offcpu_watch_dropped,
            self.offcpu_watched_later,
            self.lost_stacks,
            self.transport.map_or("none", EventTransport::name),
            self.perf_reported_lost,
            self.threads_without_process,
        )
    }
}

/// A running capture.
pub struct EventRecorder {
    proc_root: PathBuf,
    drainer: Option<Drainer>,
    per_cpu: Vec<CpuEvents>,
    /// Cumulative CAPTURE_LOST per CPU at the start / last flush.
    base_lost: Vec<[u64; cap::lost::COUNT as usize]>,
    last_lost: Vec<[u64; cap::lost::COUNT as usize]>,
    lost_track: Option<TrackUuid>,
    last_lost_total: u64,
    /// Perf array: PERF_RECORD_LOST counts per CPU since capture start.
    perf_lost: Vec<u64>,
    /// Which `cap::lost` kind perf-reported losses are charged to.
    perf_lost_kind: u32,
    /// Each thread's last comm in the records (its key set: the tids seen):
    /// the name of a switch's real prev after an unseen switch
    /// (`write_bundles`).
    comms: HashMap<i32, Comm>,
    /// Seen tids not yet named in a ProcessTree packet.
    new_tids: HashMap<i32, Comm>,
    /// tid -> tgid, from the switch records (prev is `current` there;
    /// next's when the program could tell).
    tgids: HashMap<i32, i32>,
    faults: FaultStacks,
    /// Long blocks not written yet, and their tracks' state.
    blocks: Vec<LongBlock>,
    /// Blocked-stack samples waiting for their syscall's user stack.
    awaiting_user: offcpu_user::AwaitingUserStacks,
    block_tracks: OffcpuBlocks,
    /// Names whose new processes join the off-CPU watch.
    offcpu_follow: offcpu_follow::Follow,
    /// Blind windows not written yet, and their tracks' state.
    windows: Vec<BlindWindow>,
    window_tracks: BlindWindowTracks,
    stats: EventStats,
}

impl EventRecorder {
    /// Sets the capture flag and starts draining. Needs CAP_PERFMON (it
    /// attaches sched_waking), so call it before dropping privileges.
    pub fn start(
        acc: &mut Accounting,
        opts: &EventOptions,
        proc_root: &Path,
    ) -> Result<Self, EventsError> {
        let base_lost = transport::lost(acc)?;
        let offcpu = opts.offcpu.as_ref();
        let started = transport::start(acc, opts.events, opts.fault_period, offcpu)?;
        let drainer = match Drainer::start(started.output, opts.drain_pace()) {
            Ok(d) => d,
            Err(e) => {
                // The flag is off again and the transport no longer lent.
                if let Err(e) = transport::stop(acc, None) {
                    log::warn!("ending a capture that could not start: {e}");
                }
                return Err(EventsError::Thread(e));
            }
        };
        let transport = acc.capture_transport();
        log::info!(
            "capture started: sched {}, faults {} (1 in {}), off-cpu {:?}; transport {}",
            opts.events.sched,
            opts.events.faults,
            opts.fault_period,
            offcpu,
            transport.name()
        );
        Ok(Self {
            proc_root: proc_root.to_owned(),
            drainer: Some(drainer),
            per_cpu: Vec::new(),
            last_lost: base_lost.clone(),
            base_lost,
            lost_track: None,
            last_lost_total: 0,
            perf_lost: Vec::new(),
            // A lost-sample report does not say what was lost; sched
            // records outnumber fault samples by orders of magnitude.
            perf_lost_kind: if opts.events.sched {
                cap::lost::SCHED
            } else if opts.events.faults {
                cap::lost::FAULT
            } else {
                cap::lost::OFFCPU
            },
            comms: HashMap::new(),
            new_tids: HashMap::new(),
            tgids: HashMap::new(),
            faults: FaultStacks::new(proc_root),
            blocks: Vec::new(),
            block_tracks: OffcpuBlocks::new(),
            awaiting_user: Default::default(),
            offcpu_follow: offcpu_follow::Follow::of(offcpu),
            windows: Vec::new(),
            window_tracks: BlindWindowTracks::new(),
            stats: EventStats {
                transport: Some(transport),
                offcpu_watch_dropped: started.offcpu_watch_dropped,
                ..EventStats::default()
            },
        })
    }

    pub fn stats(&self) -> EventStats {
        self.stats
    }

    fn take_records(&mut self) {
        let batches: Vec<Vec<Record>> = match &self.drainer {
            Some(d) => d.rx.try_iter().collect(),
            None => return,
        };
        for b in batches {
            self.absorb(b);
        }
    }

    fn absorb(&mut self, batch: Vec<Record>) {
        for r in batch {
            match r {
                Record::Switch {
                    cpu,
                    prev_tgid,
                    next_tgid,
                    rec,
                } => {
                    if rec.prev_pid > 0 && prev_tgid > 0 {
                        self.tgids.insert(rec.prev_pid, prev_tgid as i32);
                    }
                    if rec.next_pid > 0 && next_tgid > 0 {
                        self.tgids.insert(rec.next_pid, next_tgid as i32);
                    }
                    self.note_tid(rec.next_pid, rec.next_comm);
                    self.cpu(cpu).switches.push(rec);
                    self.stats.switch_events += 1;
                }
                Record::Waking { cpu, rec } => {
                    self.note_tid(rec.pid, rec.comm);
                    self.cpu(cpu).wakings.push(rec);
                    self.stats.waking_events += 1;
                }
                Record::Fault(f) => {
                    self.stats.fault_samples += 1;
                    self.faults.push(f);
                }
                Record::Offcpu(e) => self.absorb_block(&e),
                Record::OffcpuUserStack(u) => {
                    for r in self.awaiting_user.resolve(&u) {
                        self.faults.push(r);
                    }
                }
                Record::BlindWindow(w) => {
                    self.stats.blind_windows += 1;
                    self.stats.unseen_switches += u64::from(w.unseen_switches);
                    if w.seen_by == vitals_common::blind::SEEN_BY_COUNTER {
                        self.stats.blind_windows_counter_only += 1;
                    }
                    self.windows.push(w);
                }
                Record::Lost { cpu, count } => {
                    let i = cpu as usize;
                    if self.perf_lost.len() <= i {
                        self.perf_lost.resize(i + 1, 0);
                    }
                    self.perf_lost[i] += count;
                    self.stats.perf_reported_lost += count;
                }
            }
        }
    }

    fn cpu(&mut self, cpu: u32) -> &mut CpuEvents {
        let i = cpu as usize;
        if self.per_cpu.len() <= i {
            self.per_cpu.resize_with(i + 1, CpuEvents::default);
        }
        &mut self.per_cpu[i]
    }

    /// Keeps `tid`'s comm; a tid seen first is named at the next flush
    /// (tid 0, the idle task, never: it is no thread of a process).
    fn note_tid(&mut self, tid: i32, comm: Comm) {
        if self.comms.insert(tid, comm).is_none() && tid != 0 {
            self.new_tids.insert(tid, comm);
        }
    }

    /// Writes what arrived since the last flush: one bundle per CPU,
    /// thread names of new tids, fault samples (symbolised now, while the
    /// processes are alive) and the loss counter.
    pub fn flush<W: Write>(
        &mut self,
        acc: &Accounting,
        writer: &mut TraceWriter<W>,
        ts_boot_ns: u64,
    ) -> Result<(), EventsError> {
        self.take_records();
        let lost = self.merge_lost(transport::lost(acc)?);
        self.write_pending(acc, writer, ts_boot_ns, &lost, false)
    }

    /// The kernel-side per-CPU loss counters with the perf buffers' own
    /// reports folded in. bpf_perf_event_output returns -ENOSPC for exactly
    /// the samples the perf ring then reports in PERF_RECORD_LOST, so the
    /// two count the same drops: per CPU, the loss since capture start is
    /// the larger of the two (the report may lag; the counter also sees
    /// other failures), never their sum.
    fn merge_lost(&self, kernel: Vec<LostCounts>) -> Vec<LostCounts> {
        merge_lost(
            kernel,
            &self.base_lost,
            &self.perf_lost,
            self.perf_lost_kind,
        )
    }

    /// Writes what is pending, in this order: thread names, the per-CPU
    /// bundles, the fault samples, the loss counter. `last`: the capture
    /// ends, so every new tid is named now.
    fn write_pending<W: Write>(
        &mut self,
        acc: &Accounting,
        writer: &mut TraceWriter<W>,
        ts_boot_ns: u64,
        lost: &[LostCounts],
        last: bool,
    ) -> Result<(), EventsError> {
        self.write_thread_names(writer, ts_boot_ns, last)?;
        self.write_bundles(writer, lost)?;
        self.write_fault_samples(acc, writer, last)?;
        for b in std::mem::take(&mut self.blocks) {
            for p in self.block_tracks.packets(&b) {
                writer.write_packet(p)?;
            }
        }
        for w in std::mem::take(&mut self.windows) {
            for p in self.window_tracks.packets(&w) {
                writer.write_packet(p)?;
            }
        }
        self.write_lost(writer, ts_boot_ns, lost)?;
        self.last_lost = lost.to_vec();
        Ok(())
    }

    /// Thread names with their process. A tid whose tgid is not known yet
    /// (no switch record said, and /proc does not) waits for a later
    /// flush. The last one leaves out the tids still without one, counted
    /// in `EventStats::threads_without_process`: trace_processor reads a
    /// ProcessTree thread without `tgid` as one of pid 0 (swapper). Their
    /// names still reach it through the sched records' comms.
    fn write_thread_names<W: Write>(
        &mut self,
        writer: &mut TraceWriter<W>,
        ts_boot_ns: u64,
        last: bool,
    ) -> Result<(), EventsError> {
        let mut tids: Vec<(i32, Comm, i32)> = Vec::new();
        let mut unknown = Vec::new();
        for (&tid, &comm) in &self.new_tids {
            match self
                .tgids
                .get(&tid)
                .copied()
                .or_else(|| read_tgid(&self.proc_root, tid))
            {
                Some(tgid) => tids.push((tid, comm, tgid)),
                None if last => unknown.push(tid),
                None => {}
            }
        }
        if !unknown.is_empty() {
            unknown.sort_unstable();
            log::info!(
                "capture: {} threads left out of ProcessTree, their process unknown: {:?}",
                unknown.len(),
                &unknown[..unknown.len().min(20)]
            );
            self.stats.threads_without_process += unknown.len() as u64;
            for tid in unknown {
                self.new_tids.remove(&tid);
            }
        }
        if tids.is_empty() {
            return Ok(());
        }
        let mut tree = ProcessTree::default();
        tids.sort_unstable_by_key(|(t, _, _)| *t);
        for (tid, comm, tgid) in tids {
            self.new_tids.remove(&tid);
            tree.threads.push(process_tree::Thread {
                tid: Some(tid),
                tgid: Some(tgid),
                name: Some(comm_str(&comm)),
                ..Default::default()
            });
        }
        writer.write_packet(TracePacket {
            timestamp: Some(ts_boot_ns),
            data: Some(trace_packet::Data::ProcessTree(tree)),
            ..Default::default()
        })?;
        Ok(())
    }

    /// One bundle per CPU with events or with sched records lost since the
    /// last flush (an empty bundle then only carries `lost_events`).
    fn write_bundles<W: Write>(
        &mut self,
        writer: &mut TraceWriter<W>,
        lost: &[LostCounts],
    ) -> Result<(), EventsError> {
        let ncpu = self.per_cpu.len().max(lost.len());
        for cpu in 0..ncpu {
            let now = lost.get(cpu).map_or(0, |l| l[cap::lost::SCHED as usize]);
            let before = self
                .last_lost
                .get(cpu)
                .map_or(0, |l| l[cap::lost::SCHED as usize]);
            let lost_here = now > before;
            let Some(ev) = self.per_cpu.get_mut(cpu) else {
                continue;
            };
            if ev.is_empty() && !lost_here {
                continue;
            }
            let (gaps_before, synthetic_before) = (ev.gaps, ev.synthetic);
            let (comms, proc_root) = (&self.comms, &self.proc_root);
            let bundle = build_bundle(cpu as u32, ev, lost_here, |pid| {
                comms
                    .get(&pid)
                    .copied()
                    .or_else(|| read_comm(proc_root, pid))
            });
            self.stats.switch_gaps += ev.gaps - gaps_before;
            self.stats.synthetic_switches += ev.synthetic - synthetic_before;
            ev.clear();
            let before_bytes = writer.bytes_written();
            writer.write_packet(TracePacket {
                data: Some(trace_packet::Data::FtraceEvents(bundle)),
                ..Default::default()
            })?;
            self.stats.bundles += 1;
            self.stats.bundle_bytes += writer.bytes_written() - before_bytes;
        }
        Ok(())
    }

    /// The fault samples since the last flush, symbolised now while their
    /// processes are alive, on their own sequence; `last`: none is held
    /// back for a later try.
    fn write_fault_samples<W: Write>(
        &mut self,
        acc: &Accounting,
        writer: &mut TraceWriter<W>,
        last: bool,
    ) -> Result<(), EventsError> {
        if last {
            for r in self.awaiting_user.give_up() {
                self.faults.push(r);
            }
        }
        let seq = NonZeroU32::new(SAMPLE_SEQUENCE_ID).expect("nonzero");
        for (first, step_ns, count) in self
            .faults
            .take_samples(last, |id| transport::stack(acc, id).ok().flatten())
            .runs()
        {
            writer.write_run_on_sequence(seq, first, step_ns, count)?;
        }
        self.stats.fault = self.faults.stats;
        self.stats.user_stacks_at_switch_in = self.awaiting_user.resolved;
        self.stats.user_stacks_unseen = self.awaiting_user.unseen;
        Ok(())
    }

    /// Loss since the capture started, per kind summed over CPUs, into the
    /// stats; the counter track gets sched + fault losses when they change
    /// (and once at the first flush, so the track exists).
    fn write_lost<W: Write>(
        &mut self,
        writer: &mut TraceWriter<W>,
        ts_boot_ns: u64,
        lost: &[LostCounts],
    ) -> Result<(), EventsError> {
        let sum = |k: u32| -> u64 {
            lost.iter()
                .enumerate()
                .map(|(cpu, l)| {
                    let base = self.base_lost.get(cpu).map_or(0, |b| b[k as usize]);
                    l[k as usize].saturating_sub(base)
                })
                .sum()
        };
        self.stats.lost_sched = sum(cap::lost::SCHED);
        self.stats.lost_faults = sum(cap::lost::FAULT);
        self.stats.lost_stacks = sum(cap::lost::STACK);
        self.stats.lost_offcpu = sum(cap::lost::OFFCPU);
        let total = self.stats.lost_sched + self.stats.lost_faults + self.stats.lost_offcpu;
        if self.lost_track.is_none() || total != self.last_lost_total {
            let uuid = match self.lost_track {
                Some(u) => u,
                None => {
                    let u = writer.global_counter_track(
                        &CounterSpec::new("capture_ringbuf_lost_events", CounterUnit::Count)
                            .with_description(format!(
                                "capture records dropped because the ring buffer was full (sched + fault samples + long blocks), since capture start; transport: {}",
                                self.stats.transport.map_or("none", EventTransport::name)
                            )),
                    )?;
                    self.lost_track = Some(u);
                    u
                }
            };
            writer.write_counter(ts_boot_ns, uuid, CounterValue::Int(total as i64))?;
            self.last_lost_total = total;
        }
        Ok(())
    }

    /// Clears the flag, drains what is left, hands the ring buffer back to
    /// `acc` (before writing, so a failed write cannot lose it: `acc` may
    /// be the daemon's, with captures to come) and writes what was left.
    /// The capture's own maps (`transport::release`) go at the end,
    /// written or not.
    pub fn stop<W: Write>(
        mut self,
        acc: &mut Accounting,
        writer: &mut TraceWriter<W>,
        ts_boot_ns: u64,
    ) -> Result<EventStats, EventsError> {
        let res = self.drain_and_write(acc, writer, ts_boot_ns);
        transport::release(acc);
        res?;
        log::info!("{}", self.stats.render());
        Ok(self.stats)
    }

    fn drain_and_write<W: Write>(
        &mut self,
        acc: &mut Accounting,
        writer: &mut TraceWriter<W>,
        ts_boot_ns: u64,
    ) -> Result<(), EventsError> {
        transport::pause(acc)?;
        if let Some(d) = self.drainer.take() {
            let (ring, batches) = d.stop();
            for b in batches {
                self.absorb(b);
            }
            transport::stop(acc, ring)?;
        }
        let lost = self.merge_lost(transport::lost(acc)?);
        // The stacks are read from the capture's maps here.
        self.write_pending(acc, writer, ts_boot_ns, &lost, true)
    }

    /// Ends a capture whose recording failed: clears the flag, detaches
    /// sched_waking and hands the ring buffer back, writing nothing.
    pub fn abort(mut self, acc: &mut Accounting) {
        if let Err(e) = transport::pause(acc) {
            log::warn!("aborting the capture: {e}");
        }
        if let Some((ring, _)) = self.drainer.take().map(Drainer::stop) {
            if let Err(e) = transport::stop(acc, ring) {
                log::warn!("aborting the capture: {e}");
            }
        }
        transport::release(acc);
        log::info!("capture aborted");
    }
}

/// The comm of `tid` from /proc/<tid>/comm (tids are reachable there too).
fn read_comm(proc_root: &Path, tid: i32) -> Option<Comm> {
    let name = std::fs::read(proc_root.join(format!("{tid}/comm"))).ok()?;
    Some(comm_from(
        String::from_utf8_lossy(&name).trim_end_matches('\n'),
    ))
}

/// The thread group of `tid` from /proc/<tid>/status (tids are reachable
/// there even though readdir lists only processes). None once it is gone.
fn read_tgid(proc_root: &Path, tid: i32) -> Option<i32> {
    let s = std::fs::read_to_string(proc_root.join(format!("{tid}/status"))).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok())
}
