//! The in-process route: vitalsd itself is traced's consumer for a
//! heapprofd session, through the Perfetto SDK's system tracing session
//! (setup with our TraceConfig bytes, start, stop, read back), and writes
//! what it reads into the trace file it opened, as the client route's
//! `perfetto --out -` does. traced sees our own uid as the consumer's, so
//! on Android (`user system`) the session is TRUSTED_SYSTEM with no exec
//! and no perfetto domain.
//!
//! What the SDK (perfetto-sdk 1.2.1 / perfetto-sdk-sys 1.4.0) does when
//! traced is away, read from its TracingMuxerImpl:
//! - not running: the consumer connection fails at once, and start, stop
//!   and read return (read with no data); the SDK says nothing else, so
//!   we connect() to the consumer socket first and name the error;
//! - refuses the session (a unique_session_name in use): start returns,
//!   read returns no data; the C API does not pass traced's reason on,
//!   so a C++ shim (cc/perfetto_session_error.cc) sets the C++ API's
//!   error callback on the same session, and the report gives traced's
//!   own words, as the client route's "Service error: " does.
//!   A flush of that session never returns (traced drops a Flush from a
//!   consumer without a session, uncalled), so we flush only on cancel;
//!   at the end we wait, as perfetto_cmd does, for traced to end the
//!   session itself (duration_ms, with its own flush): the SDK's stop
//!   callback, which the safe crate does not wrap;
//! - dies mid-session: start/stop return, read returns no data;
//! - dies (or hangs) while we read: ReadTraceBlocking never returns (the
//!   read callback dies with the connection uncalled). A stopped traced
//!   blocks start and stop the same way.
//!
//! The SDK calls themselves (and the shim) are `perfetto_sdk::session`'s.
//!
//! So every SDK call runs on a thread of its own and the caller keeps the
//! deadline. A call that has not returned by then cannot be interrupted:
//! the thread is abandoned (it ends if the call ever returns, with nobody
//! listening), the partial file is removed and the session is reported
//! `Unanswered`, never stored as complete. Until that thread ends, no new
//! session starts (`TracedUnreachable`, saying so): a traced that hangs
//! costs one thread, not one per session.

use std::{
    ffi::OsString,
    io::Write,
    os::unix::net::UnixStream,
    path::Path,
    sync::{
        atomic::{AtomicBool, Ordering},
        mpsc::{self, Receiver, RecvTimeoutError, Sender},
        Mutex,
    },
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use crate::perfetto_sdk::{init_system_backend, session::TracingSession};

use super::route::{
    create_trace_file, RouteEnd, RunError, RunnerConfig, SessionLimits, SessionStatus, POLL,
};

const NO_TRACE: &str = "the in-process consumer read no trace back from traced";

/// The session thread of the last session abandoned at its deadline, with
/// the stage it was stuck in, while it may still be blocked in the SDK.
static ABANDONED: Mutex<Option<(JoinHandle<()>, &'static str)>> = Mutex::new(None);

/// The stage a previous session's thread is still stuck in, if it is.
fn still_abandoned() -> Option<&'static str> {
    let mut a = ABANDONED.lock().unwrap_or_else(|e| e.into_inner());
    match a.as_ref() {
        Some((h, stage)) if !h.is_finished() => Some(stage),
        _ => {
            *a = None;
            None
        }
    }
}

/// traced's consumer socket as the SDK picks it (perfetto's
/// GetConsumerSocket()): PERFETTO_CONSUMER_SOCK_NAME, else the platform's.
pub fn consumer_socket_name() -> OsString {
    if let Some(name) = std::env::var_os("PERFETTO_CONSUMER_SOCK_NAME") {
        return name;
    }
    if cfg!(target_os = "android") {
        return "/dev/socket/traced_consumer".into();
    }
    if Path::new("/run/perfetto").is_dir() {
        "/run/perfetto/traced-consumer.sock".into()
    } else {
        "/tmp/perfetto-consumer".into()
    }
}

/// connect() to the consumer socket, as the SDK will; `@name` is in the
/// abstract namespace. The error names the socket.
fn probe(name: &OsString) -> Result<(), String> {
    let text = name.to_string_lossy();
    let r = match text.strip_prefix('@') {
        Some(abs) => {
            use std::os::linux::net::SocketAddrExt;
            std::os::unix::net::SocketAddr::from_abstract_name(abs.as_bytes())
                .and_then(|a| UnixStream::connect_addr(&a))
        }
        None => UnixStream::connect(name),
    };
    r.map(drop).map_err(|e| format!("connect({text}): {e}"))
}

/// What the session thread tells the caller.
enum Msg {
    Started,
    /// traced ended the session (duration over, refused, gone).
    TracedStopped,
    Stopped,
    Chunk(Vec<u8>),
    /// What traced said when it ended the session (or the SDK, when the
    /// connection dropped).
    TracedError(String),
    Done,
    Failed(String),
}

/// Where the session thread is, for the report when it stops answering.
#[derive(Clone, Copy)]
enum Stage {
    Start,
    Running,
    Stop,
    Read,
}

impl Stage {
    fn name(self) -> &'static str {
        match self {
            Stage::Start => "start",
            Stage::Running => "session",
            Stage::Stop => "stop",
            Stage::Read => "read",
        }
    }
}

/// The SDK side, on its own thread: every call here may block for as long
/// as traced does not answer.
fn session(config: Vec<u8>, tx: Sender<Msg>, stop: Receiver<bool>) {
    let Some(mut s) = TracingSession::system() else {
        let _ = tx.send(Msg::Failed(
            "the Perfetto SDK made no system tracing session".into(),
        ));
        return;
    };
    // Before start: the SDK runs these in order on its own thread.
    let stopped = tx.clone();
    s.on_stop(move || {
        let _ = stopped.send(Msg::TracedStopped);
    });
    let errored = tx.clone();
    s.on_error(move |text| {
        let _ = errored.send(Msg::TracedError(text));
    });
    s.setup(&config);
    s.start_blocking();
    let _ = tx.send(Msg::Started);
    // Until traced ended the session, or the caller cancels (true) or is
    // gone (an error).
    if stop.recv() == Ok(true) {
        // What perfetto_cmd does on SIGTERM: flush (heapprofd dumps its
        // profiles), then disable. Zero: the TraceConfig's flush_timeout_ms.
        s.flush_blocking(Duration::ZERO);
    }
    // Returns at once when traced already ended the session.
    s.stop_blocking();
    let _ = tx.send(Msg::Stopped);
    // The parts come on the SDK's own thread: a send never blocks it.
    s.read_blocking(|bytes, has_more| {
        if !bytes.is_empty() {
            let _ = tx.send(Msg::Chunk(bytes.to_vec()));
        }
        if !has_more {
            let _ = tx.send(Msg::Done);
        }
    });
}

/// How the caller's wait ended.
enum Ended {
    Done,
    Failed(String),
    Unanswered(Stage),
}

/// Runs the session through the SDK until it is read back, `cancel` is set
/// (stopped early, then read back) or the deadline passes; `charge` is
/// called once the session thread runs. A trace is left in `out` only when
/// all of it was read.
pub(super) fn run(
    _config: &RunnerConfig,
    limits: &SessionLimits,
    bytes: &[u8],
    out: &Path,
    cancel: &AtomicBool,
    charge: &mut dyn FnMut(),
) -> Result<RouteEnd, RunError> {
    let socket = consumer_socket_name();
    if let Err(detail) = probe(&socket) {
        log::warn!("in-process heapprofd consumer: traced is not running: {detail}");
        return Ok(end(SessionStatus::TracedUnreachable {
            stderr_tail: detail,
        }));
    }
    if let Some(stage) = still_abandoned() {
        let stderr_tail = format!(
            "traced has not answered the {stage} of the previous in-process session, \
             abandoned at its deadline; no new session starts until it does"
        );
        log::warn!("in-process heapprofd consumer: {stderr_tail}");
        return Ok(end(SessionStatus::TracedUnreachable { stderr_tail }));
    }
    init_system_backend();
    let mut file = create_trace_file(out)?;
    let (tx, rx) = mpsc::channel();
    let (stop_tx, stop_rx) = mpsc::channel();
    let cfg = bytes.to_vec();
    let thread = thread::Builder::new()
        .name("heapprofd-sdk".into())
        .spawn(move || session(cfg, tx, stop_rx))
        .map_err(|source| RunError::Spawn {
            path: "the heapprofd-sdk thread".into(),
            source,
        })?;
    charge();
    log::info!(
        "{} session started in-process on {} for {} ms",
        limits.what,
        socket.to_string_lossy(),
        limits.duration_ms
    );

    let deadline = Instant::now() + limits.timeout;
    let w = drive(&rx, &stop_tx, &mut file, deadline, cancel);
    let (written, write_err, cancelled) = (w.written, w.write_err, w.cancelled);
    if let Ended::Unanswered(stage) = w.ended {
        *ABANDONED.lock().unwrap_or_else(|e| e.into_inner()) = Some((thread, stage.name()));
    }
    drop(file);
    let discard = || {
        let _ = std::fs::remove_file(out);
    };
    match w.ended {
        Ended::Unanswered(stage) => {
            discard();
            log::error!(
                "heapprofd session: traced did not answer the in-process consumer's {} by the \
                 deadline; abandoning it, {written} bytes read discarded",
                stage.name()
            );
            Ok(end(SessionStatus::Unanswered {
                stage: stage.name().into(),
            }))
        }
        Ended::Failed(message) => {
            discard();
            Err(RunError::Sdk {
                call: "TracingSession",
                message,
            })
        }
        Ended::Done => {
            if let Some(source) = write_err {
                discard();
                return Err(RunError::Write {
                    path: out.to_owned(),
                    source,
                });
            }
            if written == 0 {
                discard();
                return Ok(end(empty_status(&socket, w.traced_error)));
            }
            Ok(RouteEnd {
                status: if cancelled {
                    SessionStatus::Cancelled { killed: false }
                } else {
                    SessionStatus::Completed
                },
                wrote: true,
                no_trace: NO_TRACE,
            })
        }
    }
}

/// What the caller saw of the session thread.
struct Watched {
    ended: Ended,
    written: u64,
    write_err: Option<std::io::Error>,
    cancelled: bool,
    traced_error: Option<String>,
}

/// Writes the chunks read back into `file`, lets the thread stop and read
/// when traced ended the session (or on `cancel`), and gives up at
/// `deadline`.
fn drive(
    rx: &Receiver<Msg>,
    stop_tx: &Sender<bool>,
    file: &mut std::fs::File,
    deadline: Instant,
    cancel: &AtomicBool,
) -> Watched {
    let mut stage = Stage::Start;
    let (mut traced_stopped, mut stop_sent, mut cancelled) = (false, false, false);
    let (mut written, mut write_err, mut traced_error) = (0u64, None, None);
    let ended = loop {
        match rx.recv_timeout(POLL) {
            Ok(Msg::Started) if !stop_sent => stage = Stage::Running,
            Ok(Msg::Started) => stage = Stage::Stop,
            // May come before Started: a refused session ends as it starts.
            Ok(Msg::TracedStopped) => traced_stopped = true,
            Ok(Msg::Stopped) => stage = Stage::Read,
            Ok(Msg::Chunk(c)) if write_err.is_none() => match file.write_all(&c) {
                Ok(()) => written += c.len() as u64,
                Err(e) => write_err = Some(e),
            },
            Ok(Msg::Chunk(_)) => {}
            Ok(Msg::TracedError(e)) => traced_error = Some(e),
            Ok(Msg::Done) => break Ended::Done,
            Ok(Msg::Failed(m)) => break Ended::Failed(m),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => {
                break Ended::Failed("the session thread ended before the read".into())
            }
        }
        if !stop_sent && (traced_stopped || cancel.load(Ordering::SeqCst)) {
            // Flush first only when we end it; traced flushed its own end.
            cancelled = !traced_stopped;
            if cancelled {
                log::info!("heapprofd session cancelled: stopping it");
            }
            let _ = stop_tx.send(cancelled);
            stop_sent = true;
            if matches!(stage, Stage::Running) {
                stage = Stage::Stop;
            }
        }
        if Instant::now() >= deadline {
            break Ended::Unanswered(stage);
        }
    };
    Watched {
        ended,
        written,
        write_err,
        cancelled,
        traced_error,
    }
}

fn end(status: SessionStatus) -> RouteEnd {
    RouteEnd {
        status,
        wrote: false,
        no_trace: NO_TRACE,
    }
}

/// A session traced accepted always has packets of its own (the config,
/// clock snapshots, stats), so an empty read means traced refused it or
/// went away; which, the socket says now, and why, `traced_error`.
fn empty_status(socket: &OsString, traced_error: Option<String>) -> SessionStatus {
    match probe(socket) {
        Err(detail) => {
            let stderr_tail = format!("traced went away during the session: {detail}");
            log::warn!("in-process heapprofd consumer: {stderr_tail}");
            SessionStatus::TracedUnreachable { stderr_tail }
        }
        Ok(()) => {
            let reason = match traced_error.filter(|e| !e.trim().is_empty()) {
                Some(said) => said,
                None => "traced ended the session without any data and without a reason: \
                         it refused it or restarted during it"
                    .to_owned(),
            };
            log::warn!("in-process heapprofd consumer: {reason}");
            SessionStatus::Refused { reason }
        }
    }
}
