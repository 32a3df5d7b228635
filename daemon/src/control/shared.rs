//! What the socket's connections share with the daemon: the published
//! state (seen through [`Published`]), the store, the channel of requests
//! only the main loop can serve, and the socket's counters. Below both the
//! server and the request handler, which each use it.

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use tokio::sync::oneshot;

use super::{
    protocol::{ConfigReply, ControlCounts, DaemonStatus, TopReply},
    throttle::LogThrottle,
};
use crate::{event_set::EventSet, store::Store};

/// Requests only the main loop can serve.
#[derive(Debug)]
pub enum Command {
    Capture {
        duration: Duration,
        events: EventSet,
        /// Off-CPU stacks of these processes and `capture.offcpu_watch`'s;
        /// None: off.
        offcpu_pids: Option<Vec<u32>>,
        reply: oneshot::Sender<Result<String, String>>,
    },
    Heap {
        name: Option<String>,
        pid: Option<u64>,
        duration: Duration,
        reply: oneshot::Sender<Result<String, String>>,
    },
}

/// The control socket's counters, as the connections count them; read
/// into [`ControlCounts`] for `status`.
#[derive(Debug, Default)]
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
    /// kind a minute; `status` shows the count of lines held back.
    pub log: LogThrottle,
}

impl ControlCounters {
    /// The counts now, as `status` shows them.
    pub fn read(&self) -> ControlCounts {
        let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ControlCounts {
            connections: n(&self.connections),
            refused_uid: n(&self.refused_uid),
            idle_closed: n(&self.idle_closed),
            refused_full: n(&self.refused_full),
            bad_requests: n(&self.bad_requests),
            oversized_requests: n(&self.oversized_requests),
            refused_uid_revoked: n(&self.refused_uid_revoked),
            accept_errors: n(&self.accept_errors),
            write_timeouts: n(&self.write_timeouts),
            open_connections: n(&self.open_connections),
            max_open_connections: n(&self.max_open_connections),
            log_lines_suppressed: n(&self.log.suppressed),
        }
    }
}

/// What the daemon publishes for the socket to serve, read under its own
/// lock. The daemon's state type (`service::state`) implements it; the
/// socket knows only the protocol's types.
pub trait Published: Send + Sync + 'static {
    /// The published status (the `status` answer without the socket's and
    /// the store's parts).
    fn status(&self) -> DaemonStatus;
    /// The answer to `top`: the first `n` rows.
    fn top(&self, n: usize) -> TopReply;
    /// The effective config, as `config` answers it.
    fn config(&self) -> ConfigReply;
}

/// What the socket's connections share with the daemon. `S` is the
/// daemon's published state; the server sees it as `dyn Published`.
pub struct Shared<S: ?Sized + Published = dyn Published> {
    pub store: Arc<Mutex<Store>>,
    pub commands: std::sync::mpsc::Sender<Command>,
    pub allowed_uids: Mutex<Vec<u32>>,
    pub max_request_bytes: AtomicU64,
    pub counters: ControlCounters,
    /// Last: the field a `Shared<S>` is unsized through.
    pub state: S,
}
