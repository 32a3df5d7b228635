//! What the daemon does on the signals the binary forwards: on stop it
//! cuts the running capture and heap session and stores them; on reload
//! (SIGHUP) it re-reads the config file and applies what can change while
//! running.

use std::sync::{
    atomic::{AtomicBool, Ordering},
    Arc,
};

use super::{
    configure_store,
    heap::{finish_heap, heap_runner},
    recordings::finish_recording,
    Service,
};
use crate::config::{bounded, Config, MAX_MESSAGE_BYTES};

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
            c.running.stop();
            finish_recording(
                c,
                &self.store,
                &self.shared,
                crate::store::EntryStatus::StoppedByShutdown,
            );
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
                // Bounded: it goes whole into status and dump frames.
                let e = bounded(&e.to_string(), 2 * MAX_MESSAGE_BYTES).into_owned();
                log::error!("config reload failed, keeping the running config: {e}");
                self.shared.state.lock().unwrap().last_reload_error = Some(e);
            }
        }
    }

    /// What a reload can change while running: the rules, the history's
    /// length, the store's limits, the control socket's limits and the
    /// heapprofd runner (when no session uses it).
    pub(super) fn apply_config(&mut self, mut new: Config) {
        log::info!("config reloaded from {}", self.config_path.display());
        if keep_start_only(&mut new, &self.cfg) {
            log::warn!(
                "accounting, eBPF, capture memory, procfs root, store dir and socket settings take \
                 effect at the next start"
            );
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
        // The backend a capture started now would use (it reloads).
        st.capture_backend =
            super::backends::resolve(new.capture.backend, self.pipeline.sources.ebpf.is_some())
                .name()
                .into();
        st.interval_ms = new.sampling.interval.0.as_millis() as u64;
        st.last_reload_error = None;
        drop(st);
        self.cfg = new;
        if self.heap.is_none() {
            self.runner = Arc::new(heap_runner(&self.cfg));
        }
    }
}

/// Puts the running values back into `new` for the settings only start-up
/// reads (the tier and its programs, the procfs root the sampler was made
/// with, the store and the socket), so `vitalsctl config` shows what is in
/// force; true when `new` asked to change any of them.
fn keep_start_only(new: &mut Config, running: &Config) -> bool {
    let (n, r) = (&mut new.sampling, &running.sampling);
    let changed = n.accounting != r.accounting
        || n.proc_root != r.proc_root
        || n.pin_dir != r.pin_dir
        || n.fault_source != r.fault_source
        || n.max_tasks != r.max_tasks
        || n.exits_per_second != r.exits_per_second
        || n.runq_wait != r.runq_wait
        || n.offcpu != r.offcpu
        || n.long_block != r.long_block
        || n.max_waker_pairs != r.max_waker_pairs
        || n.classic_tracepoints != r.classic_tracepoints
        || new.capture.memory() != running.capture.memory()
        || new.store.dir != running.store.dir
        || new.control.socket != running.control.socket
        || new.control.group != running.control.group;
    let n = &mut new.sampling;
    n.accounting = r.accounting;
    n.proc_root = r.proc_root.clone();
    n.pin_dir = r.pin_dir.clone();
    n.fault_source = r.fault_source;
    n.max_tasks = r.max_tasks;
    n.exits_per_second = r.exits_per_second;
    n.runq_wait = r.runq_wait;
    // Frozen in the programs' .rodata and map sizes at load.
    n.offcpu = r.offcpu;
    n.long_block = r.long_block;
    n.max_waker_pairs = r.max_waker_pairs;
    n.classic_tracepoints = r.classic_tracepoints;
    // The capture maps are sized when the programs load; the backend is
    // chosen per capture, so it reloads.
    new.capture.buffer_bytes = running.capture.buffer_bytes;
    new.capture.stack_entries = running.capture.stack_entries;
    new.store.dir = running.store.dir.clone();
    new.control.socket = running.control.socket.clone();
    new.control.group = running.control.group.clone();
    changed
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    /// A reload that asks for another tier, procfs root or socket group
    /// keeps the running ones (start-up alone reads them) and says so.
    #[test]
    fn start_only_settings_keep_their_running_values() {
        let running = Config::parse(Path::new("t.toml"), "").unwrap();
        let mut new = Config::parse(
            Path::new("t.toml"),
            "[sampling]\naccounting = \"proc\"\nproc_root = \"/elsewhere\"\n\
             [control]\ngroup = \"4242\"\n[store]\nquota_bytes = 1048576\n",
        )
        .unwrap();
        assert!(keep_start_only(&mut new, &running));
        assert_eq!(new.sampling.accounting, running.sampling.accounting);
        assert_eq!(new.sampling.proc_root, running.sampling.proc_root);
        assert_eq!(new.control.group, running.control.group);
        assert_eq!(new.store.quota_bytes, 1048576, "reloadable settings apply");
        let mut same = Config::parse(Path::new("t.toml"), "").unwrap();
        assert!(!keep_start_only(&mut same, &running));
    }
}
