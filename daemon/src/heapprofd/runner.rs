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
    str::FromStr,
    sync::{
        atomic::{AtomicBool, Ordering},
        Mutex,
    },
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use nix::{sys::signal::Signal, unistd::getuid};
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::perfetto::protos::TraceConfig;

use super::{
    config::{encode, ConfigError, HeapProfileRequest, RequestLimits},
    outcome::{read_outcome, write_metadata, OutcomeError, TraceOutcome},
    ratelimit::{RateLimitError, RateLimiter},
};

/// Android's system uid: the only non-statsd consumer traced trusts.
pub const AID_SYSTEM: u32 = 1000;

pub const DEFAULT_PERFETTO_BIN: &str = "/system/bin/perfetto";

pub(super) const POLL: Duration = Duration::from_millis(20);

/// Who is traced's consumer for a heapprofd session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConsumerRoute {
    /// Exec `perfetto --config - --out -` (the default: it works in every
    /// build, AOSP's own guidance for system-wide sessions on Android, a
    /// hung client can be killed, and it reports traced's reason for a
    /// refused session).
    #[default]
    PerfettoClient,
    /// The daemon itself, through the Perfetto SDK (`producer` feature):
    /// no exec, no /system/bin/perfetto, no perfetto domain transition.
    InProcess,
}

impl ConsumerRoute {
    pub const NAMES: [&'static str; 2] = ["perfetto_client", "in_process"];

    pub fn name(self) -> &'static str {
        match self {
            ConsumerRoute::PerfettoClient => Self::NAMES[0],
            ConsumerRoute::InProcess => Self::NAMES[1],
        }
    }

    /// Whether this build can run the route: the in-process consumer is
    /// the Perfetto SDK, which only the `producer` feature links.
    pub fn available(self) -> Result<(), String> {
        match self {
            ConsumerRoute::InProcess if !cfg!(feature = "producer") => Err(
                "in_process needs the Perfetto SDK, which this vitalsd was built without \
                 (cargo feature `producer`); use perfetto_client"
                    .into(),
            ),
            _ => Ok(()),
        }
    }
}

impl FromStr for ConsumerRoute {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.replace('-', "_").as_str() {
            "perfetto_client" => Ok(ConsumerRoute::PerfettoClient),
            "in_process" => Ok(ConsumerRoute::InProcess),
            _ => Err(format!("{s:?} is not one of {:?}", Self::NAMES)),
        }
    }
}

#[derive(Debug, Clone)]
pub struct RunnerConfig {
    pub consumer: ConsumerRoute,
    /// The client of the perfetto_client route.
    pub perfetto_bin: PathBuf,
    pub limits: RequestLimits,
    /// Time allowed beyond duration_ms (plus flush_timeout_ms) before the
    /// client counts as hung and gets SIGTERM, or the in-process session
    /// is abandoned.
    pub timeout_slack: Duration,
    /// After SIGTERM, how long the client gets to flush before SIGKILL.
    pub term_grace: Duration,
}

impl Default for RunnerConfig {
    fn default() -> Self {
        Self {
            consumer: ConsumerRoute::default(),
            perfetto_bin: PathBuf::from(DEFAULT_PERFETTO_BIN),
            limits: RequestLimits::default(),
            timeout_slack: Duration::from_secs(10),
            term_grace: Duration::from_secs(30),
        }
    }
}

impl RunnerConfig {
    /// The deadline of a session: its duration, the flush traced may wait
    /// for, and slack for start-up.
    pub fn timeout_for(&self, request: &HeapProfileRequest) -> Duration {
        self.deadline(
            u64::from(request.duration_ms),
            u64::from(request.flush_timeout_ms),
        )
    }

    /// The deadline of a session of `duration_ms` whose end traced may
    /// flush for `flush_timeout_ms`.
    pub fn deadline(&self, duration_ms: u64, flush_timeout_ms: u64) -> Duration {
        Duration::from_millis(duration_ms + flush_timeout_ms) + self.timeout_slack
    }
}

/// One Perfetto session as a consumer route runs it, whatever it is for
/// (a heap profile, a capture): what to call it in logs, how long traced
/// runs it (its TraceConfig's duration_ms) and when the route gives up.
#[derive(Debug, Clone, Copy)]
pub struct SessionLimits {
    pub what: &'static str,
    pub duration_ms: u64,
    pub timeout: Duration,
}

#[derive(Debug, Error)]
pub enum RunError {
    #[error("invalid heap profile request")]
    Config(#[from] ConfigError),
    #[error("a heap profile session is already running")]
    Busy,
    #[error(transparent)]
    RateLimited(#[from] RateLimitError),
    #[error("creating the heapprofd trace {path}: {source}")]
    Output {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("spawning {path}: {source}")]
    Spawn {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("writing the TraceConfig to {path}'s stdin: {source}")]
    Stdin {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("waiting for {path}: {source}")]
    Wait {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("kill({pid}, {signal}): {source}")]
    Signal {
        pid: i32,
        signal: Signal,
        #[source]
        source: nix::Error,
    },
    #[error("writing the heapprofd trace {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("perfetto SDK {call}: {message}")]
    Sdk { call: &'static str, message: String },
    #[error("heapprofd.consumer = {route}: {message}")]
    Unavailable {
        route: &'static str,
        message: String,
    },
    #[error(transparent)]
    Metadata(#[from] OutcomeError),
}

/// How the session ended (the client process, or the in-process consumer).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum SessionStatus {
    /// Exit status 0 within the deadline, with a trace.
    Completed,
    /// traced refused the session: the real client then logs "Service
    /// error: <why>" (a unique_session_name in use, a config traced
    /// rejects) and exits 0 without writing a trace.
    Refused { reason: String },
    /// traced's consumer socket did not answer: the tracing service is not
    /// running (or the socket is not ours to use). `stderr_tail`: the
    /// client's stderr, or the in-process consumer's connect() error.
    TracedUnreachable { stderr_tail: String },
    /// Non-zero exit or killed by a signal we did not send.
    Failed {
        exit_code: Option<i32>,
        signal: Option<i32>,
        stderr_tail: String,
    },
    /// Past the deadline: SIGTERM sent; `killed` if SIGKILL was needed.
    TimedOut { killed: bool },
    /// Cancelled by the caller: SIGTERM sent; `killed` if SIGKILL was needed.
    Cancelled { killed: bool },
    /// In-process: an SDK call (`stage`: start, stop or read) had not
    /// returned by the deadline. The SDK cannot be interrupted, so its
    /// thread was abandoned and whatever it read discarded.
    Unanswered { stage: String },
}

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

impl SessionStatus {
    /// Why the session produced no profile at the consumer level, in
    /// words; None when it completed.
    pub fn problem(&self) -> Option<String> {
        match self {
            SessionStatus::Completed => None,
            SessionStatus::Refused { reason } => {
                Some(format!("traced refused the session: {reason}"))
            }
            SessionStatus::TracedUnreachable { stderr_tail } => Some(format!(
                "traced is not running: its consumer socket did not answer ({})",
                last_line(stderr_tail)
            )),
            SessionStatus::Failed {
                exit_code,
                signal,
                stderr_tail,
            } => Some(match (exit_code, signal) {
                (Some(c), _) => format!(
                    "the perfetto client exited with {c}: {}",
                    last_line(stderr_tail)
                ),
                (None, s) => format!("the perfetto client was killed by signal {s:?}"),
            }),
            SessionStatus::TimedOut { killed } => Some(format!(
                "the perfetto client passed its deadline and was stopped{}",
                if *killed { " with SIGKILL" } else { "" }
            )),
            SessionStatus::Cancelled { .. } => Some("the session was cancelled".into()),
            SessionStatus::Unanswered { stage } => Some(format!(
                "timed out: traced did not answer the in-process consumer's {stage} by the \
                 deadline; the session was abandoned and nothing kept"
            )),
        }
    }
}

/// The last non-empty line of a client's stderr, without perfetto's
/// "[time] file.cc:line " log prefix.
fn last_line(stderr: &str) -> String {
    let line = stderr
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("no message")
        .trim();
    match line
        .find(".cc:")
        .and_then(|i| line[i..].find(' ').map(|j| i + j))
    {
        Some(end) if line.starts_with('[') => line[end..].trim().to_owned(),
        _ => line.to_owned(),
    }
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

/// How a route's session ended. `wrote`: `out` holds the complete trace
/// read back from traced; otherwise the route removed it.
pub(crate) struct RouteEnd {
    pub status: SessionStatus,
    pub wrote: bool,
    /// The outcome_error when nothing was written.
    pub no_trace: &'static str,
}

/// The trace file a route fills: created (or emptied) 0640, write-only and
/// not O_APPEND, since on Android the perfetto domain is allowed `write` on
/// it and nothing else.
pub(super) fn create_trace_file(out: &Path) -> Result<std::fs::File, RunError> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o640)
        .open(out)
        .map_err(|source| RunError::Output {
            path: out.to_owned(),
            source,
        })
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
