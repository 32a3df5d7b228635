//! The heap lifecycle: a heapprofd session started by hand (`vitalsd heap`)
//! or by a rule for its offender, run through the perfetto client on its own
//! thread, and stored with its outcome when it ends.

use std::{
    path::PathBuf,
    sync::{atomic::AtomicBool, Arc, Mutex},
    thread::JoinHandle,
    time::Duration,
};

use super::{push_trigger, state::Shared, Service};
use crate::{
    config::Config,
    control::protocol::{RecordingProgress, TriggerOutcome},
    heapprofd::in_session::HeapInSession,
    heapprofd::{
        HeapProfileRequest, RateLimiter, RateLimits, RequestLimits, RunError, RunnerConfig,
        SessionReport, SessionRunner,
    },
    store::{self, EntryMeta, EntryStatus, Pending, Store, TriggerInfo},
    triggers::Fired,
};

/// A heapprofd session running through the perfetto client.
pub(super) struct RunningHeap {
    pub(super) pending: Pending,
    /// Where the perfetto client writes (under <store>/heapprofd/).
    out: PathBuf,
    trigger: TriggerInfo,
    started_unix_ms: u64,
    pub(super) stop: Arc<AtomicBool>,
    pub(super) thread: JoinHandle<Result<SessionReport, RunError>>,
}

pub(super) fn heap_runner(cfg: &Config) -> SessionRunner {
    let h = &cfg.heapprofd;
    let limits = RateLimits {
        system_per_hour: h.system_per_hour,
        system_per_day: h.system_per_day,
        target_per_hour: h.target_per_hour,
        target_per_day: h.target_per_day,
    };
    // Under state/, not the store's top level, whose *.json are capture
    // metadata (and orphans are removed at start).
    let state = cfg.store.dir.join("state/heapprofd_ratelimit.json");
    if let Some(dir) = state.parent() {
        if let Err(e) = std::fs::create_dir_all(dir) {
            log::error!("creating {}: {e}", dir.display());
        }
    }
    let limiter = RateLimiter::load(&state, limits).unwrap_or_else(|e| {
        log::error!("heapprofd rate-limit state: {e}; starting a fresh history");
        RateLimiter::empty(&state, limits)
    });
    SessionRunner::new(
        RunnerConfig {
            consumer: h.consumer,
            perfetto_bin: h.perfetto_bin.clone(),
            limits: RequestLimits {
                max_duration_ms: h.max_duration.0.as_millis().min(u128::from(u32::MAX)) as u32,
            },
            ..RunnerConfig::default()
        },
        limiter,
    )
}

pub(super) fn heap_request(
    cfg: &Config,
    name: Option<String>,
    pid: Option<u64>,
    duration: Duration,
    installers: Vec<String>,
) -> HeapProfileRequest {
    HeapProfileRequest {
        process_names: name.into_iter().collect(),
        pids: pid.into_iter().collect(),
        duration_ms: duration.as_millis().min(u128::from(u32::MAX)) as u32,
        sampling_interval_bytes: cfg.heapprofd.sampling_interval_bytes,
        target_installed_by: installers,
        ..HeapProfileRequest::default()
    }
}

/// Starts a heapprofd session into the store; Err if it cannot start.
pub(super) fn start_heap(
    runner: &Arc<SessionRunner>,
    store: &Arc<Mutex<Store>>,
    request: HeapProfileRequest,
    trigger: TriggerInfo,
    shared: &Shared,
) -> Result<RunningHeap, String> {
    if runner.is_busy() {
        return Err("a heapprofd session is already running (one at a time)".into());
    }
    for w in request.normalisation_warnings() {
        log::warn!("{w}");
    }
    request
        .validate(&runner.config().limits)
        .map_err(|e| format!("heap profile request: {e}"))?;
    let label = format!(
        "heap-{}",
        request
            .process_names
            .first()
            .cloned()
            .unwrap_or_else(|| "pid".into())
    );
    let (pending, out) = {
        let mut store = store.lock().unwrap();
        let pending = store.begin(&label);
        // perfetto writes into heapprofd/, the one directory the policy
        // lets its domain write (sepolicy: vitalsd_heapprofd_data_file);
        // the trace moves into the store when the session ends.
        let dir = store.heapprofd_dir();
        if let Err(e) = std::fs::create_dir_all(&dir) {
            return Err(format!("creating {}: {e}", dir.display()));
        }
        let out = dir.join(format!("{}.pftrace", pending.id));
        (pending, out)
    };
    let stop = Arc::new(AtomicBool::new(false));
    let (r, thread_stop) = (Arc::clone(runner), Arc::clone(&stop));
    let session_out = out.clone();
    let started_unix_ms = store::now_unix_ms();
    shared.state.lock().unwrap().heap_session = Some(RecordingProgress {
        id: pending.id.clone(),
        rule: trigger.rule.clone(),
        started_unix_ms,
        duration_ms: u64::from(request.duration_ms),
        backend: String::new(),
    });
    log::info!(
        "heapprofd session {} started for {:?} {:?}",
        pending.id,
        request.process_names,
        request.pids
    );
    let thread = std::thread::Builder::new()
        .name("heapprofd".into())
        .spawn(move || r.run(&request, &session_out, &thread_stop))
        .map_err(|e| format!("spawning the heapprofd thread: {e}"))?;
    Ok(RunningHeap {
        pending,
        out,
        trigger,
        started_unix_ms,
        stop,
        thread,
    })
}

/// Stores a finished heapprofd session with its outcome; never fatal.
pub(super) fn finish_heap(h: RunningHeap, store: &Arc<Mutex<Store>>, shared: &Shared) {
    let result = h.thread.join();
    // The runner's own sidecar: its content goes into the capture metadata.
    let _ = std::fs::remove_file(crate::heapprofd::metadata_path(&h.out));
    if h.out.exists() {
        if let Err(e) = std::fs::rename(&h.out, &h.pending.tmp_path) {
            log::error!("moving {} into the store: {e}", h.out.display());
        }
    }
    // The scan that cuts the trace to whole packets reads the file: do it
    // before taking the lock the control socket also needs (commit redoes
    // and reports whatever failed here).
    let mut pending = h.pending;
    let _ = pending.seal();
    let mut store = store.lock().unwrap();
    let outcome = match result {
        Ok(Ok(report)) => {
            let ok = report.success();
            let status = if ok {
                EntryStatus::Complete
            } else {
                EntryStatus::HeapprofdIncomplete {
                    session: serde_json::to_string(&report.status).unwrap_or_default(),
                }
            };
            let meta = EntryMeta {
                id: String::new(),
                created_unix_ms: h.started_unix_ms,
                trigger: h.trigger.clone(),
                duration_ms: report.ended_unix_ms.saturating_sub(report.started_unix_ms),
                trace_bytes: 0,
                status,
                heapprofd: serde_json::to_value(&report).ok(),
                backend: None,
            };
            if pending.tmp_path.exists() {
                match store.commit(pending, meta) {
                    Ok(m) => TriggerOutcome::HeapProfile {
                        id: m.id,
                        usable: ok,
                    },
                    Err(e) => TriggerOutcome::HeapNotStored { why: e.to_string() },
                }
            } else {
                store.abort(pending);
                // Refused, traced down, client failed: say which.
                let why = report.status.problem().unwrap_or_else(|| {
                    report
                        .outcome_error
                        .clone()
                        .unwrap_or_else(|| "client wrote nothing".into())
                });
                TriggerOutcome::HeapNotStored { why }
            }
        }
        Ok(Err(e)) => {
            store.abort(pending);
            TriggerOutcome::HeapRefused {
                error: e.to_string(),
            }
        }
        Err(_) => {
            store.abort(pending);
            TriggerOutcome::HeapFailed {
                why: "thread panicked".into(),
            }
        }
    };
    log::info!("{outcome}");
    drop(store);
    let mut st = shared.state.lock().unwrap();
    st.heap_session = None;
    push_trigger(&mut st, &h.trigger, h.started_unix_ms, outcome);
}

/// A rule asked for a heap profile: the request for its offender, only
/// when the offender's name is on the rule's allowlist (installers are
/// checked by heapprofd itself through target_installed_by).
fn offender_request(fired: &Fired, cfg: &Config) -> Option<HeapProfileRequest> {
    let spec = &fired.capture;
    let Some(o) = &fired.offender else {
        log::info!("rule {}: no offending process to heap-profile", fired.rule);
        return None;
    };
    if !spec.heap_allowlist.iter().any(|a| a == &o.name) {
        log::info!(
            "rule {}: {} is not on the heap-profile allowlist",
            fired.rule,
            o.name
        );
        return None;
    }
    Some(heap_request(
        cfg,
        None,
        Some(o.pid as u64),
        spec.duration.0,
        spec.heap_installers.clone(),
    ))
}

/// Records that a rule's heap profile did not start, and why.
fn heap_not_started(shared: &Shared, fired: &Fired, trigger: &TriggerInfo, e: &str) {
    log::warn!("rule {}: heap profile not started: {e}", fired.rule);
    let mut st = shared.state.lock().unwrap();
    push_trigger(
        &mut st,
        trigger,
        store::now_unix_ms(),
        TriggerOutcome::HeapNotStarted { error: e.into() },
    );
}

/// A rule asked for a heap profile: its offender's, in a heapprofd session
/// of its own (beside an eBPF capture).
pub(super) fn heap_profile_offender(
    fired: &Fired,
    cfg: &Config,
    runner: &Arc<SessionRunner>,
    store: &Arc<Mutex<Store>>,
    shared: &Shared,
    trigger: &TriggerInfo,
    heap: &mut Option<RunningHeap>,
) {
    let Some(request) = offender_request(fired, cfg) else {
        return;
    };
    if heap.is_some() {
        log::info!(
            "rule {}: heap profile skipped, a session is running",
            fired.rule
        );
        return;
    }
    match start_heap(runner, store, request, trigger.clone(), shared) {
        Ok(h) => *heap = Some(h),
        Err(e) => heap_not_started(shared, fired, trigger, &e),
    }
}

/// A rule asked for a heap profile and its capture is a Perfetto session:
/// heapprofd joins that session (validated and charged to the rate limits
/// here), so one trace holds the timeline and the profile.
pub(super) fn heap_in_capture(
    fired: &Fired,
    cfg: &Config,
    runner: &SessionRunner,
    shared: &Shared,
    trigger: &TriggerInfo,
    running: bool,
) -> Option<HeapInSession> {
    let request = offender_request(fired, cfg)?;
    if running {
        log::info!(
            "rule {}: heap profile skipped, a session is running",
            fired.rule
        );
        return None;
    }
    match runner.admit(&request) {
        Ok(config) => HeapInSession::new(request, &config),
        Err(e) => {
            heap_not_started(shared, fired, trigger, &e.to_string());
            None
        }
    }
}

impl Service {
    /// Stores the heapprofd session whose thread has ended.
    pub(super) fn reap_heap(&mut self) {
        if self.heap.as_ref().is_some_and(|h| h.thread.is_finished()) {
            finish_heap(self.heap.take().unwrap(), &self.store, &self.shared);
        }
    }
}
