//! The sampling tick: its schedule, the always-on sample (one tick of the
//! pipeline) into the history, the store's periodic expiry, and what the tick
//! publishes for the control socket.

use std::{
    collections::BTreeMap,
    sync::atomic::Ordering,
    time::{Duration, Instant},
};

use super::Service;
use crate::{control::protocol::TopRow, history};

/// Samples lost to read errors, and the current streaks (for logging once).
#[derive(Default)]
pub(super) struct ReadErrors {
    bpf: u64,
    bpf_streak: u64,
    procfs: u64,
    procfs_streak: u64,
}

/// What one tick's sample hands to the publishing step.
pub(super) struct Sampled {
    /// Whether this tick has a procfs window (the scan failed, or was the
    /// first: none).
    window: bool,
    /// The working processes by CPU, for `top`.
    top: Vec<TopRow>,
    /// How long their per-task figures cover (`Tick::deltas_window_ns`).
    top_window_ns: Option<u64>,
}

impl Service {
    /// Sleeps until the next tick unless stopping; signals unpark the main
    /// thread.
    pub(super) fn wait_for_tick(&self) {
        let now = Instant::now();
        if !self.signals.stop.load(Ordering::SeqCst) && now < self.next_tick {
            // Signals unpark us; control commands wait at most one interval.
            std::thread::park_timeout(self.next_tick - now);
        }
    }

    /// Whether this iteration samples; if so the next tick is scheduled.
    pub(super) fn tick_due(&mut self) -> bool {
        if Instant::now() < self.next_tick {
            return false;
        }
        self.next_tick += self.cfg.sampling.interval.0;
        if self.next_tick < Instant::now() {
            // Overran (suspend, a stall): resynchronise instead of bursting.
            self.next_tick = Instant::now() + self.cfg.sampling.interval.0;
        }
        true
    }

    /// Always-on sample: one tick of the pipeline, handed to a running
    /// capture's recording, the history, top and the producer.
    /// A failed read costs this sample, never the daemon: counted and
    /// logged (once per streak), and the next tick tries again.
    pub(super) fn sample(&mut self) -> Sampled {
        let tick = self.pipeline.tick();
        let (bpf_error, procfs_error) = (tick.bpf_error.take(), tick.procfs_error.take());
        // A recording fails on the tick's first failed read, as one that
        // read for itself did.
        let failed = bpf_error
            .as_ref()
            .map(ToString::to_string)
            .or_else(|| procfs_error.as_ref().map(ToString::to_string));
        self.count_read_errors(bpf_error, procfs_error);
        self.feed_capture(failed);
        let tick = self.pipeline.last();
        let mut top = Vec::new();
        if let Some(sample) = history::summarize(
            tick,
            self.pipeline.sources.each(),
            self.cfg.sampling.history_processes,
            &self.engine.watched_processes(),
        ) {
            self.history.push(sample);
            top = self.pipeline.top_rows();
        }
        self.feed_producer();
        Sampled {
            window: tick.window.is_some(),
            top,
            top_window_ns: tick.deltas_window_ns,
        }
    }

    /// Counts this tick's failed reads, logging the first of a streak.
    fn count_read_errors(
        &mut self,
        bpf: Option<crate::bpf::BpfError>,
        procfs: Option<crate::procfs::SamplerError>,
    ) {
        let r = &mut self.read_errors;
        match bpf {
            Some(e) => {
                r.bpf += 1;
                r.bpf_streak += 1;
                if r.bpf_streak == 1 {
                    log::error!("reading the eBPF maps: {e}; skipping this sample");
                }
            }
            None => r.bpf_streak = 0,
        }
        match procfs {
            Some(e) => {
                r.procfs += 1;
                r.procfs_streak += 1;
                if r.procfs_streak == 1 {
                    log::error!("sampling procfs: {e}; skipping this sample");
                }
            }
            None => r.procfs_streak = 0,
        }
    }

    /// Applies the store's age limit and cleans stale heapprofd output
    /// once a minute.
    pub(super) fn expire_store(&mut self) {
        if self.last_expiry.elapsed() > Duration::from_secs(60) {
            self.last_expiry = Instant::now();
            if let Err(e) = self.store.lock().unwrap().maintain() {
                log::warn!("store maintenance: {e}");
            }
        }
    }

    /// Publish for the control socket.
    pub(super) fn publish(&self, sampled: Sampled) {
        let mut st = self.shared.state.lock().unwrap();
        st.samples += 1;
        st.history_samples = self.history.len();
        let mut status = self.pipeline.status();
        if let (true, Some(w)) = (sampled.window, &self.pipeline.last().window) {
            st.top = sampled.top;
            st.top_window_ms = sampled.top_window_ns.map(|ns| ns as f64 / 1e6);
            st.local_busy_pct = w.system.as_ref().map(|s| s.local_busy_pct);
            st.loadavg = w.loadavg.as_ref().map(|l| [l.load1, l.load5, l.load15]);
            st.procfs_drops = status.remove("procfs_drops").unwrap_or_default();
        }
        st.sample_errors = BTreeMap::from([
            ("bpf_map_reads".to_string(), self.read_errors.bpf),
            ("procfs_scans".to_string(), self.read_errors.procfs),
        ]);
        if let Some(counters) = status.remove("sched_procfs") {
            st.sched_procfs = counters;
        }
        // /proc-only: no eBPF drop counters, rather than zeros.
        if let Some(drops) = status.remove("bpf_drops") {
            st.bpf_drops = drops;
        }
        st.offcpu = status.remove("offcpu").unwrap_or_default();
        st.offcpu_wakers = status.remove("offcpu_wakers").unwrap_or_default();
        (st.producer, st.producer_error) = self.producer_status();
        st.triggers_fired = self.engine.fired_total;
        st.triggers_skipped = self
            .engine
            .skipped
            .iter()
            .map(|(k, v)| (k.name().to_string(), *v))
            .collect();
        st.manual_refused = self
            .engine
            .manual_refused
            .iter()
            .map(|(k, v)| (k.name().to_string(), *v))
            .collect();
    }
}
