//! The lifecycle of a daemon's recordings (what users start as captures:
//! a rule's `capture = {…}`, `vitalsctl capture`): at most one at a time,
//! on its own thread, into a pending store entry; committed (or recorded as
//! failed, nothing stored) when it ends or the daemon stops. Two backends
//! (`capture.backend`): the eBPF capture tier (a recording sink fed the
//! daemon's pipeline ticks, `record_fed`, with the capture tier switched
//! on in the daemon's programs) and a Perfetto session of traced's own
//! data sources (`perfetto_capture`), the one a /proc-only daemon has.
//!
//! The eBPF backend's file writing stays on the capture's thread, fed
//! each tick's value through a channel: the main loop's tick is not held
//! up by a large tick's sched records or a slow disk, and the store's
//! commit already happens when the thread ends. Dropping the channel's
//! sender (the daemon stopping) ends the recording at once.

use std::{
    sync::{atomic::AtomicBool, mpsc, Arc, Mutex},
    thread::JoinHandle,
    time::Duration,
};

use thiserror::Error;

use super::{push_trigger, state::Shared, Service};
use crate::{
    bpf::denied::ProcOnly,
    config::{Config, RecordingSpec},
    control::protocol::{RecordingProgress, TriggerOutcome},
    events::EventOptions,
    export,
    heapprofd::RunnerConfig,
    history::{self, History},
    perfetto_capture::{self, Backend, CaptureRequest, HeapInSession, PerfettoCaptureError},
    record::{record_fed, Feed, RecordError, RecordOptions},
    sources::Tick,
    store::{self, BackendInfo, EntryMeta, EntryStatus, Pending, Store, TriggerInfo},
};

/// Each tick of the daemon's pipeline, or why it failed, for a recording.
pub(super) type TickSender = mpsc::Sender<Result<Tick, String>>;

/// What a capture runs on: the daemon's pipeline and eBPF programs (or,
/// /proc-only with `capture.backend = "ebpf"`, why there are none), with
/// the sender of its ticks; or traced through a consumer route.
pub(super) enum RecordingEngine {
    Ebpf(Box<Feed>, TickSender),
    Perfetto(RunnerConfig),
}

impl RecordingEngine {
    fn backend(&self) -> Backend {
        match self {
            RecordingEngine::Ebpf(..) => Backend::Ebpf,
            RecordingEngine::Perfetto(_) => Backend::Perfetto,
        }
    }
}

/// How a capture ended well, whichever backend.
pub(super) struct Recorded {
    wall_ms: u64,
    /// The trace reached store.max_capture_bytes: its size then.
    cut_at_bytes: Option<u64>,
    notes: Vec<String>,
    /// A heap profile in the same session: its request and outcome.
    heapprofd: Option<serde_json::Value>,
}

#[derive(Debug, Error)]
pub(super) enum RecordingFailed {
    /// Boxed: a RecordError is large, and the thread's result carries it.
    #[error(transparent)]
    Record(Box<RecordError>),
    #[error(transparent)]
    Perfetto(#[from] PerfettoCaptureError),
}

impl From<RecordError> for RecordingFailed {
    fn from(e: RecordError) -> Self {
        RecordingFailed::Record(Box::new(e))
    }
}

impl RecordingFailed {
    /// Whether whole packets a failed capture left are worth keeping: an
    /// eBPF recording cut short by an error mid-way, yes; a capture that
    /// never started (no eBPF) or a Perfetto session (which leaves a
    /// complete trace or none), never.
    fn keeps_partial(&self) -> bool {
        matches!(self, RecordingFailed::Record(e) if !matches!(**e, RecordError::CaptureNeedsBpf(_)))
    }
}

/// A capture: a bounded recording on its own thread into a pending store entry.
pub(super) struct RunningRecording {
    pub(super) pending: Pending,
    trigger: TriggerInfo,
    started_unix_ms: u64,
    backend: Backend,
    /// Where a Perfetto session writes its trace before it is stored.
    session_out: Option<std::path::PathBuf>,
    pub(super) stop: Arc<AtomicBool>,
    /// An eBPF-backend recording's feed (None: a Perfetto session).
    pub(super) ticks: Option<TickSender>,
    pub(super) thread: JoinHandle<Result<Recorded, RecordingFailed>>,
}

impl RunningRecording {
    /// The rule (or "manual") that started it.
    pub(super) fn trigger_rule(&self) -> &str {
        &self.trigger.rule
    }
}

impl Service {
    /// What a capture started now runs on: `capture.backend` resolved
    /// against the daemon's accounting (eBPF programs, or /proc-only: why
    /// there are none).
    pub(super) fn recording_engine(&self) -> RecordingEngine {
        let ebpf = self.pipeline.sources.ebpf.as_ref();
        match self.cfg.capture.backend.resolve(ebpf.is_some()) {
            Backend::Perfetto => RecordingEngine::Perfetto(self.runner.config().clone()),
            Backend::Ebpf => {
                let (tx, ticks) = mpsc::channel();
                let feed = Feed {
                    programs: match (ebpf, &self.proc_only) {
                        (Some(e), _) => Ok(e.programs().clone()),
                        (None, why) => Err(why.clone().unwrap_or(ProcOnly::Asked)),
                    },
                    first: self.pipeline.last().share(),
                    origin: self.pipeline.origin(),
                    ticks,
                };
                RecordingEngine::Ebpf(Box::new(feed), tx)
            }
        }
    }

    /// Hands this tick's value (or why it failed) to a running eBPF-backend
    /// capture's recording.
    pub(super) fn feed_capture(&self, failed: Option<String>) {
        let Some(tx) = self.capture.as_ref().and_then(|c| c.ticks.as_ref()) else {
            return;
        };
        // A recording that ended (its thread is reaped next) drops its end.
        let _ = tx.send(match failed {
            Some(why) => Err(why),
            None => Ok(self.pipeline.last().share()),
        });
    }
}

/// Starts a capture in a thread of its own on `engine`; `heap`: a heap
/// profile in the same session (Perfetto backend only).
#[allow(clippy::too_many_arguments)]
pub(super) fn start_recording(
    cfg: &Config,
    engine: RecordingEngine,
    heap: Option<HeapInSession>,
    store: &Arc<Mutex<Store>>,
    history: &History,
    spec: &RecordingSpec,
    trigger: TriggerInfo,
    shared: &Shared,
) -> RunningRecording {
    let backend = engine.backend();
    let (pending, session_out) = {
        let mut store = store.lock().unwrap();
        let pending = store.begin(&trigger.rule);
        // As heapprofd's sessions: the perfetto client writes the trace
        // into heapprofd/, the one directory its domain may write on
        // Android (sepolicy: vitalsd_heapprofd_data_file); it moves into
        // the store when the session ends.
        let out = (backend == Backend::Perfetto).then(|| {
            let dir = store.heapprofd_dir();
            if let Err(e) = std::fs::create_dir_all(&dir) {
                log::error!("creating {}: {e}", dir.display());
            }
            dir.join(format!("{}.pftrace", pending.id))
        });
        (pending, out)
    };
    let stop = Arc::new(AtomicBool::new(false));
    let thread_stop = Arc::clone(&stop);
    log::info!(
        "capture {} started ({} for {:?}, backend {})",
        pending.id,
        trigger.rule,
        spec.duration.0,
        backend.name()
    );
    let started_unix_ms = store::now_unix_ms();
    {
        let mut st = shared.state.lock().unwrap();
        st.capture_backend = backend.name().into();
        st.capture = Some(RecordingProgress {
            id: pending.id.clone(),
            rule: trigger.rule.clone(),
            started_unix_ms,
            duration_ms: spec.duration.0.as_millis() as u64,
            backend: backend.name().into(),
        });
    }
    let mut ticks = None;
    let run: Box<dyn FnOnce() -> Result<Recorded, RecordingFailed> + Send> = match engine {
        RecordingEngine::Ebpf(feed, tx) => {
            ticks = Some(tx);
            let opts = record_options(cfg, spec, &pending);
            let samples: Vec<history::VitalsSample> = history.iter().cloned().collect();
            Box::new(move || {
                let summary = record_fed(*feed, &opts, |w| export::write_history(w, &samples))?;
                Ok(Recorded {
                    wall_ms: summary.wall_monotonic_ns / 1_000_000,
                    cut_at_bytes: summary.cut_at_max_bytes.then_some(summary.bytes_written),
                    notes: Vec::new(),
                    heapprofd: None,
                })
            })
        }
        RecordingEngine::Perfetto(runner) => {
            let req = perfetto_request(cfg, spec, heap);
            let out = session_out
                .clone()
                .expect("a perfetto capture's session file");
            Box::new(move || {
                let s = perfetto_capture::run(&runner, &req, &out, &thread_stop)?;
                Ok(recorded(s))
            })
        }
    };
    let thread = std::thread::Builder::new()
        .name("capture".into())
        .spawn(run)
        .expect("spawning the capture thread");
    RunningRecording {
        pending,
        trigger,
        started_unix_ms,
        backend,
        session_out,
        stop,
        ticks,
        thread,
    }
}

/// What a Perfetto-backend capture of `spec` asks traced for.
pub(super) fn perfetto_request(
    cfg: &Config,
    spec: &RecordingSpec,
    heap: Option<HeapInSession>,
) -> CaptureRequest {
    CaptureRequest {
        duration: spec.duration.0,
        events: spec.events,
        max_bytes: cfg.store.max_capture_bytes,
        vitals_data_source: (cfg!(feature = "producer") && cfg.producer.enabled)
            .then(|| cfg.producer.data_source.clone()),
        poll: cfg.sampling.interval.0.min(Duration::from_secs(1)),
        heap,
    }
}

/// A finished Perfetto session as a capture.
pub(super) fn recorded(s: perfetto_capture::PerfettoCaptureSummary) -> Recorded {
    Recorded {
        wall_ms: s.wall_ms,
        cut_at_bytes: s.cut_at_max_bytes.then_some(s.bytes),
        notes: s.notes,
        heapprofd: s.heapprofd,
    }
}

/// A session already running (a rule's ring, just triggered) becomes the
/// capture: a pending store entry, the progress in status, its thread.
pub(super) fn adopt_session(
    store: &Arc<Mutex<Store>>,
    shared: &Shared,
    spec: &RecordingSpec,
    trigger: TriggerInfo,
    session_out: std::path::PathBuf,
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Result<Recorded, RecordingFailed>>,
) -> RunningRecording {
    let pending = store.lock().unwrap().begin(&trigger.rule);
    let started_unix_ms = store::now_unix_ms();
    log::info!(
        "capture {} from {}'s ring session (the prelude, then {:?})",
        pending.id,
        trigger.rule,
        spec.duration.0
    );
    shared.state.lock().unwrap().capture = Some(RecordingProgress {
        id: pending.id.clone(),
        rule: trigger.rule.clone(),
        started_unix_ms,
        duration_ms: spec.duration.0.as_millis() as u64,
        backend: Backend::Perfetto.name().into(),
    });
    RunningRecording {
        pending,
        trigger,
        started_unix_ms,
        backend: Backend::Perfetto,
        session_out: Some(session_out),
        stop,
        ticks: None,
        thread,
    }
}

/// The eBPF capture tier (every switch and waking, sampled fault stacks)
/// for the capture's window only, switched on by the CAPTURE flag in the
/// daemon's own programs: loading a second set would run every always-on
/// program twice per event while the capture lasts (#14). Its samples are
/// the daemon's ticks, at `sampling.interval`.
fn record_options(cfg: &Config, spec: &RecordingSpec, pending: &Pending) -> RecordOptions {
    RecordOptions {
        duration: spec.duration.0,
        out: pending.tmp_path.clone(),
        interval: cfg.sampling.interval.0,
        proc_root: cfg.sampling.proc_root.clone(),
        drop_privileges: false,
        capture: EventOptions {
            events: spec.events,
            ..EventOptions::default()
        },
        max_bytes: Some(cfg.store.max_capture_bytes),
    }
}

/// Commits a finished (or cut) capture; a failure is recorded, never fatal.
pub(super) fn finish_recording(
    c: RunningRecording,
    store: &Arc<Mutex<Store>>,
    shared: &Shared,
    how: EntryStatus,
) {
    let mut c = c;
    // No more ticks: a fed recording ends with those it has.
    drop(c.ticks.take());
    let result = c.thread.join();
    if let Some(out) = c.session_out.as_ref().filter(|o| o.exists()) {
        if let Err(e) = std::fs::rename(out, &c.pending.tmp_path) {
            log::error!("moving {} into the store: {e}", out.display());
        }
    }
    // Scan before taking the lock the control socket also needs; commit
    // redoes and reports whatever failed here.
    let mut pending = c.pending;
    let _ = pending.seal();
    let mut store = store.lock().unwrap();
    let meta = |duration_ms: u64, status: EntryStatus, notes: Vec<String>| EntryMeta {
        id: String::new(),
        created_unix_ms: c.started_unix_ms,
        trigger: c.trigger.clone(),
        duration_ms,
        trace_bytes: 0,
        status,
        heapprofd: None,
        backend: Some(BackendInfo {
            name: c.backend.name().into(),
            notes,
        }),
    };
    let backend = c.backend.name();
    let outcome = match result {
        Ok(Ok(done)) => {
            let status = match done.cut_at_bytes {
                Some(at_bytes) => EntryStatus::CutAtLimit { at_bytes },
                None => how,
            };
            let mut m = meta(done.wall_ms, status, done.notes);
            m.heapprofd = done.heapprofd;
            match store.commit(pending, m) {
                Ok(m) => {
                    log::info!("capture {} stored ({} bytes)", m.id, m.trace_bytes);
                    TriggerOutcome::Captured {
                        id: m.id,
                        cut_short: None,
                    }
                }
                Err(e) => {
                    log::error!("capture could not be stored: {e}");
                    TriggerOutcome::Failed {
                        backend: None,
                        error: e.to_string(),
                    }
                }
            }
        }
        Ok(Err(e)) => {
            log::error!("capture failed ({backend} backend): {e}");
            let non_empty = std::fs::metadata(&pending.tmp_path).is_ok_and(|m| m.len() > 0);
            // Whatever whole packets an eBPF recording put on the disk
            // before its error are still worth keeping; an empty file, or
            // a capture that never ran, is a failure and stores nothing.
            if e.keeps_partial() && non_empty {
                let elapsed = store::now_unix_ms().saturating_sub(c.started_unix_ms);
                match store.commit(
                    pending,
                    meta(
                        elapsed,
                        EntryStatus::CutShort {
                            error: e.to_string(),
                        },
                        Vec::new(),
                    ),
                ) {
                    Ok(m) => TriggerOutcome::Captured {
                        id: m.id,
                        cut_short: Some(e.to_string()),
                    },
                    Err(e2) => TriggerOutcome::Failed {
                        backend: Some(backend.into()),
                        error: format!("{e}; {e2}"),
                    },
                }
            } else {
                store.abort(pending);
                TriggerOutcome::Failed {
                    backend: Some(backend.into()),
                    error: e.to_string(),
                }
            }
        }
        Err(_) => {
            store.abort(pending);
            TriggerOutcome::Failed {
                backend: None,
                error: "capture thread panicked".into(),
            }
        }
    };
    drop(store);
    let mut st = shared.state.lock().unwrap();
    st.capture = None;
    push_trigger(&mut st, &c.trigger, c.started_unix_ms, outcome);
}

impl Service {
    /// Stores the capture whose thread has ended.
    pub(super) fn reap_recording(&mut self) {
        if self
            .capture
            .as_ref()
            .is_some_and(|c| c.thread.is_finished())
        {
            let c = self.capture.take().unwrap();
            finish_recording(c, &self.store, &self.shared, EntryStatus::Complete);
        }
    }
}
