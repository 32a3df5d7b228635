//! The exec'd-client route: one heapprofd session run by the `perfetto`
//! command-line client.
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
    path::Path,
    process::{Child, Command, ExitStatus, Stdio},
    sync::atomic::{AtomicBool, Ordering},
    thread,
    time::Instant,
};

use nix::{
    sys::signal::{kill, Signal},
    unistd::Pid,
};

use super::route::{
    create_trace_file, RouteEnd, RunError, RunnerConfig, SessionLimits, SessionStatus, POLL,
};

/// Runs the client to its end (or the deadline, or `cancel`); `charge` is
/// called once it runs. A trace is left in `out` only when the client
/// wrote one.
pub(super) fn run(
    config: &RunnerConfig,
    limits: &SessionLimits,
    bytes: &[u8],
    out: &Path,
    cancel: &AtomicBool,
    charge: &mut dyn FnMut(),
) -> Result<RouteEnd, RunError> {
    let bin = &config.perfetto_bin;
    let mut child = spawn(config, out)?;
    log::info!(
        "{} session started: {} pid {} for {} ms",
        limits.what,
        bin.display(),
        child.id(),
        limits.duration_ms
    );
    charge();

    let stderr = drain(child.stderr.take());
    if let Some(mut stdin) = child.stdin.take() {
        // Dropping stdin afterwards is the client's end-of-config.
        if let Err(source) = stdin.write_all(bytes) {
            // The client may have exited already (bad binary, traced
            // unreachable): its exit status says more than EPIPE does.
            log::warn!("writing the TraceConfig to {}: {source}", bin.display());
        }
    }

    let ended = wait(config, &mut child, limits, cancel)?;
    let stderr_tail = stderr.join().unwrap_or_default();
    // We created the file before the client ran; one that wrote nothing
    // (failed, refused, or killed before its read-back) left no trace.
    let wrote = std::fs::metadata(out).is_ok_and(|m| m.len() > 0);
    if !wrote {
        let _ = std::fs::remove_file(out);
    }
    Ok(RouteEnd {
        status: session_status(bin, ended, stderr_tail, wrote, limits.what),
        wrote,
        no_trace: "the perfetto client wrote no trace",
    })
}

/// Reads a pipe to the end on a thread so a chatty client never blocks on a
/// full pipe; keeps the last 4 KiB.
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

/// Starts `perfetto --config - --out -`: the config on a stdin pipe,
/// stdout the trace file `out`, stderr a pipe.
fn spawn(config: &RunnerConfig, out: &Path) -> Result<Child, RunError> {
    let bin = &config.perfetto_bin;
    let trace = create_trace_file(out)?;
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
    config: &RunnerConfig,
    child: &mut Child,
    limits: &SessionLimits,
    cancel: &AtomicBool,
) -> Result<Ended, RunError> {
    let wait_err = |source| RunError::Wait {
        path: config.perfetto_bin.clone(),
        source,
    };
    let deadline = Instant::now() + limits.timeout;
    loop {
        if let Some(s) = child.try_wait().map_err(wait_err)? {
            return Ok(Ended::Exited(s));
        }
        let cancelled = cancel.load(Ordering::SeqCst);
        if cancelled || Instant::now() >= deadline {
            if cancelled {
                log::info!("{} session cancelled: stopping the client", limits.what);
            } else {
                log::warn!(
                    "{} session past its deadline: stopping the client",
                    limits.what
                );
            }
            let killed = terminate(config, child)?;
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
fn terminate(config: &RunnerConfig, child: &mut Child) -> Result<bool, RunError> {
    let pid = child.id() as i32;
    let signal = |sig| {
        kill(Pid::from_raw(pid), sig).map_err(|source| RunError::Signal {
            pid,
            signal: sig,
            source,
        })
    };
    let wait_err = |source| RunError::Wait {
        path: config.perfetto_bin.clone(),
        source,
    };
    // The client may have exited between try_wait and kill; ESRCH cannot
    // happen for an unreaped child, so any error is real.
    signal(Signal::SIGTERM)?;
    let grace_end = Instant::now() + config.term_grace;
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

/// What the real client prints when traced's consumer socket does not
/// answer (perfetto_cmd.cc), and before the reason traced gives for
/// refusing a session. The exec'd client has no other channel for these;
/// on Android it may log to logcat only, so the exit status and the
/// missing trace decide, and the text only refines the status.
const UNREACHABLE_MARK: &str = "Could not connect to the traced socket";
const SERVICE_ERROR_MARK: &str = "Service error: ";

/// How the client ended, as stored; a failed exit is logged with its
/// stderr. `wrote`: the client left a non-empty trace.
fn session_status(
    bin: &Path,
    ended: Ended,
    stderr_tail: String,
    wrote: bool,
    what: &str,
) -> SessionStatus {
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
            log::warn!("traced refused the {what} session: {reason}");
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
