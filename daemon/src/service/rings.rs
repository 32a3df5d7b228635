//! Rules' preludes (`capture.prelude = "ring"`, on a backend with
//! `ring_prelude`: Perfetto's, the one whose sessions they are): one
//! ring-buffer Perfetto session per such rule, kept running between fires
//! and restarted when it ends (its trigger timeout, an error); when the
//! rule fires, its trigger stops it and the session becomes the capture
//! (`perfetto_capture::ring`).

use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use super::{
    recordings::{adopt_session, window},
    Service,
};
use crate::{
    config::{Prelude, RecordingSpec},
    perfetto_capture::{
        self,
        backend::{capture_request, failed, recorded, NAME},
        ring,
    },
    recording_backend::{Recorded, RecordingFailed, Running},
    store::TriggerInfo,
};

/// After a ring session ended without a fire (its timeout, traced away, a
/// refusal), the next one starts no sooner than this.
const RESTART_AFTER: Duration = Duration::from_secs(10);

/// One rule's ring session.
struct RunningRing {
    out: PathBuf,
    stop: Arc<AtomicBool>,
    /// None once handed over as a capture.
    thread: Option<JoinHandle<Result<Recorded, RecordingFailed>>>,
}

impl Drop for RunningRing {
    /// A ring not handed over is not a capture: stopped, its trace removed.
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            self.stop.store(true, Ordering::SeqCst);
            let _ = t.join();
            let _ = std::fs::remove_file(&self.out);
        }
    }
}

/// The ring sessions, by rule.
#[derive(Default)]
pub(super) struct Rings {
    running: HashMap<String, RunningRing>,
    /// When a rule's ring may start again.
    not_before: HashMap<String, Instant>,
}

impl Service {
    /// Each tick: a ring for every rule asking for one while captures run
    /// on a backend with ring preludes (Perfetto); ended rings reaped
    /// (restarted later), rings of rules no longer configured stopped.
    pub(super) fn maintain_rings(&mut self) {
        let perfetto = self.recording_backend().ring_prelude();
        let wanted: Vec<(String, RecordingSpec)> = self
            .cfg
            .rules
            .iter()
            .filter(|r| perfetto && r.capture.prelude == Prelude::Ring)
            .map(|r| (r.name.clone(), r.capture.clone()))
            .collect();
        let rings = &mut self.rings;
        rings
            .running
            .retain(|rule, _| wanted.iter().any(|(w, _)| w == rule));
        let ended: Vec<String> = rings
            .running
            .iter()
            .filter(|(_, r)| r.thread.as_ref().is_some_and(|t| t.is_finished()))
            .map(|(rule, _)| rule.clone())
            .collect();
        for rule in ended {
            let mut r = rings.running.remove(&rule).unwrap();
            match r.thread.take().map(|t| t.join()) {
                Some(Ok(Err(e))) => log::info!("rule {rule}: ring session ended: {e}"),
                _ => log::info!("rule {rule}: ring session ended"),
            }
            let _ = std::fs::remove_file(&r.out);
            rings
                .not_before
                .insert(rule, Instant::now() + RESTART_AFTER);
        }
        let capturing = self.capture.as_ref().map(|c| c.trigger_rule().to_owned());
        for (rule, spec) in wanted {
            let rings = &self.rings;
            let due = rings
                .not_before
                .get(&rule)
                .is_none_or(|t| Instant::now() >= *t);
            if rings.running.contains_key(&rule) || !due || capturing.as_deref() == Some(&rule) {
                continue;
            }
            let ring = start_ring(self, &rule, &spec);
            self.rings.running.insert(rule, ring);
        }
    }

    /// `rule` fired: its ring, triggered, becomes the capture; false when
    /// it has none running (the caller starts a capture as usual).
    pub(super) fn capture_from_ring(
        &mut self,
        rule: &str,
        spec: &RecordingSpec,
        trigger: &TriggerInfo,
    ) -> bool {
        let Some(mut r) = self.rings.running.remove(rule) else {
            return false;
        };
        let name = ring::trigger_name(rule);
        if let Err(e) = ring::activate(self.runner.config(), &name) {
            log::warn!("rule {rule}: activating {name}: {e}; capturing without the prelude");
            return false;
        }
        log::info!("rule {rule}: trigger {name} activated");
        let thread = r.thread.take().expect("a running ring");
        let running = Running {
            stop: Arc::clone(&r.stop),
            ticks: None,
            session_out: Some(r.out.clone()),
            thread,
        };
        self.capture = Some(adopt_session(
            &self.store,
            &self.shared,
            spec,
            trigger.clone(),
            NAME,
            running,
        ));
        true
    }
}

/// How long a ring session may run: until its trigger timeout, then the
/// capture's longest duration.
pub(super) fn longest_session() -> Duration {
    ring::TRIGGER_TIMEOUT + crate::config::MAX_CAPTURE_DURATION
}

fn start_ring(svc: &Service, rule: &str, spec: &RecordingSpec) -> RunningRing {
    let req = capture_request(window(&svc.cfg, spec, None, &[]));
    let config = ring::ring_config(&req, rule);
    let session_ms = ring::session_ms(&req);
    let dir = svc.store.lock().unwrap().heapprofd_dir();
    if let Err(e) = std::fs::create_dir_all(&dir) {
        log::error!("creating {}: {e}", dir.display());
    }
    let out = dir.join(format!("ring-{}.pftrace", ring::session_name(rule)));
    let stop = Arc::new(AtomicBool::new(false));
    let (runner, thread_out, thread_stop) =
        (svc.runner.config().clone(), out.clone(), Arc::clone(&stop));
    log::info!(
        "rule {rule}: ring session started (trigger {})",
        ring::trigger_name(rule)
    );
    let thread = std::thread::Builder::new()
        .name("ring".into())
        .spawn(move || {
            let s = perfetto_capture::run_session(
                &runner,
                &req,
                &config,
                session_ms,
                &thread_out,
                &thread_stop,
            )
            .map_err(failed)?;
            Ok(recorded(s))
        })
        .expect("spawning a ring session thread");
    RunningRing {
        out,
        stop,
        thread: Some(thread),
    }
}
