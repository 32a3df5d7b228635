//! The control socket server: one tokio task per connection, so a slow or
//! hostile client never holds up another; every peer checked with
//! SO_PEERCRED against the uid allowlist; requests length-limited.

use std::{
    collections::{BTreeMap, VecDeque},
    os::unix::fs::{FileTypeExt, PermissionsExt},
    path::{Path, PathBuf},
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
    sync::oneshot,
};

use super::{
    slots::{Full, Slot, Slots, IDLE_TIMEOUT},
    Request, Response,
};
use crate::store::Store;

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
        sched: bool,
        faults: bool,
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

/// The listening socket: the one Android init created from vitalsd.rc's
/// `socket vitalsd stream 0660 system system` line when there is one
/// (`ANDROID_SOCKET_<name>`; /dev/socket is not writable by uid system), else
/// a socket bound here.
pub fn bind_or_inherit(path: &Path) -> Result<std::os::unix::net::UnixListener, ServerError> {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    match inherited_socket(name) {
        Some(result) => result.map_err(|source| ServerError::Socket {
            op: "use the socket init created",
            path: path.to_owned(),
            source,
        }),
        None => bind(path),
    }
}

/// The environment variable Android init sets for a `socket <name>` line
/// (libcutils ANDROID_SOCKET_ENV_PREFIX).
pub fn android_socket_env(name: &str) -> String {
    format!("ANDROID_SOCKET_{name}")
}

/// `Some` when init handed us a socket for `name`: checks that the fd is a
/// Unix stream socket, marks it close-on-exec (the heapprofd client must not
/// inherit it), listens and makes it non-blocking.
fn inherited_socket(name: &str) -> Option<std::io::Result<std::os::unix::net::UnixListener>> {
    use std::os::fd::{FromRawFd, RawFd};
    let value = std::env::var(android_socket_env(name)).ok()?;
    Some((|| {
        let fd: RawFd = value.trim().parse().map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{}={value:?} is not a descriptor", android_socket_env(name)),
            )
        })?;
        // SAFETY: only inspected here; ownership is taken below once it is
        // known to be a socket.
        let st = nix::sys::stat::fstat(unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) })?;
        if st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("descriptor {fd} from init is not a socket"),
            ));
        }
        // SAFETY: init passed us this descriptor and nothing else owns it.
        let l = unsafe { std::os::unix::net::UnixListener::from_raw_fd(fd) };
        nix::fcntl::fcntl(
            &l,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
        )?;
        // init binds but does not listen; a second listen() only resets the backlog.
        if unsafe { libc::listen(fd, 128) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        l.set_nonblocking(true)?;
        Ok(l)
    })())
}

/// Binds the socket (replacing a stale one) with mode 0660.
pub fn bind(path: &Path) -> Result<std::os::unix::net::UnixListener, ServerError> {
    let err = |op| {
        move |source| ServerError::Socket {
            op,
            path: path.to_owned(),
            source,
        }
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(err("create directory"))?;
    }
    // Only a stale socket is ours to remove: a misconfigured
    // `control.socket` must not delete a file or directory (lstat, so a
    // symlink is not followed either).
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => match std::fs::remove_file(path) {
            Ok(()) => log::info!("removed stale control socket {}", path.display()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(err("remove stale")(e)),
        },
        Ok(_) => {
            return Err(err("refusing to replace what is not a socket")(
                std::io::Error::from(std::io::ErrorKind::AlreadyExists),
            ))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(err("lstat")(e)),
    }
    let l = std::os::unix::net::UnixListener::bind(path).map_err(err("bind"))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660)).map_err(err("chmod"))?;
    l.set_nonblocking(true).map_err(err("set_nonblocking"))?;
    Ok(l)
}

/// Serves forever on a dedicated thread with its own runtime.
pub fn spawn(
    listener: std::os::unix::net::UnixListener,
    shared: Arc<Shared>,
) -> std::io::Result<()> {
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
                // Accept never waits for a slot: a peer is checked and given
                // a slot (or refused) at once, see control/slots.rs.
                let slots = Arc::new(Slots::default());
                loop {
                    let (stream, _) = match listener.accept().await {
                        Ok(s) => s,
                        Err(e) => {
                            log::warn!("control socket accept: {e}");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            continue;
                        }
                    };
                    let shared = Arc::clone(&shared);
                    let slots = Arc::clone(&slots);
                    tokio::spawn(async move {
                        if let Err(e) = admit_and_serve(stream, &slots, &shared).await {
                            log::debug!("control connection: {e}");
                        }
                    });
                }
            });
        })?;
    Ok(())
}

async fn send(stream: &mut UnixStream, resp: &Response) -> std::io::Result<()> {
    let body = serde_json::to_vec(resp).unwrap_or_default();
    stream.write_all(&(body.len() as u32).to_be_bytes()).await?;
    stream.write_all(&body).await?;
    stream.flush().await
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
    if !shared.allowed_uids.lock().unwrap().contains(&uid) {
        shared.counters.refused_uid.fetch_add(1, Ordering::Relaxed);
        log::warn!("control socket: refused uid {uid}");
        return send(
            &mut stream,
            &Response::err(format!("uid {uid} is not allowed")),
        )
        .await;
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
            return send(&mut stream, &Response::err(why)).await;
        }
    };
    serve(stream, &slot, shared).await
}

async fn serve(mut stream: UnixStream, slot: &Slot, shared: &Shared) -> std::io::Result<()> {
    loop {
        // Waiting for a request: evictable, and closed after IDLE_TIMEOUT.
        slot.set_idle(true);
        let mut len = [0u8; 4];
        tokio::select! {
            r = tokio::time::timeout(IDLE_TIMEOUT, stream.read_exact(&mut len)) => match r {
                Ok(Ok(_)) => {}
                Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
                Ok(Err(e)) => return Err(e),
                Err(_) => {
                    shared.counters.idle_closed.fetch_add(1, Ordering::Relaxed);
                    return Ok(());
                }
            },
            _ = slot.evict.notified() => return Ok(()),
        }
        let len = u32::from_be_bytes(len);
        let max = shared.max_request_bytes.load(Ordering::Relaxed) as u32;
        if len > max {
            shared
                .counters
                .oversized_requests
                .fetch_add(1, Ordering::Relaxed);
            return send(
                &mut stream,
                &Response::err(format!("request of {len} bytes exceeds the limit of {max}")),
            )
            .await;
        }
        let mut body = vec![0u8; len as usize];
        match tokio::time::timeout(REQUEST_TIMEOUT, stream.read_exact(&mut body)).await {
            Ok(r) => r?,
            Err(_) => return send(&mut stream, &Response::err("request timed out")).await,
        };
        let req: Request = match serde_json::from_slice(&body) {
            Ok(r) => r,
            Err(e) => {
                shared.counters.bad_requests.fetch_add(1, Ordering::Relaxed);
                send(
                    &mut stream,
                    &Response::err(format!("malformed request: {e}")),
                )
                .await?;
                continue;
            }
        };
        if let Request::Export { id } = &req {
            slot.set_idle(false);
            export(&mut stream, shared, id).await?;
            continue;
        }
        slot.set_idle(false);
        let resp = handle(req, shared).await;
        send(&mut stream, &resp).await?;
    }
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
        Err(e) => return send(stream, &Response::err(e)).await,
    };
    // Opened before the header: an eviction racing us cannot cut the
    // stream short, the open file stays readable.
    let mut file = match tokio::fs::File::open(&path).await {
        Ok(f) => f,
        Err(e) => return send(stream, &Response::err(format!("{}: {e}", path.display()))).await,
    };
    let bytes = file.metadata().await?.len();
    send(
        stream,
        &Response::ok(serde_json::json!({ "id": meta.id, "bytes": bytes })),
    )
    .await?;
    let copied = tokio::io::copy(&mut (&mut file).take(bytes), stream).await?;
    if copied != bytes {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "capture shrank during export",
        ));
    }
    stream.flush().await
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
                sched,
                faults,
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
            t.rule,
            t.value,
            t.threshold,
            t.offender.as_deref().unwrap_or("-"),
            t.outcome
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

#[cfg(test)]
mod bind_tests {
    use super::*;

    #[test]
    fn bind_replaces_a_stale_socket_but_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("s.sock");
        drop(bind(&sock).unwrap());
        // A stale socket from an earlier run is replaced.
        assert!(bind(&sock).is_ok());

        let file = dir.path().join("precious");
        std::fs::write(&file, b"keep").unwrap();
        let e = bind(&file).unwrap_err().to_string();
        assert!(e.contains("not a socket"), "{e}");
        assert_eq!(std::fs::read(&file).unwrap(), b"keep");

        // A symlink to a socket is not followed into removing it.
        let link = dir.path().join("link.sock");
        std::os::unix::fs::symlink(&sock, &link).unwrap();
        assert!(bind(&link).is_err());
        assert!(sock.exists());
    }
}
