//! What the daemon does on the signals the binary forwards: on stop it
//! cuts the running capture and heap session and stores them; on reload
//! (SIGHUP) it re-reads the config file and applies what can change while
//! running.

use std::sync::{
    atomic::{AtomicBool, Ordering},
    Arc,
};

use super::{
    captures::finish_capture,
    configure_store,
    heap::{finish_heap, heap_runner},
    Service,
};
use crate::config::Config;

/// Signals the binary forwards: stop and reload.
#[derive(Clone, Default)]
pub struct Signals {
    pub stop: Arc<AtomicBool>,
    pub reload: Arc<AtomicBool>,
}

impl Service {
    /// Stop: cut the running capture at a packet boundary and let the heap
    /// session flush, storing both, before `run` returns.
    pub(super) fn shutdown(&mut self) {
        if let Some(c) = self.capture.take() {
            log::info!(
                "stopping: cutting capture {} at a packet boundary",
                c.pending.id
            );
            c.stop.store(true, Ordering::SeqCst);
            c.thread.thread().unpark();
            finish_capture(c, &self.store, &self.shared, "stopped by daemon shutdown");
        }
        if let Some(h) = self.heap.take() {
            // SIGTERM makes the client stop the session and flush.
            h.stop.store(true, Ordering::SeqCst);
            finish_heap(h, &self.store, &self.shared);
        }
        log::info!("vitalsd stopped");
    }

    /// Reload (SIGHUP): re-reads the config file; a config that does not
    /// load leaves the running one in place.
    pub(super) fn reload_if_asked(&mut self) {
        if !self.signals.reload.swap(false, Ordering::SeqCst) {
            return;
        }
        match Config::load(&self.config_path) {
            Ok(new) => self.apply_config(new),
            Err(e) => {
                log::error!("config reload failed, keeping the running config: {e}");
                self.shared.state.lock().unwrap().last_reload_error = Some(e.to_string());
            }
        }
    }

    /// What a reload can change while running: the rules, the history's
    /// length, the store's limits, the control socket's limits and the
    /// heapprofd runner (when no session uses it).
    pub(super) fn apply_config(&mut self, new: Config) {
        let cfg = &self.cfg;
        log::info!("config reloaded from {}", self.config_path.display());
        if new.sampling.fault_source != cfg.sampling.fault_source
            || new.sampling.max_tasks != cfg.sampling.max_tasks
            || new.sampling.exits_per_second != cfg.sampling.exits_per_second
            || new.sampling.runq_wait != cfg.sampling.runq_wait
            || new.sampling.classic_tracepoints != cfg.sampling.classic_tracepoints
            || new.capture != cfg.capture
            || new.store.dir != cfg.store.dir
            || new.control.socket != cfg.control.socket
        {
            log::warn!("eBPF, store dir and socket settings take effect at the next start");
        }
        self.engine.reconfigure(
            new.rules.clone(),
            new.budget.clone(),
            new.conditions.clone(),
        );
        self.history.set_capacity(new.history_len());
        configure_store(&mut self.store.lock().unwrap(), &new);
        *self.shared.allowed_uids.lock().unwrap() = new.control.allowed_uids.clone();
        self.shared
            .max_request_bytes
            .store(u64::from(new.control.max_request_bytes), Ordering::Relaxed);
        let mut st = self.shared.state.lock().unwrap();
        st.config_toml = new.to_toml();
        st.interval_ms = new.sampling.interval.0.as_millis() as u64;
        st.last_reload_error = None;
        drop(st);
        self.cfg = new;
        if self.heap.is_none() {
            self.runner = Arc::new(heap_runner(&self.cfg));
        }
    }
}
