//! The streaming trace writer.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::num::NonZeroU32;

use prost::Message;

use vitals_proto::protos::{
    self, clock_snapshot, counter_descriptor, process_stats, process_tree, sys_stats, trace_packet,
    track_descriptor, track_event, ClockSnapshot, CounterDescriptor, ProcessDescriptor,
    ProcessStats, ProcessTree, SysStats, SystemInfo, TracePacket, TrackDescriptor, TrackEvent,
};

use super::error::PerfettoError;
use super::track_uuid;
use super::types::{
    CounterSpec, CounterUnit, CounterValue, CpuTimesNs, ProcessKey, ProcessStatsEntry,
    ProcessTreeEntry, PsiResource, SystemFacts, TrackUuid,
};
use crate::clock::ClockPair;

mod run;

/// `trusted_packet_sequence_id` of every packet a [`TraceWriter::new`] writes.
///
/// traced normally assigns this per producer writer, starting at 1; we pick a
/// distinctive value so a vitalsd trace concatenated with a traced one is
/// unlikely to share a sequence (whose incremental state would then mix).
pub const DEFAULT_SEQUENCE_ID: u32 = 0x5649_5441; // "VITA"

/// Field 1 (`Trace.packet`), wire type 2 (length-delimited): (1 << 3) | 2.
const TRACE_PACKET_TAG: u8 = 0x0a;

/// Writes a Perfetto trace packet by packet to `W`.
///
/// All packets share one `trusted_packet_sequence_id`. Track descriptors are
/// emitted lazily, once, before the first value on the track, because
/// trace_processor resolves a TrackEvent's `track_uuid` against descriptors
/// seen earlier in the sequence (a counter on an unknown uuid is dropped or
/// misattributed).
///
/// `W` should be buffered (e.g. `BufWriter<File>`): each packet is one
/// `write_all` call. Call [`TraceWriter::flush`] to push whole packets to the
/// file; a crash then leaves a valid trace ending at the last flushed packet.
pub struct TraceWriter<W: Write> {
    out: W,
    sequence_id: u32,
    packets_written: u64,
    bytes_written: u64,
    poisoned: bool,
    /// Reused encode buffer: tag + varint length + packet.
    buf: Vec<u8>,
    process_tracks: HashMap<ProcessKey, TrackUuid>,
    counter_tracks: HashMap<(Option<ProcessKey>, String), TrackUuid>,
    /// Uuids of counter tracks whose descriptors are in the file.
    counter_uuids: HashSet<TrackUuid>,
    /// Global tracks of `write_instant` notes, by name.
    note_tracks: HashMap<String, TrackUuid>,
    /// Every uuid handed out, to detect (astronomically unlikely) collisions.
    issued: HashSet<TrackUuid>,
    /// Sequences that have had their first packet (see `emit_on`).
    started: HashSet<u32>,
    /// Packets for a tracing service's shared memory (see [`TraceWriter::for_service`]).
    for_service: bool,
}

impl<W: Write> TraceWriter<W> {
    /// A writer with [`DEFAULT_SEQUENCE_ID`].
    pub fn new(out: W) -> Self {
        Self::with_sequence_id(out, NonZeroU32::new(DEFAULT_SEQUENCE_ID).expect("nonzero"))
    }

    /// A writer whose packets all carry `sequence_id` (0 means "no sequence"
    /// to Perfetto, hence NonZero).
    pub fn with_sequence_id(out: W, sequence_id: NonZeroU32) -> Self {
        Self {
            out,
            sequence_id: sequence_id.get(),
            packets_written: 0,
            bytes_written: 0,
            poisoned: false,
            buf: Vec::with_capacity(4096),
            process_tracks: HashMap::new(),
            counter_tracks: HashMap::new(),
            counter_uuids: HashSet::new(),
            note_tracks: HashMap::new(),
            issued: HashSet::new(),
            started: HashSet::new(),
            for_service: false,
        }
    }

    /// A writer of packets that a producer hands to traced (through the
    /// Perfetto SDK) rather than of a trace file. Unlike a file:
    /// - no `trusted_packet_sequence_id`: traced stamps it from the writer's
    ///   id and its PacketStreamValidator rejects producer packets that set
    ///   it;
    /// - no `first_packet_on_sequence`: the SDK's TraceWriterImpl sets it on
    ///   the first packet of its sequence;
    /// - the first packet still carries SEQ_INCREMENTAL_STATE_CLEARED (one
    ///   writer per incremental-state generation, so after every clear the
    ///   track descriptors are written again), and every TrackEvent carries
    ///   SEQ_NEEDS_INCREMENTAL_STATE: its `track_uuid` refers to a
    ///   descriptor of this generation, so trace_processor must drop it if
    ///   the generation's start was lost (ring buffer overwritten).
    pub fn for_service(out: W) -> Self {
        let mut w = Self::new(out);
        w.for_service = true;
        w
    }

    /// ClockSnapshot with BOOTTIME and MONOTONIC read back to back.
    ///
    /// Our timestamps are CLOCK_BOOTTIME, Perfetto's default trace clock, so
    /// no packet needs `timestamp_clock_id`; the snapshot lets trace_processor
    /// convert MONOTONIC timestamps (bpf_ktime_get_ns, other traces) into the
    /// trace's BOOTTIME domain. `primary_trace_clock = BOOTTIME` states the
    /// trace clock explicitly, as traced does.
    pub fn write_clock_snapshot(&mut self, clocks: ClockPair) -> Result<(), PerfettoError> {
        let snapshot = ClockSnapshot {
            clocks: vec![
                clock_snapshot::Clock {
                    clock_id: Some(protos::BuiltinClock::Boottime as u32),
                    timestamp: Some(clocks.boottime_ns),
                    ..Default::default()
                },
                clock_snapshot::Clock {
                    clock_id: Some(protos::BuiltinClock::Monotonic as u32),
                    timestamp: Some(clocks.monotonic_ns),
                    ..Default::default()
                },
            ],
            primary_trace_clock: Some(protos::BuiltinClock::Boottime as i32),
        };
        self.emit(TracePacket {
            timestamp: Some(clocks.boottime_ns),
            data: Some(trace_packet::Data::ClockSnapshot(snapshot)),
            ..Default::default()
        })
    }

    /// SystemInfo: utsname (trace_processor picks the sched_switch prev_state
    /// encoding from `utsname.release`), USER_HZ, page size, CPUs, RAM.
    pub fn write_system_info(&mut self, facts: &SystemFacts) -> Result<(), PerfettoError> {
        let u = &facts.utsname;
        let info = SystemInfo {
            utsname: Some(protos::Utsname {
                sysname: Some(u.sysname.clone()),
                version: Some(u.version.clone()),
                release: Some(u.release.clone()),
                machine: Some(u.machine.clone()),
            }),
            hz: Some(i64::try_from(facts.hz).unwrap_or(i64::MAX)),
            page_size: Some(u32::try_from(facts.page_size_bytes).unwrap_or_else(|_| {
                log::warn!(
                    "page size {} does not fit SystemInfo.page_size (uint32)",
                    facts.page_size_bytes
                );
                u32::MAX
            })),
            num_cpus: Some(facts.num_cpus),
            system_ram_bytes: facts.system_ram_bytes,
            ..Default::default()
        };
        self.emit(TracePacket {
            data: Some(trace_packet::Data::SystemInfo(info)),
            ..Default::default()
        })
    }

    /// ProcessTree: gives pids and tids their names and parents in the UI.
    /// `threads` become ProcessTree.Thread with `tgid` = the process's pid.
    pub fn write_process_tree(
        &mut self,
        ts_boot_ns: u64,
        procs: &[ProcessTreeEntry],
    ) -> Result<(), PerfettoError> {
        let mut tree = ProcessTree::default();
        for p in procs {
            tree.processes.push(process_tree::Process {
                pid: Some(p.pid),
                ppid: Some(p.ppid),
                cmdline: p.cmdline.clone(),
                cmdline_is_comm: p.cmdline_is_comm.then_some(true),
                uid: p.uid,
                ..Default::default()
            });
            tree.threads
                .extend(p.threads.iter().map(|(tid, name)| process_tree::Thread {
                    tid: Some(*tid),
                    tgid: Some(p.pid),
                    name: Some(name.clone()),
                    ..Default::default()
                }));
        }
        self.emit(TracePacket {
            timestamp: Some(ts_boot_ns),
            data: Some(trace_packet::Data::ProcessTree(tree)),
            ..Default::default()
        })
    }

    /// Emits (once) a process TrackDescriptor for `process` and (once) a counter TrackDescriptor child of it; returns the counter track's uuid. Same (process, spec.name) -> same uuid, no new descriptor.
    ///
    /// The process descriptor carries `process { pid, process_name }`, which
    /// makes trace_processor attach the track to that process (upid) and show
    /// the counter under it in the UI.
    pub fn process_counter_track(
        &mut self,
        process: ProcessKey,
        process_name: &str,
        spec: &CounterSpec,
    ) -> Result<TrackUuid, PerfettoError> {
        if let Some(&uuid) = self.counter_tracks.get(&(Some(process), spec.name.clone())) {
            return Ok(uuid);
        }
        let parent = self.process_track(process, process_name)?;
        let uuid = self.fresh_uuid(track_uuid::process_counter_track(process, &spec.name));
        self.emit_counter_descriptor(uuid, Some(parent), spec)?;
        self.counter_tracks
            .insert((Some(process), spec.name.clone()), uuid);
        Ok(uuid)
    }

    /// A global (machine-wide) counter track, e.g. loadavg; emitted once per name.
    pub fn global_counter_track(&mut self, spec: &CounterSpec) -> Result<TrackUuid, PerfettoError> {
        if let Some(&uuid) = self.counter_tracks.get(&(None, spec.name.clone())) {
            return Ok(uuid);
        }
        let uuid = self.fresh_uuid(track_uuid::global_counter_track(&spec.name));
        self.emit_counter_descriptor(uuid, None, spec)?;
        self.counter_tracks.insert((None, spec.name.clone()), uuid);
        Ok(uuid)
    }

    /// A note at `ts_boot_ns`: an instant TrackEvent named `name` on the
    /// global track `track_name` (made on first use), which
    /// trace_processor lists in its `slice` table.
    pub fn write_instant(
        &mut self,
        ts_boot_ns: u64,
        track_name: &str,
        name: &str,
    ) -> Result<(), PerfettoError> {
        let uuid = match self.note_tracks.get(track_name) {
            Some(&uuid) => uuid,
            None => {
                let uuid = self.fresh_uuid(track_uuid::global_counter_track(&format!(
                    "note:{track_name}"
                )));
                self.emit(TracePacket {
                    data: Some(trace_packet::Data::TrackDescriptor(TrackDescriptor {
                        uuid: Some(uuid),
                        static_or_dynamic_name: Some(track_descriptor::StaticOrDynamicName::Name(
                            track_name.into(),
                        )),
                        ..Default::default()
                    })),
                    ..Default::default()
                })?;
                self.issued.insert(uuid);
                self.note_tracks.insert(track_name.into(), uuid);
                uuid
            }
        };
        self.emit(TracePacket {
            timestamp: Some(ts_boot_ns),
            data: Some(trace_packet::Data::TrackEvent(TrackEvent {
                r#type: Some(track_event::Type::Instant as i32),
                track_uuid: Some(uuid),
                name_field: Some(track_event::NameField::Name(name.into())),
                ..Default::default()
            })),
            ..Default::default()
        })
    }

    /// One counter value: a TrackEvent of `TYPE_COUNTER` on `track`, at
    /// `ts_boot_ns` (CLOCK_BOOTTIME, the default trace clock).
    pub fn write_counter(
        &mut self,
        ts_boot_ns: u64,
        track: TrackUuid,
        value: CounterValue,
    ) -> Result<(), PerfettoError> {
        if !self.counter_uuids.contains(&track) {
            return Err(PerfettoError::UnknownTrack { track });
        }
        let value = match value {
            CounterValue::Int(v) => track_event::CounterValueField::CounterValue(v),
            CounterValue::Double(v) if v.is_finite() => {
                track_event::CounterValueField::DoubleCounterValue(v)
            }
            CounterValue::Double(value) => {
                return Err(PerfettoError::NonFiniteValue { track, value })
            }
        };
        self.emit(TracePacket {
            timestamp: Some(ts_boot_ns),
            data: Some(trace_packet::Data::TrackEvent(TrackEvent {
                r#type: Some(track_event::Type::Counter as i32),
                track_uuid: Some(track),
                counter_value_field: Some(value),
                ..Default::default()
            })),
            ..Default::default()
        })
    }

    /// SysStats.cpu_stat: trace_processor turns these cumulative per-CPU times
    /// into its cpu.times counters. Nothing is written for an empty slice.
    pub fn write_cpu_stats(
        &mut self,
        ts_boot_ns: u64,
        cpus: &[CpuTimesNs],
    ) -> Result<(), PerfettoError> {
        if cpus.is_empty() {
            return Ok(());
        }
        let stats = SysStats {
            cpu_stat: cpus
                .iter()
                .map(|c| sys_stats::CpuTimes {
                    cpu_id: Some(c.cpu_id),
                    user_ns: Some(c.user_ns),
                    user_nice_ns: Some(c.user_nice_ns),
                    system_mode_ns: Some(c.system_mode_ns),
                    idle_ns: Some(c.idle_ns),
                    io_wait_ns: Some(c.io_wait_ns),
                    irq_ns: Some(c.irq_ns),
                    softirq_ns: Some(c.softirq_ns),
                    steal_ns: Some(c.steal_ns),
                })
                .collect(),
            ..Default::default()
        };
        self.emit_sys_stats(ts_boot_ns, stats)
    }

    /// SysStats.psi: cumulative stall time per resource (the `total=` of
    /// /proc/pressure/*, converted to ns by the caller). Nothing is written for
    /// an empty slice.
    pub fn write_psi(
        &mut self,
        ts_boot_ns: u64,
        samples: &[(PsiResource, u64 /*total_ns*/)],
    ) -> Result<(), PerfettoError> {
        if samples.is_empty() {
            return Ok(());
        }
        use sys_stats::psi_sample::PsiResource as P;
        let stats = SysStats {
            psi: samples
                .iter()
                .map(|&(resource, total_ns)| sys_stats::PsiSample {
                    resource: Some(match resource {
                        PsiResource::CpuSome => P::CpuSome,
                        PsiResource::CpuFull => P::CpuFull,
                        PsiResource::IoSome => P::IoSome,
                        PsiResource::IoFull => P::IoFull,
                        PsiResource::MemorySome => P::MemorySome,
                        PsiResource::MemoryFull => P::MemoryFull,
                    } as i32),
                    total_ns: Some(total_ns),
                })
                .collect(),
            ..Default::default()
        };
        self.emit_sys_stats(ts_boot_ns, stats)
    }

    /// ProcessStats: memory in kB and CPU runtimes in ns, the units
    /// trace_processor expects for its mem.* and runtime counters. Absent
    /// (`None`) fields are left unset rather than written as 0, so a failed
    /// read does not show up as a drop to zero. Nothing is written for an
    /// empty slice.
    pub fn write_process_stats(
        &mut self,
        ts_boot_ns: u64,
        procs: &[ProcessStatsEntry],
    ) -> Result<(), PerfettoError> {
        if procs.is_empty() {
            return Ok(());
        }
        let stats = ProcessStats {
            processes: procs
                .iter()
                .map(|p| process_stats::Process {
                    pid: Some(p.pid),
                    vm_size_kb: p.vm_size_kb,
                    vm_rss_kb: p.vm_rss_kb,
                    rss_anon_kb: p.rss_anon_kb,
                    rss_file_kb: p.rss_file_kb,
                    rss_shmem_kb: p.rss_shmem_kb,
                    vm_swap_kb: p.vm_swap_kb,
                    runtime_user_mode: p.runtime_user_mode_ns,
                    runtime_kernel_mode: p.runtime_kernel_mode_ns,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        self.emit(TracePacket {
            timestamp: Some(ts_boot_ns),
            data: Some(trace_packet::Data::ProcessStats(stats)),
            ..Default::default()
        })
    }

    /// Any prebuilt packet (for later capture-tier code); the writer fills in trusted_packet_sequence_id.
    ///
    /// It also sets the first-packet flags if this is the sequence's first
    /// packet. Packets using interned data must set `sequence_flags` with
    /// SEQ_NEEDS_INCREMENTAL_STATE themselves.
    pub fn write_packet(&mut self, packet: TracePacket) -> Result<(), PerfettoError> {
        self.emit(packet)
    }

    /// Like [`TraceWriter::write_packet`], on another sequence of the same
    /// file, e.g. one whose interned data (callstacks) must not mix with the
    /// main sequence's. Its first packet gets the first-packet flags.
    pub fn write_packet_on_sequence(
        &mut self,
        sequence_id: NonZeroU32,
        packet: TracePacket,
    ) -> Result<(), PerfettoError> {
        self.emit_on(sequence_id.get(), packet)
    }

    pub fn packets_written(&self) -> u64 {
        self.packets_written
    }

    pub fn bytes_written(&self) -> u64 {
        self.bytes_written
    }

    /// The `trusted_packet_sequence_id` on every packet.
    pub fn sequence_id(&self) -> u32 {
        self.sequence_id
    }

    pub fn flush(&mut self) -> Result<(), PerfettoError> {
        self.out
            .flush()
            .map_err(|source| PerfettoError::Flush { source })
    }

    /// The underlying writer, e.g. to take the encoded packets out of a
    /// `Vec<u8>`.
    pub fn get_mut(&mut self) -> &mut W {
        &mut self.out
    }

    /// The underlying writer, not flushed: call [`TraceWriter::flush`] first
    /// if `W` buffers.
    pub fn into_inner(self) -> W {
        self.out
    }

    fn process_track(
        &mut self,
        process: ProcessKey,
        process_name: &str,
    ) -> Result<TrackUuid, PerfettoError> {
        if let Some(&uuid) = self.process_tracks.get(&process) {
            return Ok(uuid);
        }
        let uuid = self.fresh_uuid(track_uuid::process_track(process));
        self.emit(TracePacket {
            data: Some(trace_packet::Data::TrackDescriptor(TrackDescriptor {
                uuid: Some(uuid),
                process: Some(ProcessDescriptor {
                    pid: Some(process.pid),
                    process_name: (!process_name.is_empty()).then(|| process_name.to_owned()),
                    ..Default::default()
                }),
                ..Default::default()
            })),
            ..Default::default()
        })?;
        self.process_tracks.insert(process, uuid);
        self.issued.insert(uuid);
        Ok(uuid)
    }

    fn emit_counter_descriptor(
        &mut self,
        uuid: TrackUuid,
        parent: Option<TrackUuid>,
        spec: &CounterSpec,
    ) -> Result<(), PerfettoError> {
        let (unit, unit_name) = match &spec.unit {
            CounterUnit::TimeNs => (counter_descriptor::Unit::TimeNs, None),
            CounterUnit::Count => (counter_descriptor::Unit::Count, None),
            CounterUnit::SizeBytes => (counter_descriptor::Unit::SizeBytes, None),
            // unit_name is only honoured when unit is UNIT_UNSPECIFIED.
            CounterUnit::Custom(name) => {
                (counter_descriptor::Unit::Unspecified, Some(name.clone()))
            }
        };
        self.emit(TracePacket {
            data: Some(trace_packet::Data::TrackDescriptor(TrackDescriptor {
                uuid: Some(uuid),
                parent_uuid: parent,
                static_or_dynamic_name: Some(track_descriptor::StaticOrDynamicName::Name(
                    spec.name.clone(),
                )),
                description: spec.description.clone(),
                counter: Some(CounterDescriptor {
                    unit: (unit != counter_descriptor::Unit::Unspecified).then_some(unit as i32),
                    unit_name,
                    ..Default::default()
                }),
                ..Default::default()
            })),
            ..Default::default()
        })?;
        self.counter_uuids.insert(uuid);
        self.issued.insert(uuid);
        Ok(())
    }

    /// `candidate`, or a deterministic rehash of it if another track already
    /// has that uuid (two tracks with one uuid would be merged by Perfetto).
    fn fresh_uuid(&self, candidate: TrackUuid) -> TrackUuid {
        let mut uuid = candidate;
        let mut attempt = 0;
        while self.issued.contains(&uuid) {
            attempt += 1;
            uuid = track_uuid::rehash(candidate, attempt);
            log::warn!("track uuid collision on {candidate:#018x}; using {uuid:#018x}");
        }
        uuid
    }

    fn emit_sys_stats(&mut self, ts_boot_ns: u64, stats: SysStats) -> Result<(), PerfettoError> {
        self.emit(TracePacket {
            timestamp: Some(ts_boot_ns),
            data: Some(trace_packet::Data::SysStats(stats)),
            ..Default::default()
        })
    }

    /// Stamps the sequence id (and first-packet flags) and writes the packet
    /// as one `Trace.packet` record with a single `write_all`.
    fn emit(&mut self, packet: TracePacket) -> Result<(), PerfettoError> {
        self.emit_on(self.sequence_id, packet)
    }

    fn emit_on(&mut self, sequence_id: u32, mut packet: TracePacket) -> Result<(), PerfettoError> {
        if self.poisoned {
            return Err(PerfettoError::Poisoned);
        }
        let kind = packet_kind(&packet);
        self.stamp(sequence_id, &mut packet);
        self.encode_and_write(kind, packet)
    }

    /// What `emit_on` sets on every packet: the sequence id, and the
    /// first-packet flags on a sequence's first.
    fn stamp(&mut self, sequence_id: u32, packet: &mut TracePacket) {
        if self.for_service {
            return self.stamp_for_service(packet);
        }
        packet.trusted_packet_sequence_id = Some(sequence_id);
        if self.started.insert(sequence_id) {
            // trace_processor treats a sequence's incremental state as invalid
            // until a packet with SEQ_INCREMENTAL_STATE_CLEARED arrives, and
            // drops packets needing it until then; first_packet_on_sequence
            // tells it that no earlier packets of this sequence were lost
            // (otherwise it may flag data loss at the start).
            let cleared = trace_packet::SequenceFlags::SeqIncrementalStateCleared as u32;
            packet.sequence_flags = Some(packet.sequence_flags.unwrap_or(0) | cleared);
            packet.first_packet_on_sequence = Some(true);
        }
    }

    /// `stamp` for [`TraceWriter::for_service`]: the sequence is the SDK's.
    fn stamp_for_service(&mut self, packet: &mut TracePacket) {
        let mut flags = packet.sequence_flags.unwrap_or(0);
        if self.started.insert(self.sequence_id) {
            flags |= trace_packet::SequenceFlags::SeqIncrementalStateCleared as u32;
        }
        if matches!(packet.data, Some(trace_packet::Data::TrackEvent(_))) {
            flags |= trace_packet::SequenceFlags::SeqNeedsIncrementalState as u32;
        }
        packet.sequence_flags = (flags != 0).then_some(flags);
    }

    fn encode_and_write(
        &mut self,
        kind: &'static str,
        packet: TracePacket,
    ) -> Result<(), PerfettoError> {
        self.buf.clear();
        self.buf.push(TRACE_PACKET_TAG);
        packet
            .encode_length_delimited(&mut self.buf)
            .map_err(|source| PerfettoError::Encode { kind, source })?;
        self.write_buf(kind)
    }

    /// Writes the record encoded in `buf`.
    fn write_buf(&mut self, kind: &'static str) -> Result<(), PerfettoError> {
        if self.poisoned {
            return Err(PerfettoError::Poisoned);
        }
        // One write_all per whole record: with a buffered W that reaches the
        // file in order, so after a crash the file holds whole packets plus at
        // most one torn tail, which readers report as truncated.
        if let Err(source) = self.out.write_all(&self.buf) {
            self.poisoned = true;
            log::error!(
                "perfetto: writing {kind} packet #{} failed, no further packets will be written: {source}",
                self.packets_written
            );
            return Err(PerfettoError::Write {
                kind,
                index: self.packets_written,
                len: self.buf.len(),
                source,
            });
        }
        self.packets_written += 1;
        self.bytes_written += self.buf.len() as u64;
        log::trace!("perfetto: wrote {kind} packet ({} bytes)", self.buf.len());
        Ok(())
    }
}

/// Short name of the packet's payload, for errors and logs.
fn packet_kind(packet: &TracePacket) -> &'static str {
    use trace_packet::Data;
    match &packet.data {
        None => "empty",
        Some(Data::TrackEvent(_)) => "track_event",
        Some(Data::TrackDescriptor(_)) => "track_descriptor",
        Some(Data::ProcessTree(_)) => "process_tree",
        Some(Data::ProcessStats(_)) => "process_stats",
        Some(Data::ClockSnapshot(_)) => "clock_snapshot",
        Some(Data::SysStats(_)) => "sys_stats",
        Some(Data::TraceConfig(_)) => "trace_config",
        Some(Data::ProfilePacket(_)) => "profile_packet",
        Some(Data::SystemInfo(_)) => "system_info",
        Some(Data::PerfSample(_)) => "perf_sample",
        Some(Data::FtraceEvents(_)) => "ftrace_events",
        Some(Data::TraceStats(_)) => "trace_stats",
    }
}
