//! The lifecycle of a daemon's recordings (what users start as captures:
//! a rule's `capture = {…}`, `vitalsctl capture`): at most one at a time,
//! on its own thread, into a pending store entry; committed (or recorded as
//! failed, nothing stored) when it ends or the daemon stops. What a
//! recording runs on is a backend (`recording_backend`) resolved from
//! `capture.backend` in `backends.rs`; nothing here names one.

use std::sync::{Arc, Mutex};

use super::{backends, push_trigger, state::Shared, Service};
use crate::{
    bpf::denied::ProcOnly,
    config::{Config, RecordingSpec},
    control::protocol::{RecordingProgress, TriggerOutcome},
    events::OffcpuRequest,
    heapprofd::in_session::HeapInSession,
    recording_backend::{Daemon, RecordingBackend, Running, Target, Window},
    store::{self, BackendInfo, EntryMeta, EntryStatus, Pending, Store, TriggerInfo},
};

/// A capture: a bounded recording on its own thread into a pending store entry.
pub(super) struct RunningRecording {
    pub(super) pending: Pending,
    trigger: TriggerInfo,
    started_unix_ms: u64,
    backend: &'static str,
    pub(super) running: Running,
}

impl RunningRecording {
    /// The rule (or "manual") that started it.
    pub(super) fn trigger_rule(&self) -> &str {
        &self.trigger.rule
    }
}

impl Service {
    /// What a capture started now runs on: `capture.backend` resolved
    /// against the daemon's accounting.
    pub(super) fn recording_backend(&self) -> &'static dyn RecordingBackend {
        backends::resolve(
            self.cfg.capture.backend,
            self.pipeline.sources.ebpf.is_some(),
        )
    }

    /// What the daemon lends a recording: its pipeline, its eBPF programs
    /// (or, /proc-only, why there are none), its history, traced's route.
    fn daemon_side(&self) -> Daemon<'_> {
        let ebpf = self.pipeline.sources.ebpf.as_ref();
        Daemon {
            pipeline: &self.pipeline,
            programs: match (ebpf, &self.proc_only) {
                (Some(e), _) => Ok(e.programs()),
                (None, why) => Err(why.clone().unwrap_or(ProcOnly::Asked)),
            },
            history: &self.history,
            runner: self.runner.config(),
        }
    }

    /// Starts a capture of `spec` on `backend` in a thread of its own;
    /// `heap`: a heap profile in the same session (a backend that has one);
    /// `offcpu_pids`: the processes its off-CPU stacks watch (the rule's
    /// offender) beside `capture.offcpu_watch`.
    pub(super) fn start_recording(
        &self,
        backend: &'static dyn RecordingBackend,
        heap: Option<HeapInSession>,
        spec: &RecordingSpec,
        trigger: TriggerInfo,
        offcpu_pids: &[u32],
    ) -> RunningRecording {
        let (pending, session_dir) = {
            let mut store = self.store.lock().unwrap();
            let pending = store.begin(&trigger.rule);
            (pending, store.heapprofd_dir())
        };
        let target = Target {
            id: pending.id.clone(),
            out: pending.tmp_path.clone(),
            session_dir,
        };
        let window = window(&self.cfg, spec, heap, offcpu_pids);
        let name = backend.name();
        if window.offcpu.is_some() && name != "ebpf" {
            log::warn!(
                "capture {}: off-CPU stacks need the ebpf backend; {name} records none",
                pending.id
            );
        }
        let prepared = backend.prepare(self.daemon_side(), window, &target);
        log::info!(
            "capture {} started ({} for {:?}, backend {name})",
            pending.id,
            trigger.rule,
            spec.duration.0,
        );
        let started_unix_ms = store::now_unix_ms();
        {
            let mut st = self.shared.state.lock().unwrap();
            st.capture_backend = name.into();
            st.capture = Some(RecordingProgress {
                id: pending.id.clone(),
                rule: trigger.rule.clone(),
                started_unix_ms,
                duration_ms: spec.duration.0.as_millis() as u64,
                backend: name.into(),
            });
        }
        RunningRecording {
            pending,
            trigger,
            started_unix_ms,
            backend: name,
            running: Running::spawn(prepared),
        }
    }

    /// Hands this tick's value (or why it failed) to a running capture
    /// that takes the pipeline's ticks.
    pub(super) fn feed_capture(&self, failed: Option<String>) {
        let Some(tx) = self.capture.as_ref().and_then(|c| c.running.ticks.as_ref()) else {
            return;
        };
        // A recording that ended (its thread is reaped next) drops its end.
        let _ = tx.send(match failed {
            Some(why) => Err(why),
            None => Ok(self.pipeline.last().share()),
        });
    }
}

/// The window and limits of a capture of `spec` under `cfg`; its off-CPU
/// stacks watch `offcpu_pids` and the processes `capture.offcpu_watch` names.
pub(super) fn window(
    cfg: &Config,
    spec: &RecordingSpec,
    heap: Option<HeapInSession>,
    offcpu_pids: &[u32],
) -> Window {
    Window {
        duration: spec.duration.0,
        events: spec.events,
        max_bytes: cfg.store.max_capture_bytes,
        interval: cfg.sampling.interval.0,
        proc_root: cfg.sampling.proc_root.clone(),
        vitals_data_source: (cfg!(feature = "producer") && cfg.producer.enabled)
            .then(|| cfg.producer.data_source.clone()),
        heap,
        offcpu: (spec.offcpu && spec.events.sched).then(|| OffcpuRequest {
            min_block_ns: cfg.sampling.long_block.0.as_nanos() as u64,
            pids: offcpu_pids.to_vec(),
            names: cfg.capture.offcpu_watch.clone(),
            all: cfg.capture.offcpu_watch_all,
        }),
    }
}

/// A session already running (a rule's ring, just triggered) becomes the
/// capture: a pending store entry, the progress in status, its thread.
pub(super) fn adopt_session(
    store: &Arc<Mutex<Store>>,
    shared: &Shared,
    spec: &RecordingSpec,
    trigger: TriggerInfo,
    backend: &'static str,
    running: Running,
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
        backend: backend.into(),
    });
    RunningRecording {
        pending,
        trigger,
        started_unix_ms,
        backend,
        running,
    }
}

/// Commits a finished (or cut) capture; a failure is recorded, never fatal.
pub(super) fn finish_recording(
    c: RunningRecording,
    store: &Arc<Mutex<Store>>,
    shared: &Shared,
    how: EntryStatus,
) {
    let result = c.running.join(&c.pending.tmp_path);
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
            name: c.backend.into(),
            notes,
        }),
    };
    let backend = c.backend;
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
            if e.keeps_partial && non_empty {
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
            .is_some_and(|c| c.running.thread.is_finished())
        {
            let c = self.capture.take().unwrap();
            finish_recording(c, &self.store, &self.shared, EntryStatus::Complete);
        }
    }
}
