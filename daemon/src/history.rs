//! The last N minutes of vitals in memory, with a fixed bound: one compact
//! summary per sampling interval, each holding a bounded number of
//! processes. What the health rules look at, and what a capture's trace
//! starts with (the minutes that led to the trigger).

use std::{collections::VecDeque, sync::Arc};

use crate::sources::tasks::{TaskWindow, Window};

#[derive(Debug, Clone, PartialEq)]
pub struct ProcessVitals {
    pub pid: i32,
    pub starttime_ticks: u64,
    pub name: Arc<str>,
    /// (Δutime+Δstime)/USER_HZ / Δwall(MONOTONIC), %.
    pub core_equivalent_pct: f64,
    pub majflt_per_s: f64,
    pub rss_kb: Option<u64>,
    /// eBPF on-CPU time and runqueue wait over the window, when known.
    pub ebpf: Option<crate::sources::ebpf::BpfDelta>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct VitalsSample {
    pub boottime_ns: u64,
    pub monotonic_ns: u64,
    /// (user+nice+system+irq+softirq)/total of /proc/stat, %.
    pub local_busy_pct: Option<f64>,
    pub loadavg1: Option<f32>,
    pub online_cpus: u32,
    /// avg10 %, [cpu, memory, io] x [some, full].
    pub psi_avg10: [[Option<f32>; 2]; 3],
    pub processes: Vec<ProcessVitals>,
}

/// Picks what to keep from a tracker window: the `k` busiest processes by
/// CPU, the busiest by major faults and by RSS, and every process whose
/// name a rule watches, so a named rule never loses sight of its target.
pub fn summarize(
    win: &Window,
    k: usize,
    watched: &[String],
    bpf: &std::collections::HashMap<u32, crate::sources::ebpf::BpfDelta>,
) -> VitalsSample {
    let mono_s = win.clocks.monotonic_ns.unwrap_or(0) as f64 / 1e9;
    let majflt_per_s = |p: &TaskWindow| match (&p.delta, mono_s > 0.0) {
        (Some(d), true) => d.majflt as f64 / mono_s,
        _ => 0.0,
    };
    let rss_kb = |p: &TaskWindow| p.status.as_ref().and_then(|s| s.vm_rss_kb);
    let live: Vec<&TaskWindow> = win.processes.iter().filter(|p| !p.removed).collect();
    // Choose by the window's own numbers first; names and the kept rows are
    // built only for the chosen few, not for every process every sample.
    let mut keep = vec![false; live.len()];
    let mut mark_top = |n: usize, key: &dyn Fn(&TaskWindow) -> f64| {
        let mut idx: Vec<usize> = (0..live.len()).collect();
        idx.sort_by(|&a, &b| key(live[b]).total_cmp(&key(live[a])));
        for &i in idx.iter().take(n) {
            if key(live[i]) > 0.0 {
                keep[i] = true;
            }
        }
    };
    // With ns accounting (either tier) a process that ran at all counts,
    // not only one charged a clock tick (ProcessCpuTracker's working set).
    let ns_pct = |p: &TaskWindow| {
        bpf.get(&(p.pid as u32))
            .filter(|_| mono_s > 0.0)
            .map_or(0.0, |d| d.oncpu_ns as f64 / (mono_s * 1e9) * 100.0)
    };
    mark_top(k, &|p| p.core_equivalent_pct.unwrap_or(0.0).max(ns_pct(p)));
    mark_top(k.div_ceil(4), &majflt_per_s);
    mark_top(k.div_ceil(4), &|p| rss_kb(p).unwrap_or(0) as f64);
    for (i, p) in live.iter().enumerate() {
        if watched.iter().any(|w| p.has_name(w)) {
            keep[i] = true;
        }
    }
    let processes = live
        .iter()
        .zip(keep)
        .filter(|(_, k)| *k)
        .map(|(p, _)| ProcessVitals {
            pid: p.pid,
            starttime_ticks: p.starttime_ticks,
            name: Arc::from(p.name().as_str()),
            core_equivalent_pct: p.core_equivalent_pct.unwrap_or(0.0),
            majflt_per_s: majflt_per_s(p),
            rss_kb: rss_kb(p),
            ebpf: bpf.get(&(p.pid as u32)).copied(),
        })
        .collect();
    let psi_avg10 = std::array::from_fn(|i| match &win.pressure[i] {
        Some(crate::procfs::PsiState::Available(p)) => {
            [Some(p.some.avg10_pct), p.full.as_ref().map(|f| f.avg10_pct)]
        }
        _ => [None, None],
    });
    VitalsSample {
        boottime_ns: win.clocks.end.boottime_ns,
        monotonic_ns: win.clocks.end.monotonic_ns,
        local_busy_pct: win.system.as_ref().map(|s| s.local_busy_pct),
        loadavg1: win.loadavg.as_ref().map(|l| l.load1),
        online_cpus: win
            .system
            .as_ref()
            .map(|s| s.online_cpus.len() as u32)
            .unwrap_or(0),
        psi_avg10,
        processes,
    }
}

/// A ring of the last `capacity` samples.
#[derive(Debug)]
pub struct History {
    capacity: usize,
    ring: VecDeque<VitalsSample>,
}

impl History {
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            ring: VecDeque::with_capacity(capacity.max(1)),
        }
    }

    pub fn push(&mut self, s: VitalsSample) {
        if self.ring.len() == self.capacity {
            self.ring.pop_front();
        }
        self.ring.push_back(s);
    }

    pub fn len(&self) -> usize {
        self.ring.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ring.is_empty()
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn latest(&self) -> Option<&VitalsSample> {
        self.ring.back()
    }

    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &VitalsSample> {
        self.ring.iter()
    }

    /// The samples whose end lies within `span_ns` of the newest one.
    pub fn last_span(&self, span_ns: u64) -> Vec<&VitalsSample> {
        let Some(newest) = self.ring.back() else {
            return Vec::new();
        };
        let from = newest.monotonic_ns.saturating_sub(span_ns);
        self.ring
            .iter()
            .filter(|s| s.monotonic_ns >= from)
            .collect()
    }

    /// Shrinks or grows the bound (config reload).
    pub fn set_capacity(&mut self, capacity: usize) {
        self.capacity = capacity.max(1);
        while self.ring.len() > self.capacity {
            self.ring.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub fn sample(mono_s: u64) -> VitalsSample {
        VitalsSample {
            boottime_ns: mono_s * 1_000_000_000,
            monotonic_ns: mono_s * 1_000_000_000,
            local_busy_pct: Some(10.0),
            loadavg1: Some(0.5),
            online_cpus: 2,
            psi_avg10: [[None; 2]; 3],
            processes: Vec::new(),
        }
    }

    /// The rules' inputs keep a process that ran without a clock tick
    /// when ns accounting says it ran (#23: rules were blind to processes
    /// that use little CPU).
    #[test]
    fn a_process_that_ran_without_a_tick_is_kept_for_the_rules() {
        let w = crate::sources::tasks::quiet_process_window(42);
        let none = std::collections::HashMap::new();
        assert!(summarize(&w, 4, &[], &none).processes.is_empty());
        let ran = std::collections::HashMap::from([(
            42,
            crate::sources::ebpf::BpfDelta {
                tgid: 42,
                oncpu_ns: 3_000_000,
                ..Default::default()
            },
        )]);
        let s = summarize(&w, 4, &[], &ran);
        assert_eq!(s.processes.len(), 1);
        assert_eq!(s.processes[0].pid, 42);
    }

    #[test]
    fn ring_is_bounded_and_spans_select_recent() {
        let mut h = History::new(3);
        for i in 1..=5 {
            h.push(sample(i));
        }
        assert_eq!(h.len(), 3);
        assert_eq!(h.iter().next().unwrap().monotonic_ns, 3_000_000_000);
        assert_eq!(h.last_span(1_000_000_000).len(), 2);
        h.set_capacity(1);
        assert_eq!(h.len(), 1);
        assert_eq!(h.latest().unwrap().monotonic_ns, 5_000_000_000);
    }
}
