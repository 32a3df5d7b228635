//! The capture lifecycle: at most one bounded `record` at a time, on its
//! own thread, into a pending store entry; committed (or recorded as
//! failed) when it ends or the daemon stops.

use std::{
    sync::{atomic::AtomicBool, Arc, Mutex},
    thread::JoinHandle,
    time::Duration,
};

use super::{push_trigger, Service};
use crate::{
    bpf::{denied::ProcOnly, AccountingConfig, AccountingReader},
    capture::CaptureOptions,
    config::{CaptureSpec, Config},
    control::server::{CaptureProgress, Shared},
    export,
    history::{self, History},
    record::{record_on, RecordError, RecordOptions, RecordSummary},
    store::{self, CaptureMeta, Pending, Store, TriggerInfo},
};

/// A capture: a bounded `record` on its own thread into a pending store entry.
pub(super) struct RunningCapture {
    pub(super) pending: Pending,
    trigger: TriggerInfo,
    started_unix_ms: u64,
    pub(super) stop: Arc<AtomicBool>,
    pub(super) thread: JoinHandle<Result<RecordSummary, RecordError>>,
}

impl Service {
    /// A reader of the daemon's programs for a capture; /proc-only, why
    /// there are none (the capture then fails with `CaptureNeedsBpf`).
    pub(super) fn capture_accounting(&self) -> Result<AccountingReader, ProcOnly> {
        match (&self.accounting, &self.proc_only) {
            (Some(acc), _) => Ok(acc.another()),
            (None, why) => Err(why.clone().unwrap_or(ProcOnly::Asked)),
        }
    }
}

/// Starts a capture in a thread of its own, reading `accounting` (the
/// daemon's programs, or Err: /proc-only).
pub(super) fn start_capture(
    cfg: &Config,
    accounting: Result<AccountingReader, ProcOnly>,
    store: &Arc<Mutex<Store>>,
    history: &History,
    spec: &CaptureSpec,
    trigger: TriggerInfo,
    shared: &Shared,
) -> RunningCapture {
    let pending = store.lock().unwrap().begin(&trigger.rule);
    // The capture tier (every switch and waking, sampled fault stacks) for
    // the capture's window only, switched on by the CAPTURE flag in the
    // daemon's own programs: loading a second set would run every
    // always-on program twice per event while the capture lasts (#14).
    let capture = CaptureOptions {
        sched: spec.sched,
        faults: spec.faults,
        ..CaptureOptions::default()
    };
    let opts = RecordOptions {
        duration: spec.duration.0,
        out: pending.tmp_path.clone(),
        interval: cfg.sampling.interval.0.min(Duration::from_secs(1)),
        // Not used by record_on: the daemon's programs are loaded.
        accounting: AccountingConfig::default(),
        proc_root: cfg.sampling.proc_root.clone(),
        drop_privileges: false,
        capture,
        max_bytes: Some(cfg.store.max_capture_bytes),
    };
    let samples: Vec<history::VitalsSample> = history.iter().cloned().collect();
    let stop = Arc::new(AtomicBool::new(false));
    let thread_stop = Arc::clone(&stop);
    log::info!(
        "capture {} started ({} for {:?})",
        pending.id,
        trigger.rule,
        spec.duration.0
    );
    let started_unix_ms = store::now_unix_ms();
    shared.state.lock().unwrap().capture = Some(CaptureProgress {
        id: pending.id.clone(),
        rule: trigger.rule.clone(),
        started_unix_ms,
        duration_ms: spec.duration.0.as_millis() as u64,
    });
    let thread = std::thread::Builder::new()
        .name("capture".into())
        .spawn(move || {
            record_on(accounting, &opts, &thread_stop, |w| {
                export::write_history(w, &samples)
            })
        })
        .expect("spawning the capture thread");
    RunningCapture {
        pending,
        trigger,
        started_unix_ms,
        stop,
        thread,
    }
}

/// Commits a finished (or cut) capture; a failure is recorded, never fatal.
pub(super) fn finish_capture(
    c: RunningCapture,
    store: &Arc<Mutex<Store>>,
    shared: &Shared,
    how: &str,
) {
    let result = c.thread.join();
    // Scan before taking the lock the control socket also needs; commit
    // redoes and reports whatever failed here.
    let mut pending = c.pending;
    let _ = pending.seal();
    let mut store = store.lock().unwrap();
    let outcome = match result {
        Ok(Ok(summary)) => {
            let meta = CaptureMeta {
                id: String::new(),
                created_unix_ms: c.started_unix_ms,
                trigger: c.trigger.clone(),
                duration_ms: summary.wall_monotonic_ns / 1_000_000,
                trace_bytes: 0,
                status: if summary.cut_at_max_bytes {
                    format!(
                        "cut: reached store.max_capture_bytes ({} bytes)",
                        summary.bytes_written
                    )
                } else {
                    how.into()
                },
                heapprofd: None,
            };
            match store.commit(pending, meta) {
                Ok(m) => {
                    log::info!("capture {} stored ({} bytes)", m.id, m.trace_bytes);
                    format!("captured {}", m.id)
                }
                Err(e) => {
                    log::error!("capture could not be stored: {e}");
                    format!("failed: {e}")
                }
            }
        }
        Ok(Err(e)) => {
            log::error!("capture failed: {e}");
            // Whatever whole packets reached the disk are still worth keeping.
            let meta = CaptureMeta {
                id: String::new(),
                created_unix_ms: c.started_unix_ms,
                trigger: c.trigger.clone(),
                duration_ms: store::now_unix_ms().saturating_sub(c.started_unix_ms),
                trace_bytes: 0,
                status: format!("cut short: {e}"),
                heapprofd: None,
            };
            if pending.tmp_path.exists() {
                match store.commit(pending, meta) {
                    Ok(m) => format!("captured {} (cut short: {e})", m.id),
                    Err(e2) => format!("failed: {e}; {e2}"),
                }
            } else {
                store.abort(pending);
                format!("failed: {e}")
            }
        }
        Err(_) => {
            store.abort(pending);
            "failed: capture thread panicked".into()
        }
    };
    drop(store);
    let mut st = shared.state.lock().unwrap();
    st.capture = None;
    push_trigger(&mut st, &c.trigger, c.started_unix_ms, outcome);
}

impl Service {
    /// Stores the capture whose thread has ended.
    pub(super) fn reap_capture(&mut self) {
        if self
            .capture
            .as_ref()
            .is_some_and(|c| c.thread.is_finished())
        {
            let c = self.capture.take().unwrap();
            finish_capture(c, &self.store, &self.shared, "complete");
        }
    }
}
