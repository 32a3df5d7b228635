//! What a heapprofd session's consumer route is given and gives back,
//! shared by the runner that picks the route (`runner.rs`) and the two
//! routes (`client.rs`, `in_process.rs`): the route choice, the runner's
//! settings and a session's limits, the errors, how a session ended, and
//! the trace file a route fills.

use std::{
    path::{Path, PathBuf},
    str::FromStr,
    time::Duration,
};

use nix::sys::signal::Signal;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::{
    config::{ConfigError, HeapProfileRequest, RequestLimits},
    outcome::OutcomeError,
    ratelimit::RateLimitError,
};

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
