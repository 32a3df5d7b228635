//! A capture's long blocks on the blocked thread's timeline.
//!
//! Each long block (a watched thread blocked at least the capture's
//! threshold, `events/` decodes them) becomes:
//! - a slice `blocked <state>` on an "off-cpu" track of the blocked thread
//!   (a TrackDescriptor with a ThreadDescriptor, which trace_processor
//!   puts in `thread_track` and the UI under the thread), from the
//!   switch-out to the sched_waking that ended it: its `dur` is the blocked
//!   time;
//! - an instant `wakes <tid>` on the waker's off-CPU track at the waking,
//!   the start of a flow (`flow_ids`) that ends (`terminating_flow_ids`)
//!   on an instant `woken by <tid>` on the blocked thread's track 1 ns
//!   later: trace_processor parses flows in timestamp order and drops a
//!   flow end seen before its start, and the blocked slice starts first.
//!
//! The two stacks are PerfSamples (`fault_samples.rs`, roots `[off-cpu]`
//! and `[waker]`) at the same timestamps on the same threads.

use std::collections::HashSet;

use vitals_proto::protos::{
    trace_packet, track_descriptor, track_event, ThreadDescriptor, TracePacket, TrackDescriptor,
    TrackEvent,
};

use super::track_uuid;

/// One long block, as the programs reported it at its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LongBlock {
    /// CLOCK_BOOTTIME of the switch-out and of the sched_waking.
    pub blocked_ts: u64,
    pub waking_ts: u64,
    pub tid: u32,
    pub tgid: u32,
    pub waker_tid: u32,
    pub waker_tgid: u32,
    /// sched_switch's `prev_state` (TASK_REPORT bits).
    pub prev_state: i64,
}

/// The state letter trace_processor shows for a blocked `prev_state`.
fn state_letter(prev_state: i64) -> &'static str {
    match prev_state & 0xff {
        0x1 => "S",
        0x2 => "D",
        0x4 => "T",
        0x8 => "t",
        0x40 => "P",
        0x80 => "I",
        _ => "?",
    }
}

/// The thread tracks described so far and the next flow id.
#[derive(Default)]
pub struct OffcpuBlocks {
    described: HashSet<u32>,
    next_flow: u64,
}

impl OffcpuBlocks {
    pub fn new() -> Self {
        Self::default()
    }

    /// The packets of one long block, descriptors of new tracks first.
    pub fn packets(&mut self, b: &LongBlock) -> Vec<TracePacket> {
        let mut out = Vec::with_capacity(6);
        let blocked = self.track(b.tid, b.tgid, &mut out);
        let waker = self.track(b.waker_tid, b.waker_tgid, &mut out);
        self.next_flow += 1;
        let flow = self.next_flow;
        let event = |track: u64, ty: track_event::Type, name: Option<String>| TrackEvent {
            r#type: Some(ty as i32),
            track_uuid: Some(track),
            name_field: name.map(track_event::NameField::Name),
            categories: vec!["offcpu".into()],
            ..Default::default()
        };
        let state = state_letter(b.prev_state);
        let begin = event(
            blocked,
            track_event::Type::SliceBegin,
            Some(format!("blocked {state}")),
        );
        let end = event(blocked, track_event::Type::SliceEnd, None);
        let mut wakes = event(
            waker,
            track_event::Type::Instant,
            Some(format!("wakes {}", b.tid)),
        );
        wakes.flow_ids = vec![flow];
        let mut woken = event(
            blocked,
            track_event::Type::Instant,
            Some(format!("woken by {}", b.waker_tid)),
        );
        woken.terminating_flow_ids = vec![flow];
        let events = [
            (b.blocked_ts, begin),
            (b.waking_ts, end),
            (b.waking_ts, wakes),
            (b.waking_ts + 1, woken),
        ];
        out.extend(events.into_iter().map(|(ts, e)| TracePacket {
            timestamp: Some(ts),
            data: Some(trace_packet::Data::TrackEvent(e)),
            ..Default::default()
        }));
        out
    }

    /// The off-CPU track of `tid`, described on first use.
    fn track(&mut self, tid: u32, tgid: u32, out: &mut Vec<TracePacket>) -> u64 {
        let uuid = track_uuid::offcpu_thread_track(tid);
        if self.described.insert(tid) {
            out.push(TracePacket {
                data: Some(trace_packet::Data::TrackDescriptor(TrackDescriptor {
                    uuid: Some(uuid),
                    static_or_dynamic_name: Some(track_descriptor::StaticOrDynamicName::Name(
                        "off-cpu".into(),
                    )),
                    thread: Some(ThreadDescriptor {
                        // A waker in an interrupt over the idle task is
                        // tid 0; trace_processor files it under swapper.
                        pid: Some(tgid as i32),
                        tid: Some(tid as i64),
                        ..Default::default()
                    }),
                    ..Default::default()
                })),
                ..Default::default()
            });
        }
        uuid
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(p: &[TracePacket]) -> Vec<(u64, TrackEvent)> {
        p.iter()
            .filter_map(|p| match &p.data {
                Some(trace_packet::Data::TrackEvent(e)) => Some((p.timestamp?, e.clone())),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_block_is_a_slice_on_its_thread_with_a_flow_from_its_waker() {
        let b = LongBlock {
            blocked_ts: 1_000,
            waking_ts: 41_000,
            tid: 7,
            tgid: 5,
            waker_tid: 8,
            waker_tgid: 5,
            prev_state: 1,
        };
        let mut o = OffcpuBlocks::new();
        let p = o.packets(&b);
        // Two track descriptors, then four events.
        assert_eq!(p.len(), 6);
        let ev = events(&p);
        assert_eq!(ev[0].0, 1_000);
        assert_eq!(
            ev[0].1.name_field,
            Some(track_event::NameField::Name("blocked S".into()))
        );
        assert_eq!(ev[1].0, 41_000);
        assert_eq!(ev[0].1.track_uuid, ev[1].1.track_uuid);
        assert_ne!(ev[2].1.track_uuid, ev[0].1.track_uuid);
        assert_eq!(ev[2].1.flow_ids, ev[3].1.terminating_flow_ids);
        assert!(ev[3].0 > ev[2].0);
        // The tracks are described once.
        let again = o.packets(&b);
        assert_eq!(again.len(), 4);
        assert_ne!(events(&again)[2].1.flow_ids, ev[2].1.flow_ids);
    }
}
