//! Runs one heapprofd session, one at a time, under persisted rate limits,
//! through one of two consumer routes (`heapprofd.consumer`):
//!
//! - [`ConsumerRoute::PerfettoClient`] (`client.rs`): exec the `perfetto`
//!   command-line client with the binary TraceConfig on stdin and the trace
//!   file we opened as its stdout;
//! - [`ConsumerRoute::InProcess`] (`in_process.rs`, `producer` feature):
//!   vitalsd itself is traced's consumer through the Perfetto SDK's system
//!   tracing session, and writes what it reads back into the same file.
//!
//! Either way traced sees a consumer with our uid, which must be 1000
//! (system) on Android for the session to be TRUSTED_SYSTEM. Both routes
//! end in the same place: a complete trace in the file we opened (or no
//! file), read by `outcome.rs` and described by `<trace>.meta.json`.

use std::{
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, Ordering},
        Mutex,
    },
    time::{SystemTime, UNIX_EPOCH},
};

use nix::unistd::getuid;
use serde::Serialize;

use crate::perfetto::protos::TraceConfig;

use super::{
    config::{encode, HeapProfileRequest},
    outcome::{read_outcome, write_metadata, TraceOutcome},
    ratelimit::RateLimiter,
    route::{ConsumerRoute, RouteEnd, RunError, RunnerConfig, SessionLimits, SessionStatus},
};

/// Android's system uid: the only non-statsd consumer traced trusts.
pub const AID_SYSTEM: u32 = 1000;

/// What is stored with the capture.
#[derive(Debug, Clone, Serialize)]
pub struct SessionReport {
    pub request: HeapProfileRequest,
    /// The exact TraceConfig sent, binary proto, hex-encoded.
    pub trace_config_hex: String,
    pub consumer: ConsumerRoute,
    /// The client that ran it (perfetto_client route only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub perfetto_bin: Option<PathBuf>,
    pub out: PathBuf,
    pub uid: u32,
    pub started_unix_ms: u64,
    pub ended_unix_ms: u64,
    pub status: SessionStatus,
    /// None when the client left no readable trace.
    pub outcome: Option<TraceOutcome>,
    pub outcome_error: Option<String>,
}

impl SessionReport {
    /// Completed and every target has a usable profile.
    pub fn success(&self) -> bool {
        self.status == SessionStatus::Completed
            && self
                .outcome
                .as_ref()
                .is_some_and(|o| o.all_targets_profiled() && o.processes.iter().all(|p| p.usable()))
    }
}

/// Runs sessions one at a time, under persisted rate limits.
pub struct SessionRunner {
    config: RunnerConfig,
    limiter: Mutex<RateLimiter>,
    active: AtomicBool,
}

struct ActiveGuard<'a>(&'a AtomicBool);

impl Drop for ActiveGuard<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl SessionRunner {
    pub fn new(config: RunnerConfig, limiter: RateLimiter) -> Self {
        Self {
            config,
            limiter: Mutex::new(limiter),
            active: AtomicBool::new(false),
        }
    }

    pub fn config(&self) -> &RunnerConfig {
        &self.config
    }

    pub fn is_busy(&self) -> bool {
        self.active.load(Ordering::SeqCst)
    }

    /// For a heap profile that runs inside another session (a Perfetto
    /// capture's): validates `request` and charges the rate limits now, as
    /// [`SessionRunner::run`] does once its session runs. Returns the
    /// TraceConfig the request becomes (its android.heapprofd data source
    /// is what the other session takes).
    pub fn admit(&self, request: &HeapProfileRequest) -> Result<TraceConfig, RunError> {
        let trace_config = request.trace_config(&self.config.limits)?;
        if self.is_busy() {
            return Err(RunError::Busy);
        }
        let targets = request.target_keys();
        let now = SystemTime::now();
        let mut limiter = self.limiter.lock().unwrap_or_else(|e| e.into_inner());
        limiter.check(&targets, now)?;
        if let Err(e) = limiter.record(&targets, now) {
            log::error!("{e}");
        }
        Ok(trace_config)
    }

    /// Validates `request`, checks limits, runs the session through the
    /// configured consumer route until it ends, the deadline passes or
    /// `cancel` is set, reads heapprofd's outcome from `out` and writes
    /// `<out>.meta.json`.
    pub fn run(
        &self,
        request: &HeapProfileRequest,
        out: &Path,
        cancel: &AtomicBool,
    ) -> Result<SessionReport, RunError> {
        let trace_config = request.trace_config(&self.config.limits)?;
        let route = self.config.consumer;
        route.available().map_err(|message| RunError::Unavailable {
            route: route.name(),
            message,
        })?;
        if self
            .active
            .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
        {
            return Err(RunError::Busy);
        }
        let _guard = ActiveGuard(&self.active);

        let targets = request.target_keys();
        let started = SystemTime::now();
        // Only one session runs at a time, so checking now and charging once
        // the route runs cannot race; a session that never ran costs nothing.
        self.limiter
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .check(&targets, started)?;
        let mut charge = || {
            log::info!(
                "heapprofd session for {targets:?} running ({})",
                route.name()
            );
            if let Err(e) = self
                .limiter
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .record(&targets, started)
            {
                // The session is running; a lost charge is better than an orphan.
                log::error!("{e}");
            }
        };

        let uid = log_consumer_uid(route);
        let bytes = encode(&trace_config);
        let limits = SessionLimits {
            what: "heapprofd",
            duration_ms: u64::from(request.duration_ms),
            timeout: self.config.timeout_for(request),
        };
        let end = run_route(&self.config, &limits, &bytes, out, cancel, &mut charge)?;
        let ended_at = SystemTime::now();
        let wrote = end.wrote;
        let (outcome, outcome_error) = if !wrote {
            (None, Some(end.no_trace.to_owned()))
        } else {
            match read_outcome(out, request) {
                Ok(o) => (Some(o), None),
                Err(e) => {
                    log::warn!("{e}");
                    (None, Some(e.to_string()))
                }
            }
        };
        let report = SessionReport {
            request: request.clone(),
            trace_config_hex: hex(&bytes),
            consumer: route,
            perfetto_bin: (route == ConsumerRoute::PerfettoClient)
                .then(|| self.config.perfetto_bin.clone()),
            out: out.to_owned(),
            uid,
            started_unix_ms: unix_ms(started),
            ended_unix_ms: unix_ms(ended_at),
            status: end.status,
            outcome,
            outcome_error,
        };
        // A sidecar describes a trace; with none, nothing is stored and the
        // report (returned, logged) is all there is.
        if wrote {
            write_metadata(out, &report)?;
        }
        Ok(report)
    }
}

/// Runs one Perfetto session with the encoded TraceConfig `bytes` through
/// `config.consumer` into `out`: the one place vitalsd talks to traced as
/// a consumer (heap profiles and Perfetto-backend captures). `charge` is
/// called once the session runs.
pub(crate) fn run_route(
    config: &RunnerConfig,
    limits: &SessionLimits,
    bytes: &[u8],
    out: &Path,
    cancel: &AtomicBool,
    charge: &mut dyn FnMut(),
) -> Result<RouteEnd, RunError> {
    let route = config.consumer;
    route.available().map_err(|message| RunError::Unavailable {
        route: route.name(),
        message,
    })?;
    match route {
        ConsumerRoute::PerfettoClient => {
            super::client::run(config, limits, bytes, out, cancel, charge)
        }
        #[cfg(feature = "producer")]
        ConsumerRoute::InProcess => {
            super::in_process::run(config, limits, bytes, out, cancel, charge)
        }
        #[cfg(not(feature = "producer"))]
        ConsumerRoute::InProcess => unreachable!("refused by ConsumerRoute::available"),
    }
}

/// Our uid, which traced sees as the consumer's (the client inherits it);
/// warns on Android when it is not system, because traced then does not
/// trust the session.
fn log_consumer_uid(route: ConsumerRoute) -> u32 {
    let uid = getuid().as_raw();
    if cfg!(target_os = "android") && uid != AID_SYSTEM {
        log::warn!(
            "heapprofd consumer ({}) runs as uid {uid}, not {AID_SYSTEM} (system): traced will \
             not mark this heapprofd session TRUSTED_SYSTEM",
            route.name()
        );
    } else {
        log::info!("heapprofd consumer ({}) runs as uid {uid}", route.name());
    }
    uid
}
