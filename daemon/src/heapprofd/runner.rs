//! Runs one heapprofd session through the `perfetto` command-line client.
//!
//! `perfetto --config - --out -` reads a binary TraceConfig from stdin,
//! starts the session with traced and, when it ends, reads the buffers back
//! over the consumer socket and writes the trace to its stdout, which is the
//! file we opened. On Android the `perfetto` domain may not open, create or
//! search other domains' data files, only write to one it is handed
//! (system/sepolicy private/perfetto.te neverallows), so we open the file,
//! and the session keeps its data in traced (no write_into_file), so traced
//! never touches it. The child inherits our uid: traced marks the session
//! TRUSTED_SYSTEM only when that uid is 1000 (system), so on Android
//! vitalsd runs as `user system`.
//!
//! On SIGTERM (or SIGINT) the client asks traced to stop the session, waits
//! for the flush and writes the trace, so cancellation and timeouts send
//! SIGTERM first and SIGKILL only if the client ignores it.

use std::{
    io::{Read, Write},
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    sync::{
        atomic::{AtomicBool, Ordering},
        Mutex,
    },
    thread,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use nix::{
    sys::signal::{kill, Signal},
    unistd::{getuid, Pid},
};
use serde::Serialize;
use thiserror::Error;

use super::{
    config::{encode, ConfigError, HeapProfileRequest, RequestLimits},
    outcome::{read_outcome, write_metadata, OutcomeError, TraceOutcome},
    ratelimit::{RateLimitError, RateLimiter},
};

/// Android's system uid: the only non-statsd consumer traced trusts.
pub const AID_SYSTEM: u32 = 1000;

pub const DEFAULT_PERFETTO_BIN: &str = "/system/bin/perfetto";

const POLL: Duration = Duration::from_millis(20);

#[derive(Debug, Clone)]
pub struct RunnerConfig {
    pub perfetto_bin: PathBuf,
    pub limits: RequestLimits,
    /// Time allowed beyond duration_ms (plus flush_timeout_ms) before the
    /// client counts as hung and gets SIGTERM.
    pub timeout_slack: Duration,
    /// After SIGTERM, how long the client gets to flush before SIGKILL.
    pub term_grace: Duration,
}

impl Default for RunnerConfig {
    fn default() -> Self {
        Self {
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
        Duration::from_millis(u64::from(request.duration_ms) + u64::from(request.flush_timeout_ms))
            + self.timeout_slack
    }
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
    #[error(transparent)]
    Metadata(#[from] OutcomeError),
}

/// How the client process ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum SessionStatus {
    /// Exit status 0 within the deadline, with a trace.
    Completed,
    /// traced refused the session: the real client then logs "Service
    /// error: <why>" (a unique_session_name in use, a config traced
    /// rejects) and exits 0 without writing a trace.
    Refused { reason: String },
    /// The client could not reach traced's consumer socket: the tracing
    /// service is not running (or the socket is not ours to use).
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
}

/// What is stored with the capture.
#[derive(Debug, Clone, Serialize)]
pub struct SessionReport {
    pub request: HeapProfileRequest,
    /// The exact TraceConfig sent, binary proto, hex-encoded.
    pub trace_config_hex: String,
    pub perfetto_bin: PathBuf,
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
    /// Why the session produced no profile at the client level, in words;
    /// None when the client completed.
    pub fn problem(&self) -> Option<String> {
        match self {
            SessionStatus::Completed => None,
            SessionStatus::Refused { reason } => {
                Some(format!("traced refused the session: {reason}"))
            }
            SessionStatus::TracedUnreachable { stderr_tail } => Some(format!(
                "traced is not running: the perfetto client could not connect to it ({})",
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

/// Reads a pipe to the end on a thread so a chatty client never blocks on a
/// full pipe; keeps the last 4 KiB.
/// The trace file the client writes as its stdout: created (or emptied)
/// 0640, write-only and not O_APPEND, since on Android the perfetto domain
/// is allowed `write` on it and nothing else.
fn create_trace_file(out: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o640)
        .open(out)
}

fn drain<R: Read + Send + 'static>(r: Option<R>) -> thread::JoinHandle<String> {
    thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(mut r) = r {
            let _ = r.read_to_end(&mut buf);
        }
        let start = buf.len().saturating_sub(4096);
        String::from_utf8_lossy(&buf[start..]).into_owned()
    })
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

    /// Validates `request`, checks limits, runs the client until it exits,
    /// the deadline passes or `cancel` is set, reads heapprofd's outcome from
    /// `out` and writes `<out>.meta.json`.
    pub fn run(
        &self,
        request: &HeapProfileRequest,
        out: &Path,
        cancel: &AtomicBool,
    ) -> Result<SessionReport, RunError> {
        let trace_config = request.trace_config(&self.config.limits)?;
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
        // Only one session runs at a time, so checking now and charging after
        // the spawn cannot race; a client that fails to spawn costs nothing.
        self.limiter
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .check(&targets, started)?;

        let uid = log_client_uid();
        let bin = &self.config.perfetto_bin;
        let bytes = encode(&trace_config);
        let mut child = self.spawn(out)?;
        log::info!(
            "heapprofd session started: {} pid {} targets {targets:?} for {} ms",
            bin.display(),
            child.id(),
            request.duration_ms
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

        let stderr = drain(child.stderr.take());
        if let Some(mut stdin) = child.stdin.take() {
            // Dropping stdin afterwards is the client's end-of-config.
            if let Err(source) = stdin.write_all(&bytes) {
                // The client may have exited already (bad binary, traced
                // unreachable): its exit status says more than EPIPE does.
                log::warn!("writing the TraceConfig to {}: {source}", bin.display());
            }
        }

        let ended = self.wait(&mut child, request, cancel)?;
        let ended_at = SystemTime::now();
        let stderr_tail = stderr.join().unwrap_or_default();
        // We created the file before the client ran; one that wrote nothing
        // (failed, refused, or killed before its read-back) left no trace.
        let wrote = std::fs::metadata(out).is_ok_and(|m| m.len() > 0);
        if !wrote {
            let _ = std::fs::remove_file(out);
        }
        let status = session_status(bin, ended, stderr_tail, wrote);

        let (outcome, outcome_error) = if !wrote {
            (None, Some("the perfetto client wrote no trace".to_owned()))
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
            perfetto_bin: bin.clone(),
            out: out.to_owned(),
            uid,
            started_unix_ms: unix_ms(started),
            ended_unix_ms: unix_ms(ended_at),
            status,
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

    /// Starts `perfetto --config - --out -`: the config on a stdin pipe,
    /// stdout the trace file `out`, stderr a pipe.
    fn spawn(&self, out: &Path) -> Result<Child, RunError> {
        let bin = &self.config.perfetto_bin;
        let trace = create_trace_file(out).map_err(|source| RunError::Output {
            path: out.to_owned(),
            source,
        })?;
        Command::new(bin)
            .arg("--config")
            .arg("-")
            .arg("--out")
            .arg("-")
            .stdin(Stdio::piped())
            .stdout(Stdio::from(trace))
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| RunError::Spawn {
                path: bin.clone(),
                source,
            })
    }

    fn wait(
        &self,
        child: &mut Child,
        request: &HeapProfileRequest,
        cancel: &AtomicBool,
    ) -> Result<Ended, RunError> {
        let wait_err = |source| RunError::Wait {
            path: self.config.perfetto_bin.clone(),
            source,
        };
        let deadline = Instant::now() + self.config.timeout_for(request);
        loop {
            if let Some(s) = child.try_wait().map_err(wait_err)? {
                return Ok(Ended::Exited(s));
            }
            let cancelled = cancel.load(Ordering::SeqCst);
            if cancelled || Instant::now() >= deadline {
                if cancelled {
                    log::info!("heapprofd session cancelled: stopping the client");
                } else {
                    log::warn!("heapprofd session past its deadline: stopping the client");
                }
                let killed = self.terminate(child)?;
                return Ok(if cancelled {
                    Ended::Cancelled { killed }
                } else {
                    Ended::TimedOut { killed }
                });
            }
            thread::sleep(POLL);
        }
    }

    /// SIGTERM, then SIGKILL after the grace period. Returns whether SIGKILL
    /// was needed.
    fn terminate(&self, child: &mut Child) -> Result<bool, RunError> {
        let pid = child.id() as i32;
        let signal = |sig| {
            kill(Pid::from_raw(pid), sig).map_err(|source| RunError::Signal {
                pid,
                signal: sig,
                source,
            })
        };
        let wait_err = |source| RunError::Wait {
            path: self.config.perfetto_bin.clone(),
            source,
        };
        // The client may have exited between try_wait and kill; ESRCH cannot
        // happen for an unreaped child, so any error is real.
        signal(Signal::SIGTERM)?;
        let grace_end = Instant::now() + self.config.term_grace;
        while Instant::now() < grace_end {
            if child.try_wait().map_err(wait_err)?.is_some() {
                return Ok(false);
            }
            thread::sleep(POLL);
        }
        log::warn!("perfetto client {pid} ignored SIGTERM; sending SIGKILL");
        signal(Signal::SIGKILL)?;
        child.wait().map_err(wait_err)?;
        Ok(true)
    }
}

/// Our uid, which the client inherits; warns on Android when it is not
/// system, because traced then does not trust the session.
fn log_client_uid() -> u32 {
    let uid = getuid().as_raw();
    if cfg!(target_os = "android") && uid != AID_SYSTEM {
        log::warn!(
            "running the perfetto client as uid {uid}, not {AID_SYSTEM} (system): traced will \
             not mark this heapprofd session TRUSTED_SYSTEM"
        );
    } else {
        log::info!("running the perfetto client as uid {uid}");
    }
    uid
}

/// What the real client prints when traced's consumer socket does not
/// answer (perfetto_cmd.cc), and before the reason traced gives for
/// refusing a session. The exec'd client has no other channel for these;
/// on Android it may log to logcat only, so the exit status and the
/// missing trace decide, and the text only refines the status.
const UNREACHABLE_MARK: &str = "Could not connect to the traced socket";
const SERVICE_ERROR_MARK: &str = "Service error: ";

/// How the client ended, as stored; a failed exit is logged with its
/// stderr. `wrote`: the client left a non-empty trace.
fn session_status(bin: &Path, ended: Ended, stderr_tail: String, wrote: bool) -> SessionStatus {
    match ended {
        Ended::Exited(s) if s.success() && wrote => SessionStatus::Completed,
        Ended::Exited(s) if s.success() => {
            let reason = stderr_tail
                .lines()
                .rev()
                .find_map(|l| l.split_once(SERVICE_ERROR_MARK).map(|(_, r)| r.trim()))
                .unwrap_or(
                    "the client exited 0 without a trace (on Android see logcat, tag perfetto)",
                )
                .to_owned();
            log::warn!("traced refused the heapprofd session: {reason}");
            SessionStatus::Refused { reason }
        }
        Ended::Exited(_) if stderr_tail.contains(UNREACHABLE_MARK) => {
            log::warn!(
                "{} could not reach traced: {}",
                bin.display(),
                stderr_tail.trim_end()
            );
            SessionStatus::TracedUnreachable { stderr_tail }
        }
        Ended::Exited(s) => {
            use std::os::unix::process::ExitStatusExt;
            log::warn!(
                "{} exited with {s}: {}",
                bin.display(),
                stderr_tail.trim_end()
            );
            SessionStatus::Failed {
                exit_code: s.code(),
                signal: s.signal(),
                stderr_tail,
            }
        }
        Ended::TimedOut { killed } => SessionStatus::TimedOut { killed },
        Ended::Cancelled { killed } => SessionStatus::Cancelled { killed },
    }
}

enum Ended {
    Exited(ExitStatus),
    TimedOut { killed: bool },
    Cancelled { killed: bool },
}
