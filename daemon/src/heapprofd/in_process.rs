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
//!   read returns no data; the C API does not pass traced's reason on;
//! - dies mid-session: start/stop return, read returns no data;
//! - dies (or hangs) while we read: ReadTraceBlocking never returns (the
//!   read callback dies with the connection uncalled). A stopped traced
//!   blocks start and stop the same way.
//!
//! So every SDK call runs on a thread of its own and the caller keeps the
//! deadline. A call that has not returned by then cannot be interrupted:
//! the thread is abandoned (it ends if the call ever returns, with nobody
//! listening), the partial file is removed and the session is reported
//! `Unanswered`, never stored as complete.

use std::{
    ffi::OsString,
    io::Write,
    os::unix::net::UnixStream,
    path::Path,
    sync::{
        atomic::{AtomicBool, Ordering},
        mpsc::{self, Receiver, RecvTimeoutError, Sender},
    },
    thread,
    time::{Duration, Instant},
};

use perfetto_sdk::tracing_session::TracingSession;

use super::{
    config::HeapProfileRequest,
    runner::{create_trace_file, RouteEnd, RunError, RunnerConfig, SessionStatus, POLL},
};

const NO_TRACE: &str = "the in-process consumer read no trace back from traced";

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
    Stopped,
    Chunk(Vec<u8>),
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
fn session(config: Vec<u8>, tx: Sender<Msg>, stop: Receiver<()>) {
    let mut s = match TracingSession::system() {
        Ok(s) => s,
        Err(e) => {
            let _ = tx.send(Msg::Failed(e.to_string()));
            return;
        }
    };
    s.setup(&config);
    s.start_blocking();
    let _ = tx.send(Msg::Started);
    // Until the duration is over or the caller cancels (or is gone).
    let _ = stop.recv();
    // What perfetto_cmd does on SIGTERM: flush (heapprofd dumps its
    // profiles), then disable. Zero: the TraceConfig's flush_timeout_ms.
    // When traced already ended the session at duration_ms, both return
    // at once.
    s.flush_blocking(Duration::ZERO);
    s.stop_blocking();
    let _ = tx.send(Msg::Stopped);
    // Called on the SDK's own thread: a send never blocks it.
    let chunks = tx.clone();
    s.read_trace_blocking(move |data, has_more| {
        if !data.is_empty() {
            let _ = chunks.send(Msg::Chunk(data.to_vec()));
        }
        if !has_more {
            let _ = chunks.send(Msg::Done);
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
    config: &RunnerConfig,
    request: &HeapProfileRequest,
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
    crate::producer::init_system_backend();
    let mut file = create_trace_file(out)?;
    let (tx, rx) = mpsc::channel();
    let (stop_tx, stop_rx) = mpsc::channel();
    let cfg = bytes.to_vec();
    thread::Builder::new()
        .name("heapprofd-sdk".into())
        .spawn(move || session(cfg, tx, stop_rx))
        .map_err(|source| RunError::Spawn {
            path: "the heapprofd-sdk thread".into(),
            source,
        })?;
    charge();
    log::info!(
        "heapprofd session started in-process on {} for {} ms",
        socket.to_string_lossy(),
        request.duration_ms
    );

    let deadline = Instant::now() + config.timeout_for(request);
    let duration = Duration::from_millis(request.duration_ms.into());
    let w = drive(&rx, &stop_tx, &mut file, deadline, duration, cancel);
    let (written, write_err, cancelled) = (w.written, w.write_err, w.cancelled);
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
                return Ok(end(empty_status(&socket)));
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
}

/// Writes the chunks read back into `file`, asks the thread to stop when
/// `duration` is over after the start (or on `cancel`), and gives up at
/// `deadline`.
fn drive(
    rx: &Receiver<Msg>,
    stop_tx: &Sender<()>,
    file: &mut std::fs::File,
    deadline: Instant,
    duration: Duration,
    cancel: &AtomicBool,
) -> Watched {
    let (mut stage, mut stop_at) = (Stage::Start, None);
    let (mut stop_sent, mut cancelled) = (false, false);
    let (mut written, mut write_err) = (0u64, None);
    let ended = loop {
        match rx.recv_timeout(POLL) {
            Ok(Msg::Started) => {
                stage = if stop_sent {
                    Stage::Stop
                } else {
                    Stage::Running
                };
                stop_at = Some(Instant::now() + duration);
            }
            Ok(Msg::Stopped) => stage = Stage::Read,
            Ok(Msg::Chunk(c)) if write_err.is_none() => match file.write_all(&c) {
                Ok(()) => written += c.len() as u64,
                Err(e) => write_err = Some(e),
            },
            Ok(Msg::Chunk(_)) => {}
            Ok(Msg::Done) => break Ended::Done,
            Ok(Msg::Failed(m)) => break Ended::Failed(m),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => {
                break Ended::Failed("the session thread ended before the read".into())
            }
        }
        let now = Instant::now();
        if !stop_sent && time_to_stop(stop_at, now, cancel) {
            cancelled = cancel.load(Ordering::SeqCst);
            if cancelled {
                log::info!("heapprofd session cancelled: stopping it");
            }
            let _ = stop_tx.send(());
            stop_sent = true;
            if matches!(stage, Stage::Running) {
                stage = Stage::Stop;
            }
        }
        if now >= deadline {
            break Ended::Unanswered(stage);
        }
    };
    Watched {
        ended,
        written,
        write_err,
        cancelled,
    }
}

/// Time to ask the session thread to stop: the duration is over (counted
/// from the start's acknowledgement; traced also ends the session itself
/// at duration_ms) or the caller cancelled.
fn time_to_stop(stop_at: Option<Instant>, now: Instant, cancel: &AtomicBool) -> bool {
    cancel.load(Ordering::SeqCst) || stop_at.is_some_and(|t| now >= t)
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
/// went away; which, the socket says now.
fn empty_status(socket: &OsString) -> SessionStatus {
    match probe(socket) {
        Err(detail) => {
            let stderr_tail = format!("traced went away during the session: {detail}");
            log::warn!("in-process heapprofd consumer: {stderr_tail}");
            SessionStatus::TracedUnreachable { stderr_tail }
        }
        Ok(()) => {
            let reason = "traced ended the session without any data: it refused it (a \
                          unique_session_name in use, a config it rejects) or restarted \
                          during it; the SDK does not pass traced's reason on, traced logs it"
                .to_owned();
            log::warn!("in-process heapprofd consumer: {reason}");
            SessionStatus::Refused { reason }
        }
    }
}
