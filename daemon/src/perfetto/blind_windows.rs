//! A capture's blind windows (`vitals_common::blind`) on the timeline.
//!
//! Each window is a slice `<k> unseen switches` from the last seen switch
//! on its CPU to the switch that revealed it, on a track "cpu <n>" under
//! one parent track "blind windows (classic sched_switch)". Global
//! TrackDescriptors (neither process nor thread): trace_processor imports
//! them into `track`, the slices into `slice`, and the UI shows them among
//! the trace's top-level tracks, one child per CPU in CPU order. Inside a
//! window the sched timeline of that CPU is missing `k` switches: a slice
//! there may stand for several tasks' runs.

use std::collections::HashSet;

use vitals_proto::protos::{
    trace_packet, track_descriptor, track_event, TracePacket, TrackDescriptor, TrackEvent,
};

use super::track_uuid;

/// The parent track's name; each CPU's track is "cpu <n>" under it.
pub const PARENT_TRACK_NAME: &str = "blind windows (classic sched_switch)";

/// One blind window as the programs reported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlindWindow {
    pub cpu: u32,
    /// CLOCK_BOOTTIME of the last seen switch and of the revealing one.
    pub start_ts: u64,
    pub end_ts: u64,
    pub unseen_switches: u32,
    /// `vitals_common::blind::SEEN_BY_*` bits.
    pub seen_by: u32,
}

/// The slice name of a window with `unseen` switches.
pub fn slice_name(unseen: u32) -> String {
    format!("{unseen} unseen switches")
}

/// Which tracks are described so far.
#[derive(Default)]
pub struct BlindWindowTracks {
    parent: bool,
    cpus: HashSet<u32>,
}

impl BlindWindowTracks {
    pub fn new() -> Self {
        Self::default()
    }

    /// One window's packets, descriptors of new tracks first.
    pub fn packets(&mut self, w: &BlindWindow) -> Vec<TracePacket> {
        let mut out = Vec::with_capacity(4);
        let parent = track_uuid::blind_window_track(None);
        if !self.parent {
            self.parent = true;
            out.push(descriptor(TrackDescriptor {
                uuid: Some(parent),
                static_or_dynamic_name: Some(track_descriptor::StaticOrDynamicName::Name(
                    PARENT_TRACK_NAME.into(),
                )),
                description: Some(
                    "stretches where the classic sched_switch programs saw no switch although the CPU's context-switch counter advanced: a task was preempted inside a bpf() syscall (bpf_prog_active raised); the CPU's sched slices there are incomplete".into(),
                ),
                child_ordering: Some(track_descriptor::ChildTracksOrdering::Explicit as i32),
                ..Default::default()
            }));
        }
        let track = track_uuid::blind_window_track(Some(w.cpu));
        if self.cpus.insert(w.cpu) {
            out.push(descriptor(TrackDescriptor {
                uuid: Some(track),
                parent_uuid: Some(parent),
                static_or_dynamic_name: Some(track_descriptor::StaticOrDynamicName::Name(format!(
                    "cpu {}",
                    w.cpu
                ))),
                sibling_order_rank: Some(w.cpu as i32),
                ..Default::default()
            }));
        }
        let event = |ty: track_event::Type, name: Option<String>| TrackEvent {
            r#type: Some(ty as i32),
            track_uuid: Some(track),
            name_field: name.map(track_event::NameField::Name),
            categories: vec!["blind_window".into()],
            ..Default::default()
        };
        let begin = event(
            track_event::Type::SliceBegin,
            Some(slice_name(w.unseen_switches)),
        );
        let end = event(track_event::Type::SliceEnd, None);
        out.extend(
            [(w.start_ts, begin), (w.end_ts.max(w.start_ts), end)]
                .into_iter()
                .map(|(ts, e)| TracePacket {
                    timestamp: Some(ts),
                    data: Some(trace_packet::Data::TrackEvent(e)),
                    ..Default::default()
                }),
        );
        out
    }
}

fn descriptor(d: TrackDescriptor) -> TracePacket {
    TracePacket {
        data: Some(trace_packet::Data::TrackDescriptor(d)),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_is_a_named_slice_on_its_cpus_track_described_once() {
        let w = BlindWindow {
            cpu: 1,
            start_ts: 100,
            end_ts: 900,
            unseen_switches: 3,
            seen_by: 1,
        };
        let mut t = BlindWindowTracks::new();
        let p = t.packets(&w);
        // Parent and cpu track descriptors, then begin and end.
        assert_eq!(p.len(), 4);
        let ev: Vec<(u64, TrackEvent)> = p
            .iter()
            .filter_map(|p| match &p.data {
                Some(trace_packet::Data::TrackEvent(e)) => Some((p.timestamp?, e.clone())),
                _ => None,
            })
            .collect();
        assert_eq!(ev[0].0, 100);
        assert_eq!(ev[1].0, 900);
        assert_eq!(
            ev[0].1.name_field,
            Some(track_event::NameField::Name("3 unseen switches".into()))
        );
        assert_eq!(t.packets(&w).len(), 2);
        let other = t.packets(&BlindWindow { cpu: 0, ..w });
        assert_eq!(other.len(), 3);
    }
}
