//! Perfetto trace writer.
//!
//! vitalsd writes standard Perfetto traces (the `perfetto.protos.Trace`
//! format that trace_processor and ui.perfetto.dev open) straight to a file,
//! without traced. A trace file is a sequence of `Trace.packet` records (field
//! 1, length-delimited), so [`TraceWriter`] streams packets one at a time and
//! every whole-packet prefix of the file is itself a valid trace.
//!
//! What goes where (see docs/architecture.md, "Perfetto output"):
//! - ClockSnapshot + SystemInfo first, ProcessTree for names;
//! - native packets where Perfetto has them: SysStats.cpu_stat, SysStats.psi,
//!   ProcessStats (memory in kB, runtime in ns);
//! - TrackEvent counters on TrackDescriptor counter tracks for everything else
//!   (loadavg, per-process fault rates, CPU shares, ...);
//! - capture packets: per-CPU FtraceEventBundle/CompactSched
//!   ([`compact_sched`]), fault samples as interned callstacks
//!   ([`fault_samples`]); a capture's long blocks as slices on their
//!   thread's off-CPU track with a flow from the waker ([`offcpu_blocks`]);
//!   blind windows of the classic sched programs as slices on per-CPU
//!   tracks ([`blind_windows`]).

pub mod blind_windows;
pub mod compact_sched;
mod error;
pub mod fault_samples;
pub mod offcpu_blocks;
mod track_uuid;
mod types;
mod writer;

#[cfg(test)]
mod tests;

pub use error::PerfettoError;
pub use types::{
    CounterSpec, CounterUnit, CounterValue, CpuTimesNs, ProcessKey, ProcessStatsEntry,
    ProcessTreeEntry, PsiResource, SystemFacts, TrackUuid,
};
pub use writer::{TraceWriter, DEFAULT_SEQUENCE_ID};

/// The generated Perfetto protobuf types, for callers that build packets
/// themselves and hand them to [`TraceWriter::write_packet`].
pub use vitals_proto::protos;
