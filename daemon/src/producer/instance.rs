//! One data source instance (one tracing session listing the data source):
//! its config and what it has written into its sequence.
//!
//! Packets are encoded by the same [`TraceWriter`] and
//! [`ProcessCounterTracks`] as `vitalsd record`'s trace files, in the
//! writer's service mode, into a buffer that the producer thread then
//! splits into packets for the SDK.

use std::collections::{HashMap, HashSet};

use crate::{
    accounting::CounterOrigin,
    export,
    perfetto::{PerfettoError, ProcessKey, TraceWriter},
    process_tracks::{process_counters, tree_entries, ProcessCounterTracks, ProcessIdentity},
};

use super::{config::InstanceConfig, TickData};

/// Field 1 (`Trace.packet`), wire type 2, as the writer frames every packet.
const TRACE_PACKET_TAG: u8 = 0x0a;

pub(super) struct Instance {
    pub config: InstanceConfig,
    pub started: bool,
    /// The history prelude is still to be written.
    pub prelude_pending: bool,
    origin: CounterOrigin,
    /// This incremental-state generation's writer and tracks: a clear
    /// starts both anew, so descriptors are written again.
    writer: TraceWriter<Vec<u8>>,
    tracks: ProcessCounterTracks,
    /// Process instances (pid, starttime) in this generation's ProcessTree.
    named: HashSet<(u32, u64)>,
    header_written: bool,
    last_write_ns: Option<u64>,
    /// The SDK writer's drop count at the last look.
    pub drop_count: u64,
}

impl Instance {
    pub(super) fn new(config: InstanceConfig, origin: CounterOrigin) -> Self {
        let prelude_pending = !config.prelude.is_zero();
        let tracks = Self::tracks(&config, origin);
        Self {
            config,
            started: false,
            prelude_pending,
            origin,
            writer: TraceWriter::for_service(Vec::new()),
            tracks,
            named: HashSet::new(),
            header_written: false,
            last_write_ns: None,
            drop_count: 0,
        }
    }

    fn tracks(cfg: &InstanceConfig, origin: CounterOrigin) -> ProcessCounterTracks {
        ProcessCounterTracks::new(
            process_counters(origin, "vitalsd started")
                .into_iter()
                .filter(|c| cfg.counters.contains(&c.kind))
                .collect(),
        )
    }

    /// traced cleared the sequence's incremental state (or the SDK made a
    /// new writer): everything the sequence relied on is written again.
    pub(super) fn reset_generation(&mut self) {
        self.writer = TraceWriter::for_service(Vec::new());
        self.tracks = Self::tracks(&self.config, self.origin);
        self.named.clear();
        self.header_written = false;
    }

    /// Whether `ts_boot_ns` is an interval past the last write; `slack`
    /// absorbs the jitter of the sampling loop's ticks.
    pub(super) fn due(&self, ts_boot_ns: u64, slack_ns: u64) -> bool {
        self.last_write_ns.is_none_or(|last| {
            ts_boot_ns.saturating_sub(last) + slack_ns >= self.config.interval.as_nanos() as u64
        })
    }

    /// Encodes one tick: on a generation's first write a ProcessTree of
    /// every known process, the prelude once, then the counters that
    /// changed and ProcessTree entries for processes not yet named.
    pub(super) fn write(
        &mut self,
        tick: &TickData,
        known: &HashMap<u32, ProcessIdentity>,
    ) -> Result<(), PerfettoError> {
        let ts = tick.ts_boot_ns;
        if !self.header_written {
            let mut all: Vec<&ProcessIdentity> = known.values().collect();
            all.sort_by_key(|p| p.pid);
            self.writer.write_process_tree(ts, &tree_entries(all))?;
            self.named = known.values().map(|p| (p.pid, p.starttime_ticks)).collect();
            self.header_written = true;
        }
        if self.prelude_pending {
            if let Some(history) = &tick.history {
                export::write_history(&mut self.writer, history)?;
                self.prelude_pending = false;
            }
        }
        let mut new = Vec::new();
        for r in &tick.rows {
            let id = known.get(&r.tgid);
            let exit_name = r.exit_comm_str();
            let name = id.map(|i| i.name()).or(exit_name.as_deref()).unwrap_or("");
            let starttime_ticks = id.map_or(0, |i| i.starttime_ticks);
            let key = ProcessKey {
                pid: r.tgid as i32,
                starttime_ticks,
            };
            self.tracks.write(&mut self.writer, key, name, r, ts)?;
            if r.ended {
                self.tracks.forget(r.tgid);
            } else if let Some(id) = id {
                if self.named.insert((id.pid, starttime_ticks)) {
                    new.push(id);
                }
            }
        }
        // After the new processes' counters, as `vitalsd record` does:
        // trace_processor starts a new process for a reused pid when the
        // new process track resolves, and an entry before that would rename
        // the pid's previous process.
        if !new.is_empty() {
            self.writer.write_process_tree(ts, &tree_entries(new))?;
        }
        self.last_write_ns = Some(ts);
        Ok(())
    }

    /// The packets encoded since the last call, each without the
    /// `Trace.packet` framing, and forgets them.
    pub(super) fn take_packets(&mut self, mut each: impl FnMut(&[u8])) {
        let buf = self.writer.get_mut();
        let mut rest = buf.as_slice();
        while let Some((&TRACE_PACKET_TAG, after_tag)) = rest.split_first() {
            let Some((len, after_len)) = varint(after_tag) else {
                break;
            };
            let Some((body, next)) = after_len.split_at_checked(len) else {
                break;
            };
            each(body);
            rest = next;
        }
        debug_assert!(rest.is_empty(), "the writer frames whole packets");
        buf.clear();
    }
}

/// A protobuf varint and what follows it.
fn varint(bytes: &[u8]) -> Option<(usize, &[u8])> {
    let mut v: u64 = 0;
    for (i, b) in bytes.iter().enumerate().take(10) {
        v |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Some((usize::try_from(v).ok()?, &bytes[i + 1..]));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{bpf::totals::ProcessCounters, bpf::FaultSource, producer::config::parse};
    use prost::Message;
    use std::sync::Arc;
    use vitals_proto::protos::{trace_packet::Data, TracePacket};

    fn identity(pid: u32, name: &str) -> ProcessIdentity {
        ProcessIdentity {
            pid,
            ppid: 1,
            comm: name.into(),
            starttime_ticks: 100 + pid as u64,
            cmdline: Arc::from(format!("/bin/{name}\0").as_str()),
        }
    }

    fn decode(inst: &mut Instance) -> Vec<TracePacket> {
        let mut v = Vec::new();
        inst.take_packets(|b| v.push(TracePacket::decode(b).unwrap()));
        v
    }

    #[test]
    fn packets_follow_perfettos_sequence_rules() {
        let cfg = parse("counters=oncpu").unwrap();
        let mut inst = Instance::new(
            cfg,
            CounterOrigin::Ebpf {
                fault_source: FaultSource::None,
                runq_wait: false,
                offcpu: false,
            },
        );
        let known = HashMap::from([(7, identity(7, "spin"))]);
        let row = ProcessCounters {
            tgid: 7,
            oncpu_ns: 5_000,
            ..Default::default()
        };
        let tick = TickData {
            ts_boot_ns: 1_000,
            rows: vec![row],
            processes: Vec::new(),
            history: None,
        };
        inst.write(&tick, &known).unwrap();
        let packets = decode(&mut inst);
        // ProcessTree, process track, counter track, one counter value.
        assert_eq!(packets.len(), 4, "{packets:#?}");
        assert!(matches!(packets[0].data, Some(Data::ProcessTree(_))));
        assert_eq!(packets[0].sequence_flags, Some(1), "first packet clears");
        for p in &packets {
            assert_eq!(p.trusted_packet_sequence_id, None, "traced sets it");
            assert_eq!(p.first_packet_on_sequence, None, "the SDK sets it");
        }
        assert_eq!(
            packets[3].sequence_flags,
            Some(2),
            "needs incremental state"
        );

        // Unchanged counters write nothing; a cleared generation starts over.
        inst.write(
            &TickData {
                ts_boot_ns: 2_000,
                ..tick_clone(&tick)
            },
            &known,
        )
        .unwrap();
        assert!(decode(&mut inst).is_empty());
        inst.reset_generation();
        inst.write(
            &TickData {
                ts_boot_ns: 3_000,
                ..tick_clone(&tick)
            },
            &known,
        )
        .unwrap();
        let again = decode(&mut inst);
        assert_eq!(again.len(), 4);
        assert_eq!(again[0].sequence_flags, Some(1));
    }

    fn tick_clone(t: &TickData) -> TickData {
        TickData {
            ts_boot_ns: t.ts_boot_ns,
            rows: t.rows.clone(),
            processes: t.processes.clone(),
            history: None,
        }
    }

    #[test]
    fn due_after_an_interval_with_slack() {
        let cfg = parse("interval_ms=1000").unwrap();
        let mut inst = Instance::new(
            cfg,
            CounterOrigin::Ebpf {
                fault_source: FaultSource::None,
                runq_wait: false,
                offcpu: false,
            },
        );
        assert!(inst.due(5, 0));
        inst.last_write_ns = Some(1_000_000_000);
        assert!(!inst.due(1_900_000_000, 0));
        assert!(inst.due(1_900_000_000, 100_000_000));
        assert!(inst.due(2_000_000_000, 0));
    }
}
