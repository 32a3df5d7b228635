//! The control socket server: one tokio task per connection, so a slow or
//! hostile client never holds up another; every peer checked with
//! SO_PEERCRED against the uid allowlist, at admission and again at every
//! request (a reload may remove it); requests length-limited; reads and
//! writes timed; connections bounded by an fd budget that leaves the
//! daemon's own work (sampling, captures, the store) its descriptors.

use std::{
    sync::{atomic::Ordering, Arc},
    time::Duration,
};

use serde::Serialize;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{UnixListener, UnixStream},
    sync::Semaphore,
};

pub use super::listen::{android_socket_env, bind, bind_or_inherit, ServerError};
pub use super::shared::{Command, ControlCounters, Published, Shared};
use super::{
    handle::handle,
    protocol::{ExportHead, Refusal, Request, Response},
    slots::{FdBudget, Full, Slot, Slots, IDLE_TIMEOUT},
};

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

async fn send<T: Serialize>(
    stream: &mut UnixStream,
    resp: &Response<T>,
    shared: &Shared,
) -> std::io::Result<()> {
    send_body(
        stream,
        &serde_json::to_vec(resp).unwrap_or_default(),
        shared,
    )
    .await
}

/// Sends one answer already serialized.
async fn send_body(stream: &mut UnixStream, body: &[u8], shared: &Shared) -> std::io::Result<()> {
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&(body.len() as u32).to_be_bytes());
    frame.extend_from_slice(body);
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
        let why = Refusal::err(format!("uid {uid} is not allowed"));
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
            return send(&mut stream, &Refusal::err(why), shared).await;
        }
    };
    serve(stream, uid, &slot, shared).await
}

/// What waiting for a request ended with.
enum Next {
    Request(Vec<u8>),
    /// Answer this, then close (the stream cannot be resynchronised).
    Refuse(Refusal),
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
        return Ok(Next::Refuse(Refusal::err(format!(
            "request of {len} bytes exceeds the limit of {max}"
        ))));
    }
    let mut body = vec![0u8; len as usize];
    match tokio::time::timeout(REQUEST_TIMEOUT, stream.read_exact(&mut body)).await {
        Ok(r) => r?,
        Err(_) => return Ok(Next::Refuse(Refusal::err("request timed out"))),
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
            let why = Refusal::err(format!("uid {uid} is not allowed"));
            return send(&mut stream, &why, shared).await;
        }
        let req: Request = match serde_json::from_slice(&body) {
            Ok(r) => r,
            Err(e) => {
                shared.counters.bad_requests.fetch_add(1, Ordering::Relaxed);
                let why = Refusal::err(format!("malformed request: {e}"));
                send(&mut stream, &why, shared).await?;
                continue;
            }
        };
        if let Request::Export { id } = &req {
            export(&mut stream, shared, id).await?;
            continue;
        }
        let body = handle(req, shared).await;
        send_body(&mut stream, &body, shared).await?;
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
        Err(e) => return send(stream, &Refusal::err(e), shared).await,
    };
    // Opened before the header: an eviction racing us cannot cut the
    // stream short, the open file stays readable.
    let mut file = match open_trace(&path).await {
        Ok(f) => f,
        Err(e) => {
            let why = Refusal::err(format!("{}: {e}", path.display()));
            return send(stream, &why, shared).await;
        }
    };
    let bytes = file.metadata().await?.len();
    let head = Response::ok(ExportHead { id: meta.id, bytes });
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
