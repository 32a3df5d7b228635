//! The control socket server: one tokio task per connection, so a slow or
//! hostile client never holds up another; every peer checked with
//! SO_PEERCRED against the uid allowlist, at admission and again at every
//! request (a reload may remove it); requests length-limited; reads and
//! writes timed; connections bounded by an fd budget that leaves the
//! daemon's own work (sampling, captures, the store) its descriptors.

use std::{
    collections::{BTreeMap, VecDeque},
    path::PathBuf,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use serde::Serialize;
use thiserror::Error;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{UnixListener, UnixStream},
    sync::{oneshot, Semaphore},
};

pub use super::listen::{android_socket_env, bind, bind_or_inherit};
use super::{
    printable,
    slots::{FdBudget, Full, Slot, Slots, IDLE_TIMEOUT},
    throttle::LogThrottle,
    Request, Response,
};
use crate::{event_set::EventSet, store::Store};

#[derive(Debug, Error)]
pub enum ServerError {
    #[error("control socket {path}: {op}: {source}")]
    Socket {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// One row of `top`: eBPF and procfs figures of a process over the last window.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct TopRow {
    pub pid: i32,
    pub name: String,
    pub core_equivalent_pct: f64,
    pub machine_share_pct: f64,
    pub minflt: u64,
    pub majflt: u64,
    pub rss_kb: Option<u64>,
    /// The eBPF figures of the same window; None on a process's first
    /// window (no delta yet) or when the maps could not be read.
    pub ebpf: Option<TopEbpf>,
}

/// eBPF per-window figures of one process.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct TopEbpf {
    pub oncpu_ms: f64,
    pub runq_wait_ms: f64,
    pub voluntary_switches: u64,
    pub involuntary_switches: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct CaptureProgress {
    pub id: String,
    pub rule: String,
    pub started_unix_ms: u64,
    pub duration_ms: u64,
    /// The capture backend ("ebpf", "perfetto"); empty for heap profiles.
    #[serde(skip_serializing_if = "str::is_empty")]
    pub backend: &'static str,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TriggerRecord {
    pub unix_ms: u64,
    pub rule: String,
    pub value: Option<f64>,
    pub threshold: Option<f64>,
    pub offender: Option<String>,
    /// "captured <id>", "failed: …", or a skip reason.
    pub outcome: String,
}

/// What the main loop publishes for the socket to serve.
#[derive(Debug, Clone, Default, Serialize)]
pub struct DaemonState {
    pub version: &'static str,
    pub started_unix_ms: u64,
    pub samples: u64,
    pub interval_ms: u64,
    pub fault_source: String,
    /// "ebpf", or "proc-only (bpf denied: …)" / "proc-only (asked for …)".
    pub accounting: String,
    /// The tier the always-on accounting runs in ("ebpf", "cts", "ticks";
    /// `accounting::Tier`) and what it gives.
    pub tier: &'static str,
    pub tier_gives: &'static str,
    /// The procfs scheduler source's counters (the CTS tier); empty in
    /// the others.
    pub sched_procfs: BTreeMap<String, u64>,
    /// The backend a capture started now runs on (`capture.backend`
    /// resolved against the accounting): "ebpf" or "perfetto".
    pub capture_backend: &'static str,
    pub capabilities: String,
    pub local_busy_pct: Option<f64>,
    pub loadavg: Option<[f32; 3]>,
    pub top: Vec<TopRow>,
    pub capture: Option<CaptureProgress>,
    pub heap_session: Option<CaptureProgress>,
    pub recent_triggers: VecDeque<TriggerRecord>,
    pub triggers_fired: u64,
    pub triggers_skipped: BTreeMap<String, u64>,
    /// Manual captures and heap profiles refused, by reason.
    pub manual_refused: BTreeMap<String, u64>,
    pub bpf_drops: BTreeMap<String, u64>,
    /// Samples skipped because a read failed, by source.
    pub sample_errors: BTreeMap<String, u64>,
    pub procfs_drops: BTreeMap<String, u64>,
    pub history_samples: usize,
    /// The Perfetto producer's counters (reconnects, sessions, drops);
    /// empty when it is not running.
    pub producer: BTreeMap<String, u64>,
    /// Its last error (a session's bad data source config), or why it
    /// is not running (not started: /proc-only, or registering failed).
    pub producer_error: Option<String>,
    pub config_path: String,
    #[serde(skip)]
    pub config_toml: String,
    pub last_reload_error: Option<String>,
}

/// Requests only the main loop can serve.
#[derive(Debug)]
pub enum Command {
    Capture {
        duration: Duration,
        events: EventSet,
        reply: oneshot::Sender<Result<String, String>>,
    },
    Heap {
        name: Option<String>,
        pid: Option<u64>,
        duration: Duration,
        reply: oneshot::Sender<Result<String, String>>,
    },
}

#[derive(Debug, Default, Serialize)]
pub struct ControlCounters {
    pub connections: AtomicU64,
    pub refused_uid: AtomicU64,
    /// Connections closed for sending no request (idle past the timeout,
    /// or evicted to make room for a new connection).
    pub idle_closed: AtomicU64,
    /// Connections refused because every slot in the way was busy.
    pub refused_full: AtomicU64,
    pub bad_requests: AtomicU64,
    pub oversized_requests: AtomicU64,
    /// Requests refused on an open connection whose uid a reload removed
    /// from `allowed_uids` (the connection is then closed).
    pub refused_uid_revoked: AtomicU64,
    /// accept() failures (EMFILE, ENFILE, ...), retried after a pause.
    pub accept_errors: AtomicU64,
    /// Connections dropped because the peer read nothing for `WRITE_TIMEOUT`.
    pub write_timeouts: AtomicU64,
    /// Accepted connections open now, and the most allowed (the fd budget).
    pub open_connections: AtomicU64,
    pub max_open_connections: AtomicU64,
    /// Peer-caused log lines (refused uids, accept errors), at most one per
    /// kind a minute; serialized as the count of lines held back.
    #[serde(rename = "log_lines_suppressed", serialize_with = "held_back")]
    pub log: LogThrottle,
}

fn held_back<S: serde::Serializer>(t: &LogThrottle, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(t.suppressed.load(Ordering::Relaxed))
}

pub struct Shared {
    pub state: Mutex<DaemonState>,
    pub store: Arc<Mutex<Store>>,
    pub commands: std::sync::mpsc::Sender<Command>,
    pub allowed_uids: Mutex<Vec<u32>>,
    pub max_request_bytes: AtomicU64,
    pub counters: ControlCounters,
}

/// A client must deliver a whole request within this.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// A peer must take some of what we send within this (a send timeout):
/// one that stops reading an export or an answer is dropped, and with it
/// the slot and the open trace (a deleted capture's space is freed).
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// Writes are timed per chunk of this: a slow reader that keeps reading
/// is served, however large the answer.
const WRITE_CHUNK_BYTES: usize = 64 << 10;

/// Serves forever on a dedicated thread with its own runtime.
pub fn spawn(
    listener: std::os::unix::net::UnixListener,
    shared: Arc<Shared>,
) -> std::io::Result<()> {
    let (budget, nofile) = FdBudget::of_this_process();
    log::info!(
        "control socket: at most {} connections open ({} per uid, {} held in all) under RLIMIT_NOFILE {nofile}, {} descriptors kept for sampling and captures",
        budget.open,
        budget.per_uid,
        budget.total,
        super::slots::FD_RESERVE
    );
    if nofile < super::slots::FD_RESERVE * 2 {
        log::warn!(
            "RLIMIT_NOFILE {nofile} is low: the control socket gets only {} connections",
            budget.open
        );
    }
    shared
        .counters
        .max_open_connections
        .store(budget.open as u64, Ordering::Relaxed);
    std::thread::Builder::new()
        .name("control".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    log::error!("control socket runtime: {e}");
                    return;
                }
            };
            rt.block_on(async move {
                let listener = match UnixListener::from_std(listener) {
                    Ok(l) => l,
                    Err(e) => {
                        log::error!("control socket: {e}");
                        return;
                    }
                };
                accept_loop(listener, budget, shared).await;
            });
        })?;
    Ok(())
}

/// Accepts while the fd budget allows: a connection takes a permit before
/// accept() and gives it back when its socket is closed, so peers can
/// never hold more than `budget.open` descriptors; past it they wait in
/// the kernel's listen backlog, which costs the daemon none. A peer is
/// then checked and given a slot (or refused) at once, see slots.rs.
async fn accept_loop(listener: UnixListener, budget: FdBudget, shared: Arc<Shared>) {
    let permits = Arc::new(Semaphore::new(budget.open));
    let slots = Arc::new(Slots::new(budget.per_uid, budget.total));
    loop {
        let Ok(permit) = Arc::clone(&permits).acquire_owned().await else {
            return;
        };
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                shared
                    .counters
                    .accept_errors
                    .fetch_add(1, Ordering::Relaxed);
                shared
                    .counters
                    .log
                    .warn("accept", || format!("control socket accept: {e}"));
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let shared = Arc::clone(&shared);
        let slots = Arc::clone(&slots);
        tokio::spawn(async move {
            let open = &shared.counters.open_connections;
            open.fetch_add(1, Ordering::Relaxed);
            if let Err(e) = admit_and_serve(stream, &slots, &shared).await {
                log::debug!("control connection: {e}");
            }
            // The stream is closed by now (moved into admit_and_serve).
            open.fetch_sub(1, Ordering::Relaxed);
            drop(permit);
        });
    }
}

/// Writes all of `bytes`, each chunk within `WRITE_TIMEOUT`.
async fn write_timed(
    stream: &mut UnixStream,
    bytes: &[u8],
    shared: &Shared,
) -> std::io::Result<()> {
    for chunk in bytes.chunks(WRITE_CHUNK_BYTES) {
        if tokio::time::timeout(WRITE_TIMEOUT, stream.write_all(chunk))
            .await
            .is_err()
        {
            shared
                .counters
                .write_timeouts
                .fetch_add(1, Ordering::Relaxed);
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "peer stopped reading",
            ));
        }
    }
    Ok(())
}

async fn send(stream: &mut UnixStream, resp: &Response, shared: &Shared) -> std::io::Result<()> {
    let body = serde_json::to_vec(resp).unwrap_or_default();
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&(body.len() as u32).to_be_bytes());
    frame.extend_from_slice(&body);
    write_timed(stream, &frame, shared).await
}

fn allowed(shared: &Shared, uid: u32) -> bool {
    shared.allowed_uids.lock().unwrap().contains(&uid)
}

/// Checks the peer, takes a slot for it and serves it until it closes,
/// idles out or is evicted.
async fn admit_and_serve(
    mut stream: UnixStream,
    slots: &Arc<Slots>,
    shared: &Shared,
) -> std::io::Result<()> {
    shared.counters.connections.fetch_add(1, Ordering::Relaxed);
    let uid = stream.peer_cred()?.uid();
    if !allowed(shared, uid) {
        shared.counters.refused_uid.fetch_add(1, Ordering::Relaxed);
        shared.counters.log.warn(&format!("refused {uid}"), || {
            format!("control socket: refused uid {uid}")
        });
        let why = Response::err(format!("uid {uid} is not allowed"));
        return send(&mut stream, &why, shared).await;
    }
    let slot = match slots.take(uid) {
        Ok((slot, evicted)) => {
            shared
                .counters
                .idle_closed
                .fetch_add(evicted, Ordering::Relaxed);
            slot
        }
        Err(full) => {
            shared.counters.refused_full.fetch_add(1, Ordering::Relaxed);
            let why = match full {
                Full::Uid => format!("uid {uid} has too many busy connections"),
                Full::Total => "too many busy connections".to_string(),
            };
            return send(&mut stream, &Response::err(why), shared).await;
        }
    };
    serve(stream, uid, &slot, shared).await
}

/// What waiting for a request ended with.
enum Next {
    Request(Vec<u8>),
    /// Answer this, then close (the stream cannot be resynchronised).
    Refuse(Response),
    Close,
}

/// Reads one request: its header within `IDLE_TIMEOUT`, its body within
/// `REQUEST_TIMEOUT`. The caller races this against eviction, so an
/// evicted connection is closed at once, whichever part it was stuck in.
async fn read_request(stream: &mut UnixStream, shared: &Shared) -> std::io::Result<Next> {
    let mut len = [0u8; 4];
    match tokio::time::timeout(IDLE_TIMEOUT, stream.read_exact(&mut len)).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(Next::Close),
        Ok(Err(e)) => return Err(e),
        Err(_) => {
            shared.counters.idle_closed.fetch_add(1, Ordering::Relaxed);
            return Ok(Next::Close);
        }
    }
    let len = u32::from_be_bytes(len);
    let max = shared.max_request_bytes.load(Ordering::Relaxed) as u32;
    if len > max {
        shared
            .counters
            .oversized_requests
            .fetch_add(1, Ordering::Relaxed);
        return Ok(Next::Refuse(Response::err(format!(
            "request of {len} bytes exceeds the limit of {max}"
        ))));
    }
    let mut body = vec![0u8; len as usize];
    match tokio::time::timeout(REQUEST_TIMEOUT, stream.read_exact(&mut body)).await {
        Ok(r) => r?,
        Err(_) => return Ok(Next::Refuse(Response::err("request timed out"))),
    };
    Ok(Next::Request(body))
}

async fn serve(
    mut stream: UnixStream,
    uid: u32,
    slot: &Slot,
    shared: &Shared,
) -> std::io::Result<()> {
    loop {
        // Waiting for or receiving a request: evictable.
        slot.set_idle(true);
        let next = tokio::select! {
            next = read_request(&mut stream, shared) => next?,
            _ = slot.evict.notified() => return Ok(()),
        };
        let body = match next {
            Next::Request(body) => body,
            Next::Refuse(resp) => return send(&mut stream, &resp, shared).await,
            Next::Close => return Ok(()),
        };
        slot.set_idle(false);
        // The allowlist of now, not of admission: a reload may have
        // removed this uid while its connection stayed open.
        if !allowed(shared, uid) {
            shared
                .counters
                .refused_uid_revoked
                .fetch_add(1, Ordering::Relaxed);
            shared.counters.log.warn(&format!("revoked {uid}"), || {
                format!("control socket: uid {uid} is no longer allowed; closing its connection")
            });
            let why = Response::err(format!("uid {uid} is not allowed"));
            return send(&mut stream, &why, shared).await;
        }
        let req: Request = match serde_json::from_slice(&body) {
            Ok(r) => r,
            Err(e) => {
                shared.counters.bad_requests.fetch_add(1, Ordering::Relaxed);
                let why = Response::err(format!("malformed request: {e}"));
                send(&mut stream, &why, shared).await?;
                continue;
            }
        };
        if let Request::Export { id } = &req {
            export(&mut stream, shared, id).await?;
            continue;
        }
        let resp = handle(req, shared).await;
        send(&mut stream, &resp, shared).await?;
    }
}

/// Opens a stored trace for export: O_NOFOLLOW (a symlink planted as
/// `<id>.pftrace` is not followed out of the store, ELOOP) and O_NONBLOCK
/// (a FIFO there cannot block the open), then it must be a regular file.
async fn open_trace(path: &std::path::Path) -> std::io::Result<tokio::fs::File> {
    let file = tokio::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .await?;
    if !file.metadata().await?.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "not a regular file",
        ));
    }
    Ok(file)
}

async fn export(stream: &mut UnixStream, shared: &Shared, id: &str) -> std::io::Result<()> {
    let found = shared
        .store
        .lock()
        .unwrap()
        .get(id)
        .map(|(m, p)| (m.clone(), p));
    let (meta, path) = match found {
        Ok(x) => x,
        Err(e) => return send(stream, &Response::err(e), shared).await,
    };
    // Opened before the header: an eviction racing us cannot cut the
    // stream short, the open file stays readable.
    let mut file = match open_trace(&path).await {
        Ok(f) => f,
        Err(e) => {
            let why = Response::err(format!("{}: {e}", path.display()));
            return send(stream, &why, shared).await;
        }
    };
    let bytes = file.metadata().await?.len();
    let head = Response::ok(serde_json::json!({ "id": meta.id, "bytes": bytes }));
    send(stream, &head, shared).await?;
    let mut buf = vec![0u8; WRITE_CHUNK_BYTES];
    let mut copied = 0u64;
    while copied < bytes {
        let want = (bytes - copied).min(buf.len() as u64) as usize;
        let n = file.read(&mut buf[..want]).await?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "capture shrank during export",
            ));
        }
        write_timed(stream, &buf[..n], shared).await?;
        copied += n as u64;
    }
    Ok(())
}

async fn handle(req: Request, shared: &Shared) -> Response {
    match req {
        Request::Status {} => {
            let st = shared.state.lock().unwrap();
            let mut v = serde_json::to_value(&*st).unwrap_or_default();
            v["control"] = serde_json::to_value(&shared.counters).unwrap_or_default();
            let store = shared.store.lock().unwrap();
            v["store"] = store_summary(&store);
            Response::ok(v)
        }
        Request::Top { n } => {
            let st = shared.state.lock().unwrap();
            let top: Vec<&TopRow> = st.top.iter().take(n).collect();
            Response::ok(serde_json::json!({
                "local_busy_pct": st.local_busy_pct,
                "loadavg": st.loadavg,
                "processes": top,
            }))
        }
        Request::Capture {
            duration_s,
            sched,
            faults,
        } => {
            if !(duration_s.is_finite() && duration_s > 0.0 && duration_s <= 3600.0) {
                return Response::err("duration_s must be in (0, 3600]");
            }
            ask_main_loop(shared, |reply| Command::Capture {
                duration: Duration::from_secs_f64(duration_s),
                events: EventSet { sched, faults },
                reply,
            })
            .await
        }
        Request::Heap {
            name,
            pid,
            duration_s,
        } => {
            if !(duration_s.is_finite() && duration_s > 0.0 && duration_s <= 86400.0) {
                return Response::err("duration_s must be in (0, 86400]");
            }
            ask_main_loop(shared, |reply| Command::Heap {
                name,
                pid,
                duration: Duration::from_secs_f64(duration_s),
                reply,
            })
            .await
        }
        Request::List {} => {
            let store = shared.store.lock().unwrap();
            Response::ok(serde_json::to_value(store.list()).unwrap_or_default())
        }
        Request::Delete { id } => match shared.store.lock().unwrap().delete(&id) {
            Ok(()) => Response::ok(serde_json::json!({ "deleted": id })),
            Err(e) => Response::err(e),
        },
        Request::Config {} => {
            let st = shared.state.lock().unwrap();
            Response::ok(serde_json::json!({ "path": st.config_path, "toml": st.config_toml }))
        }
        Request::Dump {} => Response::ok(serde_json::json!({ "text": dump_text(shared) })),
        Request::Export { .. } => Response::err("export is streamed"),
    }
}

/// Hands a command to the main loop and answers with the id it returns.
async fn ask_main_loop(
    shared: &Shared,
    command: impl FnOnce(oneshot::Sender<Result<String, String>>) -> Command,
) -> Response {
    let (reply, rx) = oneshot::channel();
    if shared.commands.send(command(reply)).is_err() {
        return Response::err("daemon is shutting down");
    }
    match rx.await {
        Ok(Ok(id)) => Response::ok(serde_json::json!({ "id": id })),
        Ok(Err(e)) => Response::err(e),
        Err(_) => Response::err("daemon is shutting down"),
    }
}

fn store_summary(store: &Store) -> serde_json::Value {
    serde_json::json!({
        "dir": store.dir(),
        "captures": store.list().len(),
        "bytes": store.total_trace_bytes(),
        "newest": store.newest().map(|m| m.id.clone()),
        "newest_path": store.newest().and_then(|m| store.get(&m.id).ok().map(|(_, p)| p)),
        "heapprofd_bytes": store.heapprofd_bytes(),
        "counters": store.counters,
    })
}

/// The bugreport section (`vitalsctl dump`): plain text, stable headings.
pub fn dump_text(shared: &Shared) -> String {
    use std::fmt::Write;
    let st = shared.state.lock().unwrap().clone();
    let store = shared.store.lock().unwrap();
    let mut s = String::new();
    let _ = writeln!(s, "------ VITALSD (vitalsctl dump) ------");
    let _ =
        writeln!(
        s,
        "version {} up since {} ms (unix), {} samples at {} ms, faults from {}, capabilities {}",
        st.version, st.started_unix_ms, st.samples, st.interval_ms, st.fault_source, st.capabilities
    );
    let _ = writeln!(s, "accounting: {}", st.accounting);
    let _ = writeln!(
        s,
        "cpu local busy {:.1}%  loadavg {:?}",
        st.local_busy_pct.unwrap_or(f64::NAN),
        st.loadavg
    );
    if let Some(c) = &st.capture {
        let _ = writeln!(
            s,
            "capture running: {} (rule {}, {} ms)",
            c.id, c.rule, c.duration_ms
        );
    }
    let _ = writeln!(
        s,
        "triggers: fired {}, skipped {:?}",
        st.triggers_fired, st.triggers_skipped
    );
    let _ = writeln!(s, "recent triggers:");
    for t in &st.recent_triggers {
        let _ = writeln!(
            s,
            "  {} {} value={:?} threshold={:?} offender={} -> {}",
            t.unix_ms,
            printable(&t.rule),
            t.value,
            t.threshold,
            // A process names itself: its control characters would reach
            // the bugreport's reader raw, or forge a line of this section.
            printable(t.offender.as_deref().unwrap_or("-")),
            printable(&t.outcome)
        );
    }
    let _ = writeln!(
        s,
        "drops: bpf {:?} procfs {:?}; samples skipped by read errors {:?}",
        st.bpf_drops, st.procfs_drops, st.sample_errors
    );
    let _ = writeln!(
        s,
        "store {}: {} captures, {} bytes, counters {:?}",
        store.dir().display(),
        store.list().len(),
        store.total_trace_bytes(),
        store.counters
    );
    if let Some(m) = store.newest() {
        if let Ok((_, p)) = store.get(&m.id) {
            let _ = writeln!(
                s,
                "newest capture: {} ({} bytes, rule {})",
                p.display(),
                m.trace_bytes,
                m.trigger.rule
            );
        }
    }
    if let Some(e) = &st.last_reload_error {
        let _ = writeln!(s, "last config reload failed: {e}");
    }
    s
}
