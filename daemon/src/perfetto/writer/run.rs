//! Runs of packets that differ only in their timestamp, written at once
//! (`TraceWriter::write_run_on_sequence`).

use std::io::Write;
use std::num::NonZeroU32;

use prost::Message;
use vitals_proto::protos::TracePacket;

use super::{packet_kind, PerfettoError, TraceWriter, TRACE_PACKET_TAG};

/// `TracePacket.timestamp`: field 8, varint.
const TIMESTAMP_TAG: u8 = 8 << 3;

impl<W: Write> TraceWriter<W> {
    /// `first`, then `count - 1` copies of it each `step_ns` later, on
    /// `sequence_id` as `write_packet_on_sequence` would write them one by
    /// one: a run of samples that differ only in their timestamp (an
    /// off-CPU block is one a millisecond blocked). The copies' shared
    /// fields are encoded once and each copy written as its timestamp
    /// followed by them (a message's fields may come in any order):
    /// building and encoding a TracePacket per sample was, with the Vec
    /// that held them, half of an off-CPU capture's own CPU in the guest
    /// bench's profile.
    pub fn write_run_on_sequence(
        &mut self,
        sequence_id: NonZeroU32,
        mut first: TracePacket,
        step_ns: u64,
        count: u64,
    ) -> Result<(), PerfettoError> {
        if count == 0 {
            return Ok(());
        }
        let Some(first_ts) = first.timestamp else {
            // No timestamp to step: `count` alike packets, the first (with
            // the interned data) ahead of the copies.
            let mut copy = first.clone();
            copy.interned_data = None;
            self.emit_on(sequence_id.get(), first)?;
            for _ in 1..count {
                self.emit_on(sequence_id.get(), copy.clone())?;
            }
            return Ok(());
        };
        // The copies: no interned data (the first carries it), no timestamp
        // (each its own), and stamped after the first, so never with the
        // first-packet flags.
        let interned = first.interned_data.take();
        let mut copy = first.clone();
        first.interned_data = interned;
        self.emit_on(sequence_id.get(), first)?;
        if count == 1 {
            return Ok(());
        }
        let kind = packet_kind(&copy);
        copy.timestamp = None;
        self.stamp(sequence_id.get(), &mut copy);
        let shared = copy.encode_to_vec();
        for i in 1..count {
            let ts = first_ts + i * step_ns;
            self.buf.clear();
            self.buf.push(TRACE_PACKET_TAG);
            let ts_field_len = 1 + prost::encoding::encoded_len_varint(ts);
            prost::encoding::encode_varint((ts_field_len + shared.len()) as u64, &mut self.buf);
            self.buf.push(TIMESTAMP_TAG);
            prost::encoding::encode_varint(ts, &mut self.buf);
            self.buf.extend_from_slice(&shared);
            self.write_buf(kind)?;
        }
        Ok(())
    }
}
