//! Captures through Perfetto's own data sources: the capture backend of the
//! tier without eBPF (accounting /proc-only) or with `capture.backend =
//! "perfetto"`.
//!
//! A capture is one Perfetto session vitalsd starts as traced's consumer,
//! through the same consumer route (and the same code, `heapprofd::runner::
//! run_route`) as heapprofd's sessions: the exec'd `perfetto` client or the
//! in-process SDK consumer (`heapprofd.consumer`). Its TraceConfig
//! ([`config`]) asks `linux.ftrace` for the sched events of the CPU
//! timeline (compact_sched), `linux.process_stats`, `linux.sys_stats` and
//! vitalsd's own `linux.vitals`, so one trace holds the timeline and our
//! counters. The byte cap is the buffer (DISCARD, `store.max_capture_bytes`
//! less traced's own packets); traced ends the session at its duration.
//!
//! A session that leaves no trace (traced not running, a session traced
//! refuses) or a trace no data source wrote to is an error carrying
//! traced's reason: the caller stores nothing. traced_perf, which fault
//! hotspots would need, is not used: faults are counters only (the
//! capture's notes say so).

pub mod backend;
pub mod config;
pub mod ring;
pub mod trace;

use std::{path::Path, sync::atomic::AtomicBool, time::Instant};

use thiserror::Error;

pub use config::{CaptureRequest, HeapInSession};

use crate::heapprofd::{
    config::encode,
    outcome::read_outcome,
    route::{RunError, RunnerConfig, SessionLimits},
    runner::run_route,
    ConsumerRoute, SessionStatus,
};

/// What the capture's metadata says about fault hotspots on this backend.
pub const FAULTS_NOTE: &str = "faults: counters only; fault hotspots (sampled fault stacks) need \
     traced_perf's linux.perf data source, which the perfetto capture backend does not use";

#[derive(Debug, Error)]
pub enum PerfettoCaptureError {
    #[error(transparent)]
    Run(#[from] RunError),
    /// traced did not run the session (not running, refused it, the client
    /// failed): its reason.
    #[error("perfetto session ({route}): {reason}")]
    Session { route: &'static str, reason: String },
    /// A trace with no data from any data source.
    #[error(
        "perfetto session ({route}): the trace holds no data from any data source ({packets} \
         packets of traced's own); are traced_probes and its data sources running?"
    )]
    Empty { route: &'static str, packets: u64 },
    #[error("reading the capture's trace {path}: {source}")]
    Read {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// A finished capture.
#[derive(Debug, Clone)]
pub struct PerfettoCaptureSummary {
    pub consumer: ConsumerRoute,
    pub bytes: u64,
    pub wall_ms: u64,
    /// The buffer filled up: traced dropped later data (chunks_discarded).
    pub cut_at_max_bytes: bool,
    /// The session was stopped early (the daemon is stopping).
    pub cancelled: bool,
    pub notes: Vec<String>,
    /// The heap profile's request and heapprofd's outcome, when the
    /// capture had one.
    pub heapprofd: Option<serde_json::Value>,
}

/// Runs the capture `req` through `runner.consumer` into `out` until
/// traced ends it (its duration) or `cancel` is set. Nothing is left in
/// `out` on error.
pub fn run(
    runner: &RunnerConfig,
    req: &CaptureRequest,
    out: &Path,
    cancel: &AtomicBool,
) -> Result<PerfettoCaptureSummary, PerfettoCaptureError> {
    let duration_ms = req.duration.as_millis() as u64;
    run_session(runner, req, &req.trace_config(), duration_ms, out, cancel)
}

/// [`run`] with the TraceConfig `config` (built from `req`), which traced
/// may run for up to `duration_ms` (a ring session: until its trigger
/// timeout and stop delay).
pub(crate) fn run_session(
    runner: &RunnerConfig,
    req: &CaptureRequest,
    config: &crate::perfetto::protos::TraceConfig,
    duration_ms: u64,
    out: &Path,
    cancel: &AtomicBool,
) -> Result<PerfettoCaptureSummary, PerfettoCaptureError> {
    let route = runner.consumer;
    let bytes = encode(config);
    let limits = SessionLimits {
        what: "capture",
        duration_ms,
        timeout: runner.deadline(duration_ms, u64::from(req.flush_timeout_ms())),
    };
    let started = Instant::now();
    let end = run_route(runner, &limits, &bytes, out, cancel, &mut || {})?;
    let wall_ms = started.elapsed().as_millis() as u64;
    let cancelled = matches!(end.status, SessionStatus::Cancelled { .. });
    let discard = || {
        let _ = std::fs::remove_file(out);
    };
    // A cancelled client was asked to stop and still wrote its read-back;
    // every other status without Completed left nothing usable.
    if !(end.wrote && (end.status == SessionStatus::Completed || cancelled)) {
        discard();
        let reason = end.status.problem().unwrap_or_else(|| end.no_trace.into());
        return Err(PerfettoCaptureError::Session {
            route: route.name(),
            reason,
        });
    }
    let contents = trace::read(out).map_err(|source| {
        discard();
        PerfettoCaptureError::Read {
            path: out.to_owned(),
            source,
        }
    })?;
    if contents.data_packets == 0 {
        discard();
        return Err(PerfettoCaptureError::Empty {
            route: route.name(),
            packets: contents.packets,
        });
    }
    let size = std::fs::metadata(out).map(|m| m.len()).unwrap_or(0);
    // heapprofd's verdict per process, as a heap profile's own session
    // stores it; a trace it cannot be read from is still the capture.
    let heapprofd = req
        .heap
        .as_ref()
        .map(|h| match read_outcome(out, &h.request) {
            Ok(o) => serde_json::json!({ "request": h.request, "outcome": o }),
            Err(e) => {
                log::warn!("heapprofd outcome of the capture: {e}");
                serde_json::json!({ "request": h.request, "outcome_error": e.to_string() })
            }
        });
    let mut notes = vec![format!("consumer: {}", route.name())];
    if req.events.faults {
        notes.push(FAULTS_NOTE.into());
    }
    if !contents.has_stats {
        notes.push("traced wrote no TraceStats: whether the buffer filled up is unknown".into());
    }
    Ok(PerfettoCaptureSummary {
        consumer: route,
        bytes: size,
        wall_ms,
        cut_at_max_bytes: contents.chunks_discarded > 0,
        cancelled,
        notes,
        heapprofd,
    })
}
