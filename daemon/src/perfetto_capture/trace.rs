//! What a Perfetto-backend capture's trace holds, read back from the file
//! the consumer route wrote: whether any data source wrote to it (traced
//! alone always writes its config, clock snapshots and stats), and
//! traced's TraceStats, whose chunks_discarded says the buffer filled up.

use std::{
    fs::File,
    io::{BufReader, Read},
    path::Path,
};

use prost::Message;

use crate::perfetto::protos::TraceStats;

/// `Trace.packet` (field 1) and `TracePacket.trace_stats` (field 35).
const PACKET_FIELD: u64 = 1;
const TRACE_STATS_FIELD: u64 = 35;
/// TracePacket fields only a data source writes: ftrace_events (1),
/// process_tree (2), sys_stats (7), process_stats (9), track_event (11),
/// track_descriptor (60).
const DATA_FIELDS: [u64; 6] = [1, 2, 7, 9, 11, 60];
/// A packet larger than this is not read into memory (traced's chunks are
/// far smaller; a larger length means a corrupt file).
const MAX_PACKET_BYTES: u64 = 64 << 20;

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct TraceContents {
    pub packets: u64,
    /// Packets a data source wrote (ftrace, process and system stats,
    /// track events), not traced itself.
    pub data_packets: u64,
    /// Chunks traced dropped because the buffer was full (DISCARD).
    pub chunks_discarded: u64,
    /// The stats were found (traced writes them at the end).
    pub has_stats: bool,
}

fn varint(data: &[u8], at: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    for i in 0..10 {
        let b = *data.get(*at)?;
        *at += 1;
        value |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

fn read_varint(r: &mut impl Read) -> std::io::Result<Option<u64>> {
    let mut value = 0u64;
    for i in 0..10 {
        let mut b = [0u8];
        if r.read(&mut b)? == 0 {
            return Ok(None);
        }
        value |= u64::from(b[0] & 0x7f) << (7 * i);
        if b[0] & 0x80 == 0 {
            return Ok(Some(value));
        }
    }
    Ok(None)
}

/// Visits the fields of one TracePacket.
fn scan_packet(payload: &[u8], c: &mut TraceContents) {
    let mut at = 0;
    let mut data = false;
    while at < payload.len() {
        let Some(key) = varint(payload, &mut at) else {
            return;
        };
        let (field, wire) = (key >> 3, key & 7);
        let len = match wire {
            0 => {
                if varint(payload, &mut at).is_none() {
                    return;
                }
                0
            }
            1 => 8,
            5 => 4,
            2 => match varint(payload, &mut at) {
                Some(l) => l as usize,
                None => return,
            },
            _ => return,
        };
        let Some(body) = payload.get(at..at.saturating_add(len)) else {
            return;
        };
        at += len;
        data |= DATA_FIELDS.contains(&field);
        if field == TRACE_STATS_FIELD && wire == 2 {
            if let Ok(stats) = TraceStats::decode(body) {
                c.has_stats = true;
                c.chunks_discarded += stats
                    .buffer_stats
                    .iter()
                    .map(|b| b.chunks_discarded.unwrap_or(0))
                    .sum::<u64>();
            }
        }
    }
    if data {
        c.data_packets += 1;
    }
}

/// Reads the trace at `path` packet by packet.
pub fn read(path: &Path) -> std::io::Result<TraceContents> {
    let mut r = BufReader::with_capacity(256 << 10, File::open(path)?);
    let mut c = TraceContents::default();
    let mut buf = Vec::new();
    while let Some(key) = read_varint(&mut r)? {
        let (field, wire) = (key >> 3, key & 7);
        if wire != 2 {
            break;
        }
        let Some(len) = read_varint(&mut r)? else {
            break;
        };
        if len > MAX_PACKET_BYTES {
            break;
        }
        buf.resize(len as usize, 0);
        if r.read_exact(&mut buf).is_err() {
            break;
        }
        if field == PACKET_FIELD {
            c.packets += 1;
            scan_packet(&buf, &mut c);
        }
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::perfetto::protos::{trace_packet, trace_stats::BufferStats, Trace, TracePacket};

    fn packet(data: trace_packet::Data) -> TracePacket {
        TracePacket {
            data: Some(data),
            ..Default::default()
        }
    }

    #[test]
    fn finds_discarded_chunks_and_data_packets() {
        let trace = Trace {
            packet: vec![
                packet(trace_packet::Data::SysStats(Default::default())),
                packet(trace_packet::Data::TraceStats(TraceStats {
                    buffer_stats: vec![BufferStats {
                        buffer_size: Some(4096),
                        bytes_written: Some(4096),
                        chunks_discarded: Some(7),
                    }],
                })),
                packet(trace_packet::Data::ClockSnapshot(Default::default())),
            ],
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t");
        std::fs::write(&path, trace.encode_to_vec()).unwrap();
        let c = read(&path).unwrap();
        assert_eq!(
            c,
            TraceContents {
                packets: 3,
                data_packets: 1,
                chunks_discarded: 7,
                has_stats: true,
            }
        );
    }

    #[test]
    fn only_traced_packets_are_no_data() {
        let trace = Trace {
            packet: vec![packet(
                trace_packet::Data::ClockSnapshot(Default::default()),
            )],
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t");
        std::fs::write(&path, trace.encode_to_vec()).unwrap();
        let c = read(&path).unwrap();
        assert_eq!((c.packets, c.data_packets, c.has_stats), (1, 0, false));
    }
}
