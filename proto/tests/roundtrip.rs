//! Encoding then decoding a TracePacket must give back the same packet, and
//! a `Trace` must decode from concatenated length-delimited packets (the file
//! format the daemon streams).

use prost::Message;
use vitals_proto::protos::{
    self, counter_descriptor, trace_packet, track_descriptor, track_event, ClockSnapshot,
    CounterDescriptor, ProcessDescriptor, TrackDescriptor, TrackEvent,
};
use vitals_proto::{Trace, TracePacket};

fn sample_packets() -> Vec<TracePacket> {
    vec![
        TracePacket {
            trusted_packet_sequence_id: Some(7),
            sequence_flags: Some(trace_packet::SequenceFlags::SeqIncrementalStateCleared as u32),
            first_packet_on_sequence: Some(true),
            data: Some(trace_packet::Data::ClockSnapshot(ClockSnapshot {
                clocks: vec![protos::clock_snapshot::Clock {
                    clock_id: Some(6),
                    timestamp: Some(123),
                    ..Default::default()
                }],
                primary_trace_clock: Some(protos::BuiltinClock::Boottime as i32),
            })),
            ..Default::default()
        },
        TracePacket {
            trusted_packet_sequence_id: Some(7),
            data: Some(trace_packet::Data::TrackDescriptor(TrackDescriptor {
                uuid: Some(42),
                parent_uuid: Some(41),
                static_or_dynamic_name: Some(track_descriptor::StaticOrDynamicName::Name(
                    "rss".into(),
                )),
                process: Some(ProcessDescriptor {
                    pid: Some(10),
                    process_name: Some("init".into()),
                    ..Default::default()
                }),
                counter: Some(CounterDescriptor {
                    unit: Some(counter_descriptor::Unit::SizeBytes as i32),
                    ..Default::default()
                }),
                ..Default::default()
            })),
            ..Default::default()
        },
        TracePacket {
            timestamp: Some(1_000),
            trusted_packet_sequence_id: Some(7),
            data: Some(trace_packet::Data::TrackEvent(TrackEvent {
                r#type: Some(track_event::Type::Counter as i32),
                track_uuid: Some(42),
                counter_value_field: Some(track_event::CounterValueField::DoubleCounterValue(1.5)),
                ..Default::default()
            })),
            ..Default::default()
        },
    ]
}

#[test]
fn trace_packet_round_trips() {
    for p in sample_packets() {
        let bytes = p.encode_to_vec();
        let back = TracePacket::decode(bytes.as_slice()).expect("decode");
        assert_eq!(back, p);
    }
}

#[test]
fn trace_decodes_from_concatenated_packets() {
    let packets = sample_packets();
    let mut file = Vec::new();
    for p in &packets {
        // Trace.packet is field 1, length-delimited: tag 0x0a, varint length.
        file.push(0x0a);
        prost::encoding::encode_varint(p.encoded_len() as u64, &mut file);
        p.encode(&mut file).unwrap();
    }
    let trace = Trace::decode(file.as_slice()).expect("decode trace");
    assert_eq!(trace.packet, packets);
    // Same bytes as prost's own encoding of the whole Trace.
    assert_eq!(Trace { packet: packets }.encode_to_vec(), file);
}
