//! The accounting a recording reads (none: /proc-only) and the capture it
//! runs there.

use std::io::Write;

use super::RecordError;
use crate::{
    bpf::{denied::ProcOnly, AccountingReader, BpfError, BpfSnapshot, FaultSource},
    capture::{Capture, CaptureError, CaptureOptions, CaptureStats},
    perfetto::TraceWriter,
};

/// The accounting a recording reads and the capture it runs there. A
/// capture that `finish` did not stop (an error cut the recording short)
/// is aborted on drop: the accounting may be the daemon's, which lives on,
/// so its capture flag must not stay set nor its ring buffer be lost.
pub(super) struct Tier {
    capture: Option<Capture>,
    /// None: /proc-only, so no capture either.
    accounting: Option<AccountingReader>,
}

impl Tier {
    /// Starts the capture `opts` asks for on `accounting`; asking for one
    /// /proc-only (`accounting` Err) is `CaptureNeedsBpf`.
    pub(super) fn start(
        accounting: Result<AccountingReader, ProcOnly>,
        opts: &CaptureOptions,
        proc_root: &std::path::Path,
    ) -> Result<Self, RecordError> {
        let accounting = match accounting {
            Ok(acc) => acc,
            Err(_) if !opts.events.any() => {
                return Ok(Self {
                    capture: None,
                    accounting: None,
                })
            }
            Err(why) => return Err(RecordError::CaptureNeedsBpf(why)),
        };
        let capture = if opts.events.any() {
            Some(accounting.with(|acc| Capture::start(acc, opts, proc_root))?)
        } else {
            None
        };
        Ok(Self {
            capture,
            accounting: Some(accounting),
        })
    }

    /// Whether the eBPF accounting is there (not /proc-only).
    pub(super) fn has_bpf(&self) -> bool {
        self.accounting.is_some()
    }

    /// The fault source and whether runqueue wait is accounted (none and
    /// no, /proc-only).
    pub(super) fn fault_source_and_runq_wait(&self) -> (FaultSource, bool) {
        self.accounting
            .as_ref()
            .map_or((FaultSource::None, false), |r| {
                r.with(|acc| (acc.fault_source(), acc.runq_wait()))
            })
    }

    /// The counters; None /proc-only.
    pub(super) fn read(&self) -> Result<Option<BpfSnapshot>, BpfError> {
        self.accounting
            .as_ref()
            .map(AccountingReader::read)
            .transpose()
    }

    /// Writes the capture's records since the last flush.
    pub(super) fn flush<W: Write>(
        &mut self,
        writer: &mut TraceWriter<W>,
        ts_boot_ns: u64,
    ) -> Result<(), CaptureError> {
        match (self.capture.as_mut(), self.accounting.as_ref()) {
            (Some(c), Some(r)) => r.with(|acc| c.flush(acc, writer, ts_boot_ns)),
            _ => Ok(()),
        }
    }

    /// Stops the capture (draining and writing what is left); None
    /// without one.
    pub(super) fn stop<W: Write>(
        &mut self,
        writer: &mut TraceWriter<W>,
        ts_boot_ns: u64,
    ) -> Result<Option<CaptureStats>, CaptureError> {
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
