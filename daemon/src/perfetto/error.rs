use std::io;

use thiserror::Error;

use super::types::TrackUuid;

#[derive(Debug, Error)]
pub enum PerfettoError {
    /// The underlying writer failed. The packet may be partly on disk, so the
    /// writer refuses further packets (see [`PerfettoError::Poisoned`]).
    #[error("writing {kind} packet #{index} ({len} bytes) to the trace: {source}")]
    Write {
        kind: &'static str,
        index: u64,
        len: usize,
        #[source]
        source: io::Error,
    },
    #[error("encoding {kind} packet: {source}")]
    Encode {
        kind: &'static str,
        #[source]
        source: prost::EncodeError,
    },
    #[error("flushing the trace: {source}")]
    Flush {
        #[source]
        source: io::Error,
    },
    /// An earlier write failed part-way; appending more packets after a torn
    /// one would make everything after it undecodable, so the file is left
    /// ending at the last whole packet plus the torn bytes.
    #[error("trace writer stopped after an earlier failed write; start a new trace file")]
    Poisoned,
    /// Counter values must go to a track whose TrackDescriptor this writer
    /// already emitted; otherwise trace_processor has nothing to attach them to.
    #[error("track {track:#018x} was not created by this trace writer")]
    UnknownTrack { track: TrackUuid },
    /// NaN/inf would be stored as-is and break the UI's counter scaling.
    #[error("counter value {value} for track {track:#018x} is not finite")]
    NonFiniteValue { track: TrackUuid, value: f64 },
}
