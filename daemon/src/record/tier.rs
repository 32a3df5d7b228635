//! The programs a recording's capture runs in (none: /proc-only) and the
//! capture.

use std::io::Write;

use super::RecordError;
use crate::{
    bpf::denied::ProcOnly,
    events::{EventOptions, EventRecorder, EventStats, EventsError},
    perfetto::TraceWriter,
    sources::ebpf::Programs,
};

/// The programs a recording's capture runs in, and the capture. A
/// capture that `finish` did not stop (an error cut the recording short)
/// is aborted on drop: the programs may be the daemon's, which live on,
/// so their capture flag must not stay set nor their ring buffer be lost.
/// The programs' counters are read by the pipeline's eBPF room.
pub(super) struct Tier {
    capture: Option<EventRecorder>,
    /// None: /proc-only, so no capture either.
    accounting: Option<Programs>,
}

impl Tier {
    /// Starts the capture `opts` asks for on `accounting`; asking for one
    /// /proc-only (`accounting` Err) is `CaptureNeedsBpf`.
    pub(super) fn start(
        accounting: Result<Programs, ProcOnly>,
        opts: &EventOptions,
        proc_root: &std::path::Path,
    ) -> Result<Self, RecordError> {
        let accounting = match accounting {
            Ok(acc) => acc,
            Err(_) if !opts.any() => {
                return Ok(Self {
                    capture: None,
                    accounting: None,
                })
            }
            Err(why) => return Err(RecordError::CaptureNeedsBpf(why)),
        };
        let capture = if opts.any() {
            Some(accounting.with(|acc| EventRecorder::start(acc, opts, proc_root))?)
        } else {
            None
        };
        Ok(Self {
            capture,
            accounting: Some(accounting),
        })
    }

    /// Writes the capture's records since the last flush.
    pub(super) fn flush<W: Write>(
        &mut self,
        writer: &mut TraceWriter<W>,
        ts_boot_ns: u64,
    ) -> Result<(), EventsError> {
        match (self.capture.as_mut(), self.accounting.as_ref()) {
            (Some(c), Some(r)) => r.with(|acc| c.flush(acc, writer, ts_boot_ns)),
            _ => Ok(()),
        }
    }

    /// Processes first seen this tick join the off-CPU watch when it
    /// follows their name (`capture.offcpu_watch`).
    pub(super) fn follow_new_processes(
        &mut self,
        new: &[crate::process_tracks::ProcessIdentity],
    ) -> Result<(), EventsError> {
        match (self.capture.as_mut(), self.accounting.as_ref()) {
            (Some(c), Some(r)) if !new.is_empty() => {
                r.with(|acc| c.follow_new_processes(acc, new.iter().map(|p| (p.pid, p.name()))))
            }
            _ => Ok(()),
        }
    }

    /// Stops the capture (draining and writing what is left); None
    /// without one.
    pub(super) fn stop<W: Write>(
        &mut self,
        writer: &mut TraceWriter<W>,
        ts_boot_ns: u64,
    ) -> Result<Option<EventStats>, EventsError> {
        match (self.capture.take(), self.accounting.as_ref()) {
            (Some(c), Some(r)) => r.with(|acc| c.stop(acc, writer, ts_boot_ns)).map(Some),
            _ => Ok(None),
        }
    }
}

impl Drop for Tier {
    fn drop(&mut self) {
        if let (Some(c), Some(r)) = (self.capture.take(), self.accounting.as_ref()) {
            r.with(|acc| c.abort(acc));
        }
    }
}
