//! The Perfetto recording backend: a session of traced's own data sources
//! ([`super::run`]), the one a /proc-only daemon has. A heap profile can
//! join its session, and rules' ring preludes (`super::ring`, kept running
//! by `service/rings.rs`) run on it.

use std::time::Duration;

use super::{run, CaptureRequest, PerfettoCaptureError, PerfettoCaptureSummary};
use crate::recording_backend::{
    Daemon, Prepared, Recorded, RecordingBackend, RecordingFailed, Target, Window,
};

pub const NAME: &str = "perfetto";

pub struct PerfettoBackend;

impl RecordingBackend for PerfettoBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn available(&self, _has_bpf: bool) -> bool {
        true
    }

    fn heap_in_session(&self) -> bool {
        true
    }

    fn ring_prelude(&self) -> bool {
        true
    }

    fn prepare(&self, daemon: Daemon<'_>, window: Window, target: &Target) -> Prepared {
        // As heapprofd's sessions: the perfetto client writes the trace
        // into heapprofd/, the one directory its domain may write on
        // Android (sepolicy: vitalsd_heapprofd_data_file); it moves into
        // the store when the session ends.
        let dir = &target.session_dir;
        if let Err(e) = std::fs::create_dir_all(dir) {
            log::error!("creating {}: {e}", dir.display());
        }
        let out = dir.join(format!("{}.pftrace", target.id));
        let req = capture_request(window);
        let runner = daemon.runner.clone();
        let session_out = out.clone();
        Prepared {
            run: Box::new(move |stop| {
                let s = run(&runner, &req, &out, stop).map_err(failed)?;
                Ok(recorded(s))
            }),
            ticks: None,
            session_out: Some(session_out),
        }
    }
}

/// What a Perfetto-backend recording of `window` asks traced for.
pub fn capture_request(window: Window) -> CaptureRequest {
    CaptureRequest {
        duration: window.duration,
        events: window.events,
        max_bytes: window.max_bytes,
        vitals_data_source: window.vitals_data_source,
        poll: window.interval.min(Duration::from_secs(1)),
        heap: window.heap,
    }
}

/// A finished Perfetto session as a recording.
pub fn recorded(s: PerfettoCaptureSummary) -> Recorded {
    Recorded {
        wall_ms: s.wall_ms,
        cut_at_bytes: s.cut_at_max_bytes.then_some(s.bytes),
        notes: s.notes,
        heapprofd: s.heapprofd,
    }
}

/// A session leaves a complete trace or none: nothing partial to keep.
pub fn failed(e: PerfettoCaptureError) -> RecordingFailed {
    RecordingFailed {
        error: Box::new(e),
        keeps_partial: false,
    }
}
