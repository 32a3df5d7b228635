//! The last N minutes of vitals in memory, with a fixed bound: one compact
//! summary per sampling interval, each holding a bounded number of
//! processes. What the health rules look at, and what a capture's trace
//! starts with (the minutes that led to the trigger).

use std::{collections::VecDeque, sync::Arc};

use crate::{
    figures::{ProcessFigures, SampleFigures},
    sources::{
        tasks::{majflt_per_s, TaskWindow, Window},
        Source, Tick,
    },
};

/// One kept process: who it is and the figures the rooms offered for it.
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessVitals {
    pub pid: i32,
    pub starttime_ticks: u64,
    pub name: Arc<str>,
    /// By name (`sources::*::figures`): core-equivalent %, major faults/s,
    /// RSS kB today.
    pub figures: ProcessFigures,
}

/// One sampling interval: its clocks, the rooms' system-wide figures and
/// the processes kept.
#[derive(Debug, Clone, PartialEq)]
pub struct VitalsSample {
    pub boottime_ns: u64,
    pub monotonic_ns: u64,
    /// By name: local busy %, loadavg (raw and per CPU), PSI avg10 today.
    pub figures: SampleFigures,
    pub processes: Vec<ProcessVitals>,
}

/// Picks what to keep from a tracker window: the `k` busiest processes by
/// CPU, the busiest by major faults and by RSS, and every process whose
/// name a rule watches, so a named rule never loses sight of its target.
pub fn keep<'w>(
    win: &'w Window,
    k: usize,
    watched: &[String],
    bpf: &std::collections::HashMap<u32, crate::sources::ebpf::BpfDelta>,
) -> Vec<&'w TaskWindow> {
    let mono_s = win.clocks.monotonic_ns.unwrap_or(0) as f64 / 1e9;
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
    mark_top(k.div_ceil(4), &|p| majflt_per_s(win, p));
    mark_top(k.div_ceil(4), &|p| rss_kb(p).unwrap_or(0) as f64);
    for (i, p) in live.iter().enumerate() {
        if watched.iter().any(|w| p.has_name(w)) {
            keep[i] = true;
        }
    }
    live.into_iter()
        .zip(keep)
        .filter_map(|(p, k)| k.then_some(p))
        .collect()
}

/// This tick's history sample (None without a window): the processes
/// [`keep`] chooses, and every room's figures of the window and of each.
pub fn summarize<'r>(
    tick: &Tick,
    rooms: impl Iterator<Item = &'r dyn Source>,
    k: usize,
    watched: &[String],
) -> Option<VitalsSample> {
    let win = tick.window.as_ref()?;
    let rooms: Vec<&dyn Source> = rooms.collect();
    let mut figures = SampleFigures::default();
    for r in &rooms {
        r.figures(tick, &mut figures);
    }
    let processes = keep(win, k, watched, &tick.deltas)
        .into_iter()
        .map(|p| {
            let mut figures = ProcessFigures::default();
            for r in &rooms {
                r.process_figures(tick, p, &mut figures);
            }
            ProcessVitals {
                pid: p.pid,
                starttime_ticks: p.starttime_ticks,
                name: Arc::from(p.name().as_str()),
                figures,
            }
        })
        .collect();
    Some(VitalsSample {
        boottime_ns: win.clocks.end.boottime_ns,
        monotonic_ns: win.clocks.end.monotonic_ns,
        figures,
        processes,
    })
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
            figures: SampleFigures::default(),
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
        assert!(keep(&w, 4, &[], &none).is_empty());
        let ran = std::collections::HashMap::from([(
            42,
            crate::sources::ebpf::BpfDelta {
                tgid: 42,
                oncpu_ns: 3_000_000,
                ..Default::default()
            },
        )]);
        let s = keep(&w, 4, &[], &ran);
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].pid, 42);
    }

    /// Every figure the rule table names (`Metric::watch`) is one a room
    /// offers, with the window's value: a table name that no room offers
    /// would leave its rule silently unable to fire.
    #[test]
    fn the_rule_table_names_figures_the_rooms_offer() {
        use crate::{
            config::{Metric, Watch},
            procfs::{
                testutil::{FakeProc, Task},
                SampleOptions, Sampler,
            },
            sources::tasks::Windows,
        };
        let fake = FakeProc::new();
        let task = |utime| Task {
            pid: 7,
            comm: "busy",
            minflt: 1,
            majflt: 0,
            utime,
            stime: 0,
            starttime: 9,
        };
        let cols = |user| [user, 0, 50, 1000, 10, 0, 5, 0, 0, 0];
        fake.set_stat(cols(100), &[(0, cols(50)), (1, cols(50))]);
        fake.set_process(&task(5));
        let options = SampleOptions {
            status: true,
            cmdline: true,
            ..Default::default()
        };
        let mut sampler = Sampler::new(fake.root(), options);
        let mut windows = Windows::new(100);
        windows.update(&sampler.sample().unwrap());
        std::thread::sleep(std::time::Duration::from_millis(2));
        fake.set_stat(cols(200), &[(0, cols(100)), (1, cols(100))]);
        fake.set_process(&task(6));
        let mut tick = Tick {
            window: windows.update(&sampler.sample().unwrap()),
            rows: vec![crate::accounting::ProcessCounters {
                tgid: 7,
                offcpu: vitals_common::OffcpuCounters {
                    long_blocks: 3,
                    ..Default::default()
                },
                main_thread_long_blocks: 2,
                ..Default::default()
            }],
            ..Default::default()
        };
        let mut offcpu = crate::sources::offcpu::Offcpu::new(None, Default::default());
        offcpu.read(&mut tick);
        let win = tick.window.as_ref().expect("a second scan gives a window");
        let rooms: [&dyn Source; 3] = [&windows.system, &windows.tasks, &offcpu];
        let s = summarize(&tick, rooms.into_iter(), 4, &[]).unwrap();
        let [p] = s.processes.as_slice() else {
            panic!("one process kept: {:?}", s.processes)
        };
        let process = || Some("busy".to_owned());
        let mut metrics = vec![
            Metric::SystemCpuBusyPct,
            Metric::LoadavgPerCpu,
            Metric::ProcessCpuPct { process: process() },
            Metric::MajorFaultRate { process: process() },
            Metric::RssGrowthKb { process: process() },
            Metric::MainThreadLongBlocks { process: process() },
        ];
        for resource in ["cpu", "memory", "io"] {
            for full in [false, true] {
                let resource = resource.into();
                metrics.push(Metric::PsiAvg10 { resource, full });
            }
        }
        for m in &metrics {
            let found = match m.watch().expect("a known metric") {
                Watch::System { figure } => s.figures.get(figure),
                Watch::Held { figure, .. } | Watch::Growth { figure, .. } => p.figures.get(figure),
            };
            assert!(found.is_some(), "{m:?}: no room offers it");
        }
        // The values are the window's, from the fake /proc.
        let get = |m: Metric| match m.watch().unwrap() {
            Watch::System { figure } => s.figures.get(figure).unwrap(),
            Watch::Held { figure, .. } | Watch::Growth { figure, .. } => {
                p.figures.get(figure).unwrap()
            }
        };
        let busy = win.system.as_ref().unwrap().local_busy_pct;
        assert_eq!(get(Metric::SystemCpuBusyPct), busy);
        assert_eq!(
            get(Metric::LoadavgPerCpu),
            1.5 / 2.0,
            "loadavg 1.50, 2 CPUs"
        );
        let core = win.processes[0].core_equivalent_pct.unwrap();
        assert!(core > 0.0);
        assert_eq!(get(Metric::ProcessCpuPct { process: None }), core);
        assert_eq!(get(Metric::RssGrowthKb { process: None }), 2048.0, "VmRSS");
        assert_eq!(
            get(Metric::MainThreadLongBlocks { process: None }),
            2.0,
            "the main thread's, not the process's 3"
        );
        let psi_cpu_some = Metric::PsiAvg10 {
            resource: "cpu".into(),
            full: false,
        };
        assert_eq!(get(psi_cpu_some), 1.0);
        assert_eq!(
            Metric::PsiAvg10 {
                resource: "gpu".into(),
                full: false
            }
            .watch(),
            None
        );
    }

    /// A sample costs no more memory than the hand-built one it replaced
    /// (112 bytes per process, 120 per sample, measured with size_of on
    /// the old layout) once it keeps 5 processes; the default keeps up to
    /// 16 busiest plus 4 by RSS, which alone keeps 4 on any real system.
    #[test]
    fn a_sample_is_no_larger_than_the_hand_built_one() {
        let process = std::mem::size_of::<ProcessVitals>();
        let sample = std::mem::size_of::<VitalsSample>();
        assert!(process <= 112, "{process}");
        assert!(
            sample + 5 * process <= 120 + 5 * 112,
            "{sample} + 5 x {process}"
        );
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
