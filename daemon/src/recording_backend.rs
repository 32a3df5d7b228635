//! What a daemon recording runs on (`capture.backend`): the interface every
//! recording backend implements in its own room (the eBPF event tier in
//! `record/backend.rs`, a Perfetto session in `perfetto_capture/backend.rs`).
//! The daemon registers them and resolves the configured choice
//! (`config::BackendChoice`) in one place (`service/backends.rs`); the
//! recording's lifecycle (a pending store entry, status, commit) is the
//! same whichever backend.

use std::{
    path::PathBuf,
    sync::{atomic::AtomicBool, mpsc, Arc},
    thread::JoinHandle,
    time::Duration,
};

use thiserror::Error;

use crate::{
    bpf::denied::ProcOnly,
    event_set::EventSet,
    events::OffcpuRequest,
    heapprofd::{in_session::HeapInSession, route::RunnerConfig},
    history::History,
    pipeline::Pipeline,
    sources::{ebpf::Programs, Tick},
};

/// Each tick of the daemon's pipeline, or why it failed, for a recording.
pub type TickSender = mpsc::Sender<Result<Tick, String>>;

/// What the daemon lends a recording as it starts.
pub struct Daemon<'a> {
    pub pipeline: &'a Pipeline,
    /// The daemon's eBPF programs, or (/proc-only) why there are none.
    pub programs: Result<&'a Programs, ProcOnly>,
    /// The samples a triggered recording writes first.
    pub history: &'a History,
    /// The consumer route to traced (heapprofd's).
    pub runner: &'a RunnerConfig,
}

/// One recording's window and limits.
#[derive(Debug, Clone)]
pub struct Window {
    pub duration: Duration,
    pub events: EventSet,
    /// store.max_capture_bytes.
    pub max_bytes: u64,
    /// sampling.interval.
    pub interval: Duration,
    pub proc_root: PathBuf,
    /// vitalsd's own Perfetto data source, when the producer is enabled.
    pub vitals_data_source: Option<String>,
    /// A heap profile in the recording's own session, on a backend that
    /// has one ([`RecordingBackend::heap_in_session`]).
    pub heap: Option<HeapInSession>,
    /// Off-CPU stacks of the watched processes (`capture = { offcpu =
    /// true }`, `vitalsctl capture --offcpu`); the eBPF backend only.
    pub offcpu: Option<OffcpuRequest>,
}

/// Where a recording goes.
#[derive(Debug, Clone)]
pub struct Target {
    /// The store entry's id.
    pub id: String,
    /// The pending entry's trace file: the recording ends there.
    pub out: PathBuf,
    /// Where an external session (traced's client) may write first: the
    /// store's heapprofd/ directory.
    pub session_dir: PathBuf,
}

/// How a recording ended well, whichever backend.
#[derive(Debug)]
pub struct Recorded {
    pub wall_ms: u64,
    /// The trace reached store.max_capture_bytes: its size then.
    pub cut_at_bytes: Option<u64>,
    pub notes: Vec<String>,
    /// A heap profile in the same session: its request and outcome.
    pub heapprofd: Option<serde_json::Value>,
}

/// Why a recording failed, and whether what it left is worth keeping.
#[derive(Debug, Error)]
#[error("{error}")]
pub struct RecordingFailed {
    pub error: Box<dyn std::error::Error + Send + Sync>,
    /// Whole packets written before the error are a partial recording
    /// (an eBPF recording cut mid-way), not a failure.
    pub keeps_partial: bool,
}

/// The body of a recording's thread; `stop` set: end early.
pub type RecordingRun = Box<dyn FnOnce(&AtomicBool) -> Result<Recorded, RecordingFailed> + Send>;

/// A recording a backend prepared, not yet running.
pub struct Prepared {
    pub run: RecordingRun,
    /// The recording's feed of pipeline ticks, when it takes them.
    pub ticks: Option<TickSender>,
    /// A file the recording writes before it moves to `Target::out`.
    pub session_out: Option<PathBuf>,
}

/// A recording backend.
pub trait RecordingBackend: Sync {
    /// Its name: `capture.backend`, status' `capture_backend`, an entry's
    /// `backend.name`.
    fn name(&self) -> &'static str;
    /// Whether `auto` may choose it on a daemon with (`has_bpf`) eBPF
    /// accounting or without.
    fn available(&self, has_bpf: bool) -> bool;
    /// Whether a heap profile can join its recording's session.
    fn heap_in_session(&self) -> bool {
        false
    }
    /// Whether rules' ring preludes (`capture.prelude = "ring"`) run on it.
    fn ring_prelude(&self) -> bool {
        false
    }
    /// The recording of `window` into `target`.
    fn prepare(&self, daemon: Daemon<'_>, window: Window, target: &Target) -> Prepared;
}

/// A recording running on its own thread.
pub struct Running {
    pub stop: Arc<AtomicBool>,
    pub ticks: Option<TickSender>,
    pub session_out: Option<PathBuf>,
    pub thread: JoinHandle<Result<Recorded, RecordingFailed>>,
}

/// What a recording's thread ended with; Err: it panicked.
pub type Joined = std::thread::Result<Result<Recorded, RecordingFailed>>;

impl Running {
    /// Starts `p` on a thread named "capture".
    pub fn spawn(p: Prepared) -> Running {
        let stop = Arc::new(AtomicBool::new(false));
        let thread_stop = Arc::clone(&stop);
        let run = p.run;
        let thread = std::thread::Builder::new()
            .name("capture".into())
            .spawn(move || run(&thread_stop))
            .expect("spawning the capture thread");
        Running {
            stop,
            ticks: p.ticks,
            session_out: p.session_out,
            thread,
        }
    }

    /// Asks the recording to end early (the daemon stopping).
    pub fn stop(&self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        self.thread.thread().unpark();
    }

    /// Ends the feed (a fed recording ends with the ticks it has), waits
    /// for the thread, and moves a session's file to `out`.
    pub fn join(mut self, out: &std::path::Path) -> Joined {
        drop(self.ticks.take());
        let result = self.thread.join();
        if let Some(s) = self.session_out.as_ref().filter(|s| s.exists()) {
            if let Err(e) = std::fs::rename(s, out) {
                log::error!("moving {} into the store: {e}", s.display());
            }
        }
        result
    }
}
