//! The sampling tick: its schedule, the always-on sample (eBPF maps and
//! procfs) into the history, the store's periodic expiry, and what the tick
//! publishes for the control socket.

use std::{
    collections::{BTreeMap, HashMap},
    sync::atomic::Ordering,
    time::{Duration, Instant},
};

use super::Service;
use crate::{
    bpf::totals::ProcessCounters,
    clock::ClockPair,
    control::protocol::{TopEbpf, TopRow},
    history,
    tracker::{bpf_deltas, BpfDelta, Window},
};

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
    /// None when the procfs scan failed (or was the first one).
    window: Option<Window>,
    /// The working processes by CPU, for `top`.
    top: Vec<TopRow>,
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

    /// Always-on sample.
    /// A failed read costs this sample, never the daemon: counted and
    /// logged (once per streak), and the next tick tries again.
    pub(super) fn sample(&mut self) -> Sampled {
        let (mut bpf_window, mut rows, mut ts_boot_ns) = self.read_bpf();
        let (scanned, window) = self.read_procfs();
        // The CTS tier: per-task counters from this scan's schedstat.
        if let (Some(sched), true) = (self.sched.as_mut(), scanned) {
            rows = sched.update(&self.sample);
            ts_boot_ns = self.sample.clock.map_or(ts_boot_ns, |c| c.boottime_ns);
            bpf_window = bpf_deltas(&mut self.bpf_prev, &rows, &mut self.bpf_delta_drops)
                .into_iter()
                .map(|d| (d.tgid, d))
                .collect();
        }
        let mut top = Vec::new();
        if let Some(w) = &window {
            self.history.push(history::summarize(
                w,
                self.cfg.sampling.history_processes,
                &self.engine.watched_processes(),
                &bpf_window,
            ));
            top = top_rows(w, &bpf_window);
        }
        self.feed_producer(ts_boot_ns, rows, scanned);
        Sampled { window, top }
    }

    /// This window's eBPF deltas by tgid, every process's cumulative
    /// counters and when (CLOCK_BOOTTIME) they were read; empty when the
    /// maps could not be read, or there are none (/proc-only).
    pub(super) fn read_bpf(&mut self) -> (HashMap<u32, BpfDelta>, Vec<ProcessCounters>, u64) {
        let mut bpf_window: HashMap<u32, BpfDelta> = HashMap::new();
        let mut rows = Vec::new();
        // /proc-only: no eBPF maps, so no deltas and no rows.
        let Some(accounting) = self.accounting.as_ref() else {
            return (bpf_window, rows, ClockPair::now().boottime_ns);
        };
        let snap = accounting.read();
        let ts_boot_ns = ClockPair::now().boottime_ns;
        match snap {
            // Folding drains the EXITED map and keeps the drop counters current.
            Ok(snap) => {
                rows = self.totals.update(&snap);
                bpf_window = bpf_deltas(&mut self.bpf_prev, &rows, &mut self.bpf_delta_drops)
                    .into_iter()
                    .map(|d| (d.tgid, d))
                    .collect();
                self.read_errors.bpf_streak = 0;
            }
            Err(e) => {
                self.read_errors.bpf += 1;
                self.read_errors.bpf_streak += 1;
                if self.read_errors.bpf_streak == 1 {
                    log::error!("reading the eBPF maps: {e}; skipping this sample");
                }
            }
        }
        (bpf_window, rows, ts_boot_ns)
    }

    /// Whether the scan succeeded, and this window from procfs (None when
    /// the scan failed or was the first).
    pub(super) fn read_procfs(&mut self) -> (bool, Option<Window>) {
        match self.sampler.sample_into(&mut self.sample) {
            Ok(()) => {
                self.read_errors.procfs_streak = 0;
                (true, self.tracker.update(&self.sample))
            }
            Err(e) => {
                self.read_errors.procfs += 1;
                self.read_errors.procfs_streak += 1;
                if self.read_errors.procfs_streak == 1 {
                    log::error!("sampling procfs: {e}; skipping this sample");
                }
                (false, None)
            }
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
        if let Some(w) = &sampled.window {
            st.top = sampled.top;
            st.local_busy_pct = w.system.as_ref().map(|s| s.local_busy_pct);
            st.loadavg = w.loadavg.as_ref().map(|l| [l.load1, l.load5, l.load15]);
            let d = self.tracker.drop_totals();
            st.procfs_drops = BTreeMap::from([
                ("read_failures".into(), d.read_failures),
                ("vanished_pids".into(), d.vanished_pids),
                ("vanished_tids".into(), d.vanished_tids),
                ("negative_deltas".into(), d.negative_deltas),
                ("clock_not_advancing".into(), d.clock_not_advancing),
                ("starttime_changes".into(), d.starttime_changes),
            ]);
        }
        st.sample_errors = BTreeMap::from([
            ("bpf_map_reads".to_string(), self.read_errors.bpf),
            ("procfs_scans".to_string(), self.read_errors.procfs),
        ]);
        if let Some(sched) = &self.sched {
            st.sched_procfs = sched.stats.counters();
        }
        // /proc-only: no eBPF drop counters, rather than zeros.
        if self.accounting.is_some() {
            st.bpf_drops = vitals_common::drop_reason::NAMES
                .iter()
                .zip(self.totals.drops)
                .map(|(n, v)| (n.to_string(), v))
                .collect();
            st.bpf_drops.insert(
                "negative_deltas".into(),
                self.bpf_delta_drops.negative_deltas,
            );
            // Threads seen alive whose exit record never came (EXITED
            // full): folded into their process from their last counters.
            st.bpf_drops
                .insert("lost_exits".into(), self.totals.lost_exits);
        }
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

/// The 50 working processes using the most CPU this window.
fn top_rows(w: &Window, bpf_window: &HashMap<u32, BpfDelta>) -> Vec<TopRow> {
    // Ns accounting (either tier): a process that ran at all is listed,
    // not only one charged a clock tick (ProcessCpuTracker's working set,
    // which leaves a quiet machine's top empty), ordered by its ns.
    let oncpu_ns =
        |p: &crate::tracker::TaskWindow| bpf_window.get(&(p.pid as u32)).map_or(0, |d| d.oncpu_ns);
    let mut procs: Vec<&crate::tracker::TaskWindow> = w
        .processes
        .iter()
        .filter(|p| p.working || oncpu_ns(p) > 0)
        .collect();
    procs.sort_by(|a, b| {
        oncpu_ns(b).cmp(&oncpu_ns(a)).then(
            b.core_equivalent_pct
                .unwrap_or(0.0)
                .total_cmp(&a.core_equivalent_pct.unwrap_or(0.0)),
        )
    });
    procs
        .iter()
        .take(50)
        .map(|p| TopRow {
            pid: p.pid,
            name: p.name(),
            core_equivalent_pct: p.core_equivalent_pct.unwrap_or(0.0),
            machine_share_pct: p.machine_share_pct.unwrap_or(0.0),
            minflt: p.delta.map(|d| d.minflt).unwrap_or(0),
            majflt: p.delta.map(|d| d.majflt).unwrap_or(0),
            rss_kb: p.status.as_ref().and_then(|s| s.vm_rss_kb),
            ebpf: bpf_window.get(&(p.pid as u32)).map(|d| TopEbpf {
                oncpu_ms: d.oncpu_ns as f64 / 1e6,
                runq_wait_ms: d.runq_wait_ns as f64 / 1e6,
                voluntary_switches: d.voluntary_switches,
                involuntary_switches: d.involuntary_switches,
            }),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::top_rows;
    use crate::tracker::{quiet_process_window, BpfDelta};

    /// A process charged no clock tick that still ran (ns accounting of
    /// either tier says 3 ms) is in top; ProcessCpuTracker's working set
    /// alone left a quiet machine's top empty (#23).
    #[test]
    fn top_lists_a_process_that_ran_without_a_tick() {
        let w = quiet_process_window(42);
        assert!(top_rows(&w, &HashMap::new()).is_empty());
        let ran = HashMap::from([(
            42,
            BpfDelta {
                tgid: 42,
                oncpu_ns: 3_000_000,
                voluntary_switches: 40,
                ..Default::default()
            },
        )]);
        let rows = top_rows(&w, &ran);
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].pid, 42);
        assert_eq!(rows[0].ebpf.as_ref().unwrap().voluntary_switches, 40);
    }
}
